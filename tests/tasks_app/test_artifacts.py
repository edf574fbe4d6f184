"""Uploaded artifacts: stored with a checksum, owner-scoped, verified before they run."""

from __future__ import annotations

import hashlib
import os

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from tasks_app.artifacts import ArtifactCorrupted, artifact_local_path
from tasks_app.models import Artifact, Task

pytestmark = pytest.mark.django_db

SCRIPT = b"#!/bin/sh\necho hello from the artifact\n"


@pytest.fixture(autouse=True)
def _media(tmp_path, settings):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.TMS_ARTIFACT_CACHE_DIR = str(tmp_path / "cache")


def _upload(client: APIClient, content: bytes = SCRIPT, name: str = "hello.sh"):
    return client.post("/api/v1/artifacts", {"file": SimpleUploadedFile(name, content)}, format="multipart")


def test_upload_records_checksum_and_size(api_client):
    response = _upload(api_client)
    assert response.status_code == 201, response.data
    assert response.data["sha256"] == hashlib.sha256(SCRIPT).hexdigest()
    assert response.data["size"] == len(SCRIPT)
    assert response.data["name"] == "hello.sh"


def test_empty_upload_is_refused(api_client):
    response = _upload(api_client, b"")
    assert response.status_code == 400
    assert "file" in response.data["errors"]
    assert not Artifact.objects.exists()


def test_local_copy_is_verified_and_executable(api_client):
    artifact = Artifact.objects.get(pk=_upload(api_client).data["id"])
    path = artifact_local_path(artifact)
    with open(path, "rb") as handle:
        assert handle.read() == SCRIPT
    assert os.access(path, os.X_OK)


def test_tampered_artifact_is_refused(api_client):
    artifact = Artifact.objects.get(pk=_upload(api_client).data["id"])
    with open(artifact.file.path, "wb") as handle:
        handle.write(b"#!/bin/sh\nrm -rf /\n")
    with pytest.raises(ArtifactCorrupted):
        artifact_local_path(artifact)


def test_task_can_use_own_artifact_but_not_another_users(api_client, other_user):
    own = _upload(api_client).data["id"]
    created = api_client.post(
        "/api/v1/tasks", {"runner": "subprocess", "config": {"artifact": True}, "artifact": own}, format="json"
    )
    assert created.status_code == 201, created.data
    assert str(created.data["artifact"]) == own
    stranger = APIClient()
    stranger.force_authenticate(other_user)
    assert stranger.get(f"/api/v1/artifacts/{own}").status_code == 404
    refused = stranger.post(
        "/api/v1/tasks", {"runner": "subprocess", "config": {"artifact": True}, "artifact": own}, format="json"
    )
    assert refused.status_code == 400
    assert "artifact" in refused.data["errors"]


def test_patch_with_another_owners_artifact_answers_as_for_a_missing_one(api_client, other_user):
    task = api_client.post("/api/v1/tasks", {"runner": "noop"}, format="json").data["id"]
    stranger = APIClient()
    stranger.force_authenticate(other_user)
    theirs = _upload(stranger).data["id"]
    missing = "00000000-0000-4000-8000-000000000000" if "-" in str(theirs) else 987654321

    foreign = api_client.patch(f"/api/v1/tasks/{task}", {"artifact": theirs}, format="json")
    absent = api_client.patch(f"/api/v1/tasks/{task}", {"artifact": missing}, format="json")

    assert (foreign.status_code, absent.status_code) == (400, 400)
    assert foreign.data["errors"]["artifact"] == [
        m.replace(str(missing), str(theirs)) for m in absent.data["errors"]["artifact"]
    ]
    assert "does not exist" in str(foreign.data["errors"]["artifact"])
    assert api_client.get(f"/api/v1/tasks/{task}").data["artifact"] is None


def test_artifact_in_use_cannot_be_deleted(api_client):
    own = _upload(api_client).data["id"]
    api_client.post("/api/v1/tasks", {"runner": "subprocess", "config": {"artifact": True}, "artifact": own},
                    format="json")  # fmt: skip
    response = api_client.delete(f"/api/v1/artifacts/{own}")
    assert response.status_code == 409  # a conflict with the current state, as documented
    assert response.json()["type"] == "conflict" and "still use this artifact" in response.json()["detail"]
    assert Artifact.objects.filter(pk=own).exists()


def test_artifact_whose_tasks_were_all_deleted_can_be_deleted(api_client, django_capture_on_commit_callbacks):
    own = _upload(api_client).data["id"]
    tasks = [
        api_client.post(
            "/api/v1/tasks", {"runner": "subprocess", "config": {"artifact": True}, "artifact": own}, format="json"
        ).data["id"]
        for _ in range(2)
    ]
    stored = Artifact.objects.get(pk=own).file.path
    api_client.delete(f"/api/v1/tasks/{tasks[0]}")
    still = api_client.delete(f"/api/v1/artifacts/{own}")
    assert still.status_code == 409 and "1 task(s) still use" in still.json()["detail"]

    api_client.delete(f"/api/v1/tasks/{tasks[1]}")
    with django_capture_on_commit_callbacks(execute=True):  # the file goes after the commit
        response = api_client.delete(f"/api/v1/artifacts/{own}")

    assert response.status_code == 204, response.content
    assert not Artifact.objects.filter(pk=own).exists()
    assert not os.path.exists(stored)
    # The deleted tasks keep their history, without the artifact.
    assert api_client.get(f"/api/v1/tasks/{tasks[0]}").status_code in (200, 404)
    assert Task.objects.filter(pk__in=tasks, artifact__isnull=True).count() == 2


def test_read_only_staff_cannot_put_another_owners_artifact_in_their_task(api_client, staff_client, staff_user):
    """Naming someone's artifact runs their binary and pins it (PROTECT): a write support staff may not make."""
    theirs = _upload(api_client).data["id"]
    assert staff_client.get(f"/api/v1/artifacts/{theirs}").status_code == 200  # staff read everyone's
    body = {"runner": "subprocess", "config": {"artifact": True}, "artifact": theirs}
    refused = staff_client.post("/api/v1/tasks", body, format="json")
    assert refused.status_code == 400 and "does not exist" in str(refused.data["errors"]["artifact"])
    assert staff_client.delete(f"/api/v1/artifacts/{theirs}").status_code == 403
    assert api_client.get(f"/api/v1/artifacts/{theirs}").status_code == 200
