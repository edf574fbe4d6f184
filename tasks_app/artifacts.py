"""Uploaded artifacts: store with a checksum, and hand workers a verified local copy."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction

from tasks_app.models import Artifact
from tasks_app.quotas import quota_check_artifact
from tms_core.errors import InvalidInput


class ArtifactCorrupted(RuntimeError):
    """The stored content no longer matches its recorded checksum."""


def _digest(chunks: Iterable[bytes]) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def artifact_create(*, owner: User, upload: UploadedFile, name: str = "") -> Artifact:
    """Store an uploaded binary or script and record its SHA-256 and size. Raises
    :class:`InvalidInput` on ``file`` when it is empty, larger than ``TMS_ARTIFACT_MAX_BYTES``
    or beyond the owner's artifact quota (``TMS_QUOTA_ARTIFACT_BYTES``)."""
    limit = settings.TMS_ARTIFACT_MAX_BYTES
    if upload.size is not None and upload.size > limit:
        raise InvalidInput.on("file", f"Artifacts may be at most {limit} bytes.")
    sha256, size = _digest(upload.chunks())
    if size == 0:
        raise InvalidInput.on("file", "The file is empty.")
    upload.seek(0)
    artifact = Artifact(owner=owner, name=name or os.path.basename(upload.name or "artifact"), sha256=sha256, size=size)
    with transaction.atomic():
        # Under the owner's quota lock: two concurrent uploads cannot both take the last bytes.
        quota_check_artifact(owner=owner, size=size)
        artifact.file.save(os.path.basename(upload.name or "artifact"), upload, save=False)
        artifact.save()
    return artifact


def artifact_local_path(artifact: Artifact) -> str:
    """A local, checksum-verified copy of the artifact, cached by checksum on this host."""
    cache = Path(settings.TMS_ARTIFACT_CACHE_DIR)
    target = cache / artifact.sha256
    if target.exists():
        return str(target)
    cache.mkdir(parents=True, exist_ok=True)
    with artifact.file.open("rb") as source, tempfile.NamedTemporaryFile(dir=cache, delete=False) as copy:
        shutil.copyfileobj(source, copy)
    sha256, _ = _digest([Path(copy.name).read_bytes()])
    if sha256 != artifact.sha256:
        os.unlink(copy.name)
        raise ArtifactCorrupted(f"artifact {artifact.pk} does not match its checksum {artifact.sha256}")
    os.chmod(copy.name, 0o500)
    os.replace(copy.name, target)
    return str(target)
