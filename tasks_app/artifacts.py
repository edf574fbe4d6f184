"""Uploaded artifacts: store with a checksum, and hand workers a verified local copy."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.db.models import ProtectedError

from tasks_app.models import Artifact, Task, TaskStatus
from tms_core.errors import ConflictError, InvalidInput

logger = logging.getLogger(__name__)


class ArtifactCorrupted(RuntimeError):
    """The stored content no longer matches its recorded checksum."""


def _digest(chunks: Iterable[bytes]) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def artifact_create(*, owner: User, upload: UploadedFile, name: str = "") -> Artifact:
    """Store an uploaded binary or script and record its SHA-256 and size."""
    limit = settings.TMS_ARTIFACT_MAX_BYTES
    if upload.size is not None and upload.size > limit:
        raise InvalidInput.on("file", f"Artifacts may be at most {limit} bytes.")
    sha256, size = _digest(upload.chunks())
    if size == 0:
        raise InvalidInput.on("file", "The file is empty.")
    upload.seek(0)
    artifact = Artifact(owner=owner, name=name or os.path.basename(upload.name or "artifact"), sha256=sha256, size=size)
    artifact.file.save(os.path.basename(upload.name or "artifact"), upload, save=False)
    artifact.save()
    return artifact


def _file_digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def artifact_delete(*, artifact: Artifact) -> None:
    """Delete an artifact that no live task uses, and its stored file.

    Deleted tasks keep their history but not their artifact: their link is cleared here, so an
    artifact whose tasks were all deleted can go (a task that is not deleted still protects it:
    409). The file is removed after the commit.
    """
    with transaction.atomic():
        locked = Artifact.objects.select_for_update().filter(pk=artifact.pk).first()
        if locked is None:
            return
        live = Task.objects.filter(artifact=locked).exclude(status=TaskStatus.DELETED).count()
        if live:
            raise ConflictError(f"{live} task(s) still use this artifact; delete them first.")
        Task.objects.filter(artifact=locked, status=TaskStatus.DELETED).update(artifact=None)
        file = locked.file
        try:
            locked.delete()
        except ProtectedError:  # a task created meanwhile
            raise ConflictError("Tasks still use this artifact; delete them first.") from None
    transaction.on_commit(lambda: file.delete(save=False))


def artifact_local_path(artifact: Artifact) -> str:
    """A local, checksum-verified copy of the artifact, cached by checksum on this host.

    The cache folder is the worker's own (0700): runs never reach it (they get a copy in their
    run folder, checked again there). A cached file is still re-hashed on every hit, and one
    that no longer matches is dropped and fetched again from storage, so a file replaced in the
    cache is never handed to a run.
    """
    cache = Path(settings.TMS_ARTIFACT_CACHE_DIR)
    target = cache / artifact.sha256
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    if cache.stat().st_mode & 0o077:
        cache.chmod(0o700)
    if target.exists():
        if _file_digest(target) == artifact.sha256:
            return str(target)
        logger.warning("artifact cache: %s does not match its checksum; fetching it again", target)
        target.unlink(missing_ok=True)
    with artifact.file.open("rb") as source, tempfile.NamedTemporaryFile(dir=cache, delete=False) as copy:
        shutil.copyfileobj(source, copy)
    if _file_digest(Path(copy.name)) != artifact.sha256:
        os.unlink(copy.name)
        raise ArtifactCorrupted(f"artifact {artifact.pk} does not match its checksum {artifact.sha256}")
    os.chmod(copy.name, 0o500)
    os.replace(copy.name, target)
    return str(target)
