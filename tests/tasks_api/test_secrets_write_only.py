"""A stored secret never comes back, to anyone (superusers and staff with change permission
included), and never follows a run pointed elsewhere (issue 27, findings 2 and 3)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from notifications import services as channel_services
from notifications.models import Channel
from tasks_api.creation import task_create
from tasks_api.task_config import task_config
from tasks_app.masking import MASK
from tasks_app.models import AuditEntry, Task
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

SECRET = "Bearer sk-live-secret-0123456789"
NOTE = "pin-4711-only-the-owner-knows"
LATER = timezone.now() + timedelta(days=1)


def _raw(task: Task) -> str:
    return json.dumps(Task.objects.filter(pk=task.pk).values_list("config", flat=True).get())


def _audit_text() -> str:
    return json.dumps(list(AuditEntry.objects.values("changes", "detail")))


@pytest.fixture
def editor(django_user_model):
    """Staff given tasks_app.change_task: they may edit anyone's task."""
    staff = django_user_model.objects.create_user(username="editor", password="x-editor-pass-1", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="change_task", content_type__app_label="tasks_app"))
    return staff


def _http_task(owner):
    config = {"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": SECRET}, "json": {"note": NOTE, "n": 1}}
    return task_create(owner=owner, runner="http", config=config, secret_fields=["json.note"], start_at=LATER)


@pytest.mark.parametrize("who", ["owner", "superuser", "editor"])
def test_taking_a_path_out_of_secret_fields_never_shows_its_stored_value(user, admin_user, editor, who):
    task = _http_task(user)
    client = client_for({"owner": user, "superuser": admin_user, "editor": editor}[who])
    raw = _raw(task)
    response = client.patch(f"/api/v1/tasks/{task.pk}", {"secret_fields": []}, format="json")
    assert response.status_code == 400, response.data
    assert "json.note" in str(response.data["errors"]["secret_fields"])
    assert NOTE not in json.dumps(response.data) and _raw(task) == raw
    assert NOTE not in _audit_text() and not AuditEntry.objects.filter(action="update").exists()
    shown = client.get(f"/api/v1/tasks/{task.pk}").data["config"]
    assert shown["json"]["note"] == MASK
    # Sent again in the same request, it is the sender's own value, no longer secret.
    config = {**shown, "json": {"note": "public now", "n": 1}}
    response = client.patch(f"/api/v1/tasks/{task.pk}", {"secret_fields": [], "config": config}, format="json")
    assert response.status_code == 200, response.data
    assert response.data["config"]["json"]["note"] == "public now"
    assert response.data["config"]["headers"]["Authorization"] == MASK  # the URL did not change: kept
    assert task_config(Task.objects.get(pk=task.pk))["headers"]["Authorization"] == SECRET
    assert NOTE not in _audit_text() and SECRET not in _audit_text()


def test_an_editor_who_points_the_url_elsewhere_gets_none_of_the_owners_secrets(user, editor):
    task = _http_task(user)
    client = client_for(editor)
    shown = client.get(f"/api/v1/tasks/{task.pk}").data["config"]
    moved = {**shown, "url": "http://127.0.0.1:8/collect"}  # Authorization and json.note left masked
    response = client.patch(f"/api/v1/tasks/{task.pk}", {"config": moved}, format="json")
    assert response.status_code == 200, response.data
    stored = task_config(Task.objects.get(pk=task.pk))
    assert stored["url"] == "http://127.0.0.1:8/collect"
    assert "Authorization" not in stored["headers"] and "note" not in stored["json"] and stored["json"]["n"] == 1
    assert SECRET not in _raw(task) and NOTE not in _raw(task)
    entry = AuditEntry.objects.get(action="update")
    assert "headers.Authorization" in entry.detail and "json.note" in entry.detail
    assert SECRET not in _audit_text() and NOTE not in _audit_text()
    # A secret sent again with the move goes with it.
    again = {**moved, "headers": {"Authorization": "Bearer editors-own"}, "json": {"n": 2}}
    assert client.patch(f"/api/v1/tasks/{task.pk}", {"config": again}, format="json").status_code == 200
    assert task_config(Task.objects.get(pk=task.pk))["headers"] == {"Authorization": "Bearer editors-own"}


@pytest.mark.parametrize(
    ("runner", "config", "secret_fields", "move", "gone"),
    [
        (
            "subprocess",
            {"command": ["/bin/sh", "-c", "true"], "env": {"TOKEN": "t-0123456789"}},
            [],
            {"command": ["echo", "hi"]},
            ("env", "TOKEN"),
        ),
        (
            "function",
            {"url": "http://127.0.0.1:9/fn", "headers": {"X-Api-Key": "t-0123456789"}},
            [],
            {"url": "http://127.0.0.1:8/fn"},
            ("headers", "X-Api-Key"),
        ),
    ],
)
def test_a_move_of_any_runner_drops_the_secrets_it_kept(user, settings, runner, config, secret_fields, move, gone):
    runners = dict(settings.TMS_RUNNERS)
    runners["function"] = {
        **runners["function"],
        "OPTIONS": {
            **runners["function"].get("OPTIONS", {}),
            "allowed_urls": ["http://127.0.0.1:9/", "http://127.0.0.1:8/"],
        },
    }
    settings.TMS_RUNNERS = runners
    task = task_create(owner=user, runner=runner, config=config, secret_fields=secret_fields, start_at=LATER)
    client = client_for(user)
    shown = client.get(f"/api/v1/tasks/{task.pk}").data["config"]
    assert shown[gone[0]][gone[1]] == MASK
    response = client.patch(f"/api/v1/tasks/{task.pk}", {"config": {**shown, **move}}, format="json")
    assert response.status_code == 200, response.data
    assert gone[1] not in task_config(Task.objects.get(pk=task.pk))[gone[0]]


def test_a_slack_channels_url_is_never_shown_by_a_change_of_kind(api_client, user, staff_client):
    slack = "https://hooks.slack.com/services/T000/B000/sekritSlackPath"
    channel = channel_services.channel_create(owner=user, data={"name": "chat", "kind": "slack", "target": slack})
    url = f"/api/v1/notification-channels/{channel.pk}"
    response = api_client.patch(url, {"kind": "webhook"}, format="json")
    assert response.status_code == 400 and "target" in response.data["errors"]
    assert "sekrit" not in json.dumps(response.data) and "sekrit" not in api_client.get(url).content.decode()
    assert Channel.objects.get(pk=channel.pk).kind == "slack"
    shown = api_client.get(url).data["target"]
    assert api_client.patch(url, {"kind": "webhook", "target": shown}, format="json").status_code == 400
    response = api_client.patch(url, {"kind": "webhook", "target": "https://hooks.example.com/new"}, format="json")
    assert response.status_code == 200 and response.data["target"] == "https://hooks.example.com/new"
    audit = staff_client.get("/api/v1/audit").content.decode()
    assert "sekrit" not in audit and "sekrit" not in _audit_text()
