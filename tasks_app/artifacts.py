"""Uploaded artifacts: store with a checksum, and hand workers a verified local copy."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core import signing
from django.core.files import File
from django.core.files.storage import default_storage
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone

from tasks_app.models import Artifact, ArtifactStatus, Task, TaskStatus, Team, artifact_upload_to
from tasks_app.quotas import quota_check_artifact
from tasks_app.teams.services import team_for_new
from tms_core.conf import tms_settings
from tms_core.errors import ConflictError, GoneError, InvalidInput
from tms_core.public_url import public_url

logger = logging.getLogger(__name__)


class ArtifactCorrupted(RuntimeError):
    """The stored content no longer matches its recorded checksum."""


def _digest(chunks: Iterable[bytes]) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _team(owner: User, team: Team | None) -> Team:
    return team_for_new(owner, team, permission="tasks_app.add_artifact", what="this team's artifacts")


def artifact_create(*, owner: User, upload: UploadedFile, name: str = "", team: Team | None = None) -> Artifact:
    """Store an uploaded binary or script and record its SHA-256 and size, in ``team`` (default:
    ``owner``'s personal team; ``owner`` needs the editor role in it, else PermissionDenied): the
    team's tasks may run it. Raises :class:`InvalidInput` on ``file`` when it is empty, larger
    than ``TMS_ARTIFACT_MAX_BYTES`` or beyond the team's artifact quota (``TMS_QUOTA_ARTIFACT_BYTES``)."""
    team = _team(owner, team)
    limit = settings.TMS_ARTIFACT_MAX_BYTES
    if upload.size is not None and upload.size > limit:
        raise InvalidInput.on("file", f"Artifacts may be at most {limit} bytes.")
    sha256, size = _digest(upload.chunks())
    if size == 0:
        raise InvalidInput.on("file", "The file is empty.")
    upload.seek(0)
    artifact = Artifact(
        owner=owner, team=team, name=name or os.path.basename(upload.name or "artifact"), sha256=sha256, size=size
    )
    with transaction.atomic():
        # Under the team's quota lock: two concurrent uploads cannot both take the last bytes.
        quota_check_artifact(team_id=team.pk, size=size)
        artifact.file.save(os.path.basename(upload.name or "artifact"), upload, save=False)
        artifact.save()
    return artifact


def _file_digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# --------------------------------------------------------------------------------------------
# Signed uploads: the client declares name, size and SHA-256, then sends the bytes straight to
# storage (S3 presigned POST) or to a signed, single-use TMS URL; nothing runs until verified.
# --------------------------------------------------------------------------------------------

UPLOAD_SALT = "tms.artifact-upload"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class UploadTicket:
    """Where and how the client sends the bytes: ``PUT url`` (TMS) or ``POST url`` with ``fields``
    as multipart form fields before the file (S3 presigned POST)."""

    artifact: Artifact
    method: str
    url: str
    fields: dict[str, str]
    expires_at: datetime


def _s3_client_and_bucket() -> tuple[Any, str] | None:
    """The boto3 client and bucket of the default storage when it is django-storages' S3, else None."""
    storage = default_storage
    bucket = getattr(storage, "bucket_name", None)
    connection = getattr(storage, "connection", None)
    if not bucket or connection is None:
        return None
    return connection.meta.client, bucket


def artifact_upload_begin(
    *, owner: User, name: str, size: Any, sha256: Any, team: Team | None = None, site: str = ""
) -> UploadTicket:
    """Record an UPLOADING artifact with its declared size and SHA-256, and sign where to send it.
    It goes in ``team`` (default: ``owner``'s personal team; editor role needed), as
    :func:`artifact_create`. ``site``: the root URL of TMS the caller was reached at
    (:func:`tms_core.public_url.public_url` of its request); empty, that of no request.

    The URL lives ``TMS_ARTIFACT_UPLOAD_TTL`` seconds. With S3 storage it is a presigned POST
    limited to exactly ``size`` bytes at the artifact's key (verified by
    :func:`artifact_upload_complete`); otherwise a single-use TMS URL the bytes are PUT to (verified
    as they arrive, :func:`artifact_upload_receive`).
    """
    team = _team(owner, team)
    errors: dict[str, list[str]] = {}
    limit = settings.TMS_ARTIFACT_MAX_BYTES
    name = str(name or "").strip()
    if not name or len(name) > 200 or "/" in name or "\0" in name:
        errors["name"] = ["A file name of 1 to 200 characters, without '/'."]
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= limit:
        errors["size"] = [f"The size in bytes, from 1 to {limit}."]
    digest = sha256.lower() if isinstance(sha256, str) else ""
    if not _SHA256.match(digest):
        errors["sha256"] = ["The SHA-256 of the content, as 64 hexadecimal digits."]
    if errors:
        raise InvalidInput(errors)
    ttl = tms_settings().ARTIFACT_UPLOAD_TTL
    expires_at = timezone.now() + timedelta(seconds=ttl)
    artifact = Artifact(
        owner=owner,
        team=team,
        name=name,
        sha256=digest,
        size=size,
        status=ArtifactStatus.UPLOADING,
        upload_expires_at=expires_at,
    )
    s3 = _s3_client_and_bucket()
    with transaction.atomic():
        # The multipart path's quota check, under the same lock: the declared size is held from now.
        quota_check_artifact(team_id=team.pk, size=size, field="size")
        if s3 is not None:
            artifact.file.name = artifact_upload_to(artifact, name)
        artifact.save()
    if s3 is not None:
        client, bucket = s3
        key = artifact.file.name
        post = client.generate_presigned_post(
            Bucket=bucket,
            Key=key,
            Conditions=[["content-length-range", size, size]],
            ExpiresIn=int(ttl),
        )
        return UploadTicket(artifact, "POST", post["url"], dict(post["fields"]), expires_at)
    token = signing.dumps({"artifact": str(artifact.pk)}, salt=UPLOAD_SALT)
    url = f"{site or public_url()}/api/v1/artifacts/uploads/{token}"
    return UploadTicket(artifact, "PUT", url, {}, expires_at)


def _reject(artifact: Artifact, reason: str) -> Artifact:
    Artifact.objects.filter(pk=artifact.pk, status=ArtifactStatus.UPLOADING).update(
        status=ArtifactStatus.REJECTED, rejection_reason=reason[:500]
    )
    if artifact.file.name:
        artifact.file.delete(save=False)
    artifact.refresh_from_db()
    return artifact


def artifact_upload_receive(*, token: str, chunks: Iterable[bytes]) -> Artifact:
    """Take the bytes PUT to a signed upload URL: verify size and SHA-256, then READY or REJECTED.

    The token is checked first (signature and life: a bad one is :class:`GoneError`, as for an
    unknown URL); the first request claims the upload with a conditional update, so the URL is
    single-use (a second request is :class:`ConflictError`).
    """
    ttl = tms_settings().ARTIFACT_UPLOAD_TTL
    try:
        claim = signing.loads(token, salt=UPLOAD_SALT, max_age=timedelta(seconds=ttl))
    except signing.BadSignature:  # SignatureExpired is one too
        raise GoneError("This upload URL is not valid (expired or unknown).") from None
    artifact = Artifact.objects.filter(pk=claim.get("artifact")).first()
    if artifact is None:
        raise GoneError("This upload URL is not valid (expired or unknown).")
    won = Artifact.objects.filter(
        pk=artifact.pk, status=ArtifactStatus.UPLOADING, upload_started_at__isnull=True,
        upload_expires_at__gt=timezone.now(),
    ).update(upload_started_at=timezone.now())  # fmt: skip
    if not won:
        raise ConflictError(f"This upload URL was used already (artifact {artifact.pk} is {artifact.status}).")
    digest, size = hashlib.sha256(), 0
    with tempfile.TemporaryFile() as spool:
        for chunk in chunks:
            size += len(chunk)
            if size > artifact.size:
                return _reject(artifact, f"more than the declared {artifact.size} bytes were sent")
            digest.update(chunk)
            spool.write(chunk)
        if size != artifact.size:
            return _reject(artifact, f"{size} bytes were sent, {artifact.size} declared")
        if digest.hexdigest() != artifact.sha256:
            return _reject(artifact, f"the content's SHA-256 is {digest.hexdigest()}, {artifact.sha256} declared")
        spool.seek(0)
        artifact.file.save(artifact.name, File(spool), save=False)
    Artifact.objects.filter(pk=artifact.pk, status=ArtifactStatus.UPLOADING).update(
        status=ArtifactStatus.READY, file=artifact.file.name
    )
    artifact.refresh_from_db()
    return artifact


def artifact_upload_complete(*, artifact: Artifact) -> Artifact:
    """After a presigned POST to S3: read the object back, check size and SHA-256, READY or REJECTED."""
    if artifact.status != ArtifactStatus.UPLOADING:
        raise ConflictError(f"Artifact {artifact.pk} is {artifact.status}, not UPLOADING.")
    if not artifact.file.name or not artifact.file.storage.exists(artifact.file.name):
        raise ConflictError("Nothing was uploaded yet: POST the file to the upload URL first.")
    try:
        with artifact.file.open("rb") as stored:
            sha256, size = _digest(iter(lambda: stored.read(1 << 20), b""))
    except OSError as exc:
        raise ConflictError(f"The upload cannot be read back: {exc}") from exc
    if size != artifact.size:
        return _reject(artifact, f"{size} bytes were stored, {artifact.size} declared")
    if sha256 != artifact.sha256:
        return _reject(artifact, f"the content's SHA-256 is {sha256}, {artifact.sha256} declared")
    Artifact.objects.filter(pk=artifact.pk, status=ArtifactStatus.UPLOADING).update(status=ArtifactStatus.READY)
    artifact.refresh_from_db()
    return artifact


def artifact_uploads_expire(*, now: datetime | None = None) -> int:
    """REJECT uploads not finished in time and remove whatever bytes they left (periodic job)."""
    now = now or timezone.now()
    expired = 0
    for artifact in Artifact.objects.filter(status=ArtifactStatus.UPLOADING, upload_expires_at__lte=now):
        # A PUT still streaming when the URL expired has its full TTL again to finish.
        started = artifact.upload_started_at
        if started is not None and started > now - timedelta(seconds=tms_settings().ARTIFACT_UPLOAD_TTL):
            continue
        _reject(artifact, "the upload was not finished before its URL expired")
        expired += 1
    return expired


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
    if artifact.status != ArtifactStatus.READY:
        raise ArtifactCorrupted(f"artifact {artifact.pk} is {artifact.status}, not READY")
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
