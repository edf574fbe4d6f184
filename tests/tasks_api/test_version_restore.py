"""``POST /api/v1/tasks/{id}/versions/{number}/restore`` (issue 46): a task gets an earlier
version's settings again through the update service (audited, a new version, its future
replaced), its secrets kept at their current values; a version whose secret is gone is a 400 on
``config``; an editor's act (403 below), 404 for another team's task or a missing version."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from tasks_api.creation import task_create
from tasks_app.models import AuditEntry, Task, TaskVersion
from tasks_app.secrets import config_open
from tasks_app.teams.services import member_set, team_create

pytestmark = pytest.mark.django_db

SECRET = "Bearer sk-live-restore-0123456789"
LATER = timezone.now() + timedelta(days=1)
CONFIG = {"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": SECRET}, "json": {"n": 1}}


def _task(user, **extra) -> Task:
    return task_create(owner=user, runner="http", config=CONFIG, start_at=LATER, name="restored", **extra)


def _masked(n: int) -> dict:
    return {"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": "********"}, "json": {"n": n}}


def test_a_restore_gives_the_earlier_settings_back_as_a_new_audited_version(api_client, user):
    task = _task(user)
    url = f"/api/v1/tasks/{task.pk}"
    assert api_client.patch(url, {"config": _masked(2), "max_attempts": 7}, format="json").status_code == 200
    assert api_client.patch(url, {"name": "renamed"}, format="json").status_code == 200

    response = api_client.post(f"{url}/versions/1/restore")

    assert response.status_code == 200, response.content
    assert response.json() == {"restored": 1, "changed": ["config", "max_attempts", "name"], "version": 4}
    task.refresh_from_db()
    assert task.name == "restored" and task.max_attempts != 7 and task.version == 4
    assert config_open(task.config) == CONFIG  # the secret kept, unseen
    version = TaskVersion.objects.get(task=task, number=4)
    assert version.snapshot["config"]["json"] == {"n": 1} and SECRET not in str(version.snapshot)
    entry = AuditEntry.objects.filter(task_id=task.pk, action="update").latest("id")
    assert entry.detail == "restored version 1" and set(entry.changes) >= {"config", "max_attempts", "name"}
    # The current version again: nothing to change, no new version.
    again = api_client.post(f"{url}/versions/4/restore")
    assert again.json() == {"restored": 4, "changed": [], "version": 4}
    assert TaskVersion.objects.filter(task=task).count() == 4


def test_a_version_whose_secret_is_gone_is_refused_on_config(api_client, user):
    task = _task(user)
    url = f"/api/v1/tasks/{task.pk}"
    plain = {"url": "http://127.0.0.1:9/hook", "json": {"n": 1}}
    assert api_client.patch(url, {"config": plain}, format="json").status_code == 200

    response = api_client.post(f"{url}/versions/1/restore")

    assert response.status_code == 400
    assert "restore cannot bring it back" in response.json()["errors"]["config"][0]
    task.refresh_from_db()
    assert config_open(task.config) == plain and task.version == 2


def test_a_missing_version_or_another_teams_task_is_a_404(api_client, other_client, user):
    task = _task(user)
    assert api_client.post(f"/api/v1/tasks/{task.pk}/versions/9/restore").status_code == 404
    assert other_client.post(f"/api/v1/tasks/{task.pk}/versions/1/restore").status_code == 404


def test_only_an_editor_restores(db):
    users = get_user_model().objects
    admin = users.create_user("rs-admin")
    team = team_create(creator=admin, name="Restorers")
    task = _task(admin, team=team)
    client = APIClient()
    client.force_authenticate(admin)
    assert client.patch(f"/api/v1/tasks/{task.pk}", {"max_attempts": 9}, format="json").status_code == 200
    for role in ("viewer", "operator"):
        users.create_user(f"rs-{role}")
        member_set(team=team, username=f"rs-{role}", role=role)
        client.force_authenticate(users.get(username=f"rs-{role}"))
        assert client.post(f"/api/v1/tasks/{task.pk}/versions/1/restore").status_code == 403
    assert Task.objects.get(pk=task.pk).max_attempts == 9
    users.create_user("rs-editor")
    member_set(team=team, username="rs-editor", role="editor")
    client.force_authenticate(users.get(username="rs-editor"))
    assert client.post(f"/api/v1/tasks/{task.pk}/versions/1/restore").status_code == 200
    assert Task.objects.get(pk=task.pk).max_attempts != 9
