"""Signed upload URLs: declare name, size and SHA-256; send the bytes to a short-lived signed URL;
the artifact is READY only once they match, and tasks only run READY artifacts."""

from __future__ import annotations

import hashlib
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core import signing
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from executions.periodic import periodic_jobs
from tasks_app.artifacts import artifact_local_path, artifact_uploads_expire
from tasks_app.models import Artifact, ArtifactStatus

pytestmark = pytest.mark.django_db

CONTENT = b"#!/bin/sh\necho hello from a signed upload\n"
SHA = hashlib.sha256(CONTENT).hexdigest()


@pytest.fixture(autouse=True)
def _media(tmp_path, settings):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.TMS_ARTIFACT_CACHE_DIR = str(tmp_path / "cache")


def begin(client: APIClient, **given: Any):
    body = {"name": "job.sh", "size": len(CONTENT), "sha256": SHA, **given}
    return client.post("/api/v1/artifacts/uploads", body, format="json")


def put(url: str, content: bytes):
    """PUT with no credentials at all: the signed URL is the authority."""
    return APIClient().put(urlsplit(url).path, content, content_type="application/octet-stream")


def test_signed_upload_becomes_ready_and_a_task_can_use_it(api_client):
    started = begin(api_client)
    assert started.status_code == 201, started.data
    assert started.data["artifact"]["status"] == "UPLOADING"
    assert started.data["upload"]["method"] == "PUT"
    artifact_id = started.data["artifact"]["id"]

    # Not usable until it arrived and was verified.
    early = api_client.post(
        "/api/v1/tasks", {"runner": "subprocess", "config": {"artifact": True}, "artifact": artifact_id}, format="json"
    )
    assert early.status_code == 400 and "artifact" in early.data["errors"]

    done = put(started.data["upload"]["url"], CONTENT)
    assert done.status_code == 200, done.content
    assert done.data["status"] == "READY"
    artifact = Artifact.objects.get(pk=artifact_id)
    assert artifact.file.read() == CONTENT
    assert Path(artifact_local_path(artifact)).read_bytes() == CONTENT

    task = api_client.post(
        "/api/v1/tasks", {"runner": "subprocess", "config": {"artifact": True}, "artifact": artifact_id}, format="json"
    )
    assert task.status_code == 201, task.data


def test_the_url_is_single_use(api_client):
    url = begin(api_client).data["upload"]["url"]
    assert put(url, CONTENT).status_code == 200
    again = put(url, b"#!/bin/sh\necho replaced\n")
    assert again.status_code == 409
    assert Artifact.objects.get().file.read() == CONTENT


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (CONTENT.replace(b"hello", b"HELLO"), "SHA-256"),
        (CONTENT[:-1], "bytes were sent"),
        (CONTENT + b"more", "more than the declared"),
    ],
)
def test_content_that_differs_from_the_declaration_is_rejected(api_client, content, reason):
    started = begin(api_client)
    answer = put(started.data["upload"]["url"], content)
    assert answer.status_code == 400
    assert answer.json()["type"] == "upload_rejected"
    assert reason in answer.json()["detail"] and reason in answer.json()["errors"]["file"][0]
    artifact = Artifact.objects.get(pk=started.data["artifact"]["id"])
    assert artifact.status == ArtifactStatus.REJECTED and reason in artifact.rejection_reason
    assert not artifact.file.name or not artifact.file.storage.exists(artifact.file.name)
    refused = api_client.post(
        "/api/v1/tasks", {"runner": "subprocess", "config": {"artifact": True}, "artifact": str(artifact.pk)},
        format="json",
    )  # fmt: skip
    assert refused.status_code == 400 and "REJECTED" in str(refused.data["errors"]["artifact"])


def test_a_forged_or_expired_url_is_refused(api_client, monkeypatch):
    started = begin(api_client)
    artifact_id = started.data["artifact"]["id"]
    assert put(started.data["upload"]["url"] + "x", CONTENT).status_code == 404
    forged = signing.dumps({"artifact": artifact_id}, salt="another-salt")
    assert put(f"/api/v1/artifacts/uploads/{forged}", CONTENT).status_code == 404
    # A URL signed longer ago than TMS_ARTIFACT_UPLOAD_TTL (900 s by default).
    real_time = time.time
    monkeypatch.setattr("django.core.signing.time.time", lambda: real_time() - 3600)
    old = signing.dumps({"artifact": artifact_id}, salt="tms.artifact-upload")
    monkeypatch.undo()
    assert put(f"/api/v1/artifacts/uploads/{old}", CONTENT).status_code == 404
    assert Artifact.objects.get(pk=artifact_id).status == ArtifactStatus.UPLOADING


def test_unfinished_uploads_expire_in_the_periodic_job(api_client):
    stale = begin(api_client).data
    fresh = begin(api_client).data
    Artifact.objects.filter(pk=stale["artifact"]["id"]).update(upload_expires_at=timezone.now() - timedelta(seconds=1))

    assert artifact_uploads_expire() == 1

    expired = Artifact.objects.get(pk=stale["artifact"]["id"])
    assert expired.status == ArtifactStatus.REJECTED and "expired" in expired.rejection_reason
    assert Artifact.objects.get(pk=fresh["artifact"]["id"]).status == ArtifactStatus.UPLOADING
    assert put(stale["upload"]["url"], CONTENT).status_code == 409
    assert ("tms.expire_artifact_uploads", 300.0) in periodic_jobs().values()


def test_declarations_are_checked_per_field(api_client, settings):
    answer = begin(api_client, sha256="abc", size=settings.TMS_ARTIFACT_MAX_BYTES + 1, name="")
    assert answer.status_code == 400
    assert {"sha256", "size", "name"} <= set(answer.data["errors"])
    assert not Artifact.objects.exists()
    assert APIClient().post("/api/v1/artifacts/uploads", {}, format="json").status_code in (401, 403)


def test_multipart_upload_still_yields_ready(api_client):
    answer = api_client.post("/api/v1/artifacts", {"file": SimpleUploadedFile("job.sh", CONTENT)}, format="multipart")
    assert answer.status_code == 201
    assert answer.data["status"] == "READY"


def test_with_s3_storage_the_url_is_a_presigned_post(api_client):
    s3 = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": "tms-artifacts",
            "access_key": "AKIAEXAMPLE",
            "secret_key": "example-secret",
            "region_name": "eu-west-1",
        },
    }
    with override_settings(
        STORAGES={"default": s3, "staticfiles": {"BACKEND": "django.core.files.storage.FileSystemStorage"}}
    ):
        started = begin(api_client)
    assert started.status_code == 201, started.data
    upload = started.data["upload"]
    assert upload["method"] == "POST"
    assert "tms-artifacts" in upload["url"]
    assert {"key", "policy"} <= set(upload["fields"])
    assert upload["fields"]["key"].endswith("/job.sh")
    assert Artifact.objects.get(pk=started.data["artifact"]["id"]).status == ArtifactStatus.UPLOADING


def test_signed_uploads_count_against_the_artifact_quota_as_multipart_ones_do(api_client, user):
    """Issue 27, finding 6: one quota check for both ways in."""
    from tasks_app.quotas import owner_quota_set

    owner_quota_set(owner=user, max_artifact_bytes=10_000)
    kept = SimpleUploadedFile("big.bin", b"x" * 6_000)
    assert api_client.post("/api/v1/artifacts", {"file": kept}, format="multipart").status_code == 201
    refused = begin(api_client, size=6_000)
    assert refused.status_code == 400 and "quota" in str(refused.data["errors"]["size"])
    assert Artifact.objects.count() == 1
    started = begin(api_client)  # fits: its declared size is held while it uploads ...
    assert started.status_code == 201, started.data
    held = 10_000 - 6_000 - len(CONTENT)
    over = SimpleUploadedFile("more.bin", b"y" * (held + 1))
    response = api_client.post("/api/v1/artifacts", {"file": over}, format="multipart")
    assert response.status_code == 400 and "quota" in str(response.data["errors"]["file"])
    assert put(started.data["upload"]["url"], CONTENT).data["status"] == "READY"
    # ... and a REJECTED one holds nothing.
    rejected = begin(api_client, size=held)
    put(rejected.data["upload"]["url"], b"z" * held)
    assert Artifact.objects.get(pk=rejected.data["artifact"]["id"]).status == ArtifactStatus.REJECTED
    assert begin(api_client, size=held).status_code == 201
