"""Task versions: every change makes one, each execution records the one it was created from,
and the execution's page shows those settings (masked) and the diff to the current ones."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from executions.models import Execution
from tasks_api.creation import task_create
from tasks_api.editing import task_update
from tasks_app.models import Task, TaskVersion

pytestmark = pytest.mark.django_db

SECRET = "Bearer sk-live-version-0123456789"
LATER = timezone.now() + timedelta(days=1)


def _task(user) -> Task:
    config = {"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": SECRET}, "json": {"n": 1}}
    return task_create(owner=user, runner="http", config=config, start_at=LATER, name="versioned")


def _config(n: int) -> dict:
    """The config as an edit sends it back: the secret as its mask (kept), ``json.n`` changed."""
    return {"config": {"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": "********"}, "json": {"n": n}}}


def _trigger(api_client, task) -> Execution:
    response = api_client.post(f"/api/v1/tasks/{task.pk}/trigger")
    assert response.status_code == 201, response.content
    return Execution.objects.get(pk=response.json()["id"])


def test_changes_make_versions_and_executions_record_the_one_they_were_created_from(api_client, user):
    task = _task(user)
    first = _trigger(api_client, task)
    assert api_client.patch(f"/api/v1/tasks/{task.pk}", {"max_attempts": 4}, format="json").status_code == 200
    second = _trigger(api_client, task)
    response = api_client.patch(f"/api/v1/tasks/{task.pk}", _config(2), format="json")
    assert response.status_code == 200 and response.json()["version"] == 3
    third = _trigger(api_client, task)

    assert [first.task_version, second.task_version, third.task_version] == [1, 2, 3]
    shown = api_client.get(f"/api/v1/executions/{second.pk}").json()
    assert shown["task_version"] == 2
    listed = api_client.get(f"/api/v1/tasks/{task.pk}/versions").json()["results"]
    assert [v["number"] for v in listed] == [3, 2, 1]
    assert listed[0]["changed"] == ["config"] and listed[1]["changed"] == ["max_attempts"]
    assert listed[0]["actor"] == "alice" and listed[0]["source"] == "api"
    assert listed[1]["settings"]["max_attempts"] == 4 and listed[2]["settings"]["max_attempts"] != 4
    assert "status" not in listed[0]["settings"]


def test_a_change_that_changes_nothing_makes_no_version(api_client, user):
    task = _task(user)
    api_client.patch(f"/api/v1/tasks/{task.pk}", {"name": "versioned"}, format="json")
    api_client.post(f"/api/v1/tasks/{task.pk}/pause")

    assert list(TaskVersion.objects.filter(task=task).values_list("number", flat=True)) == []  # lazy
    listed = api_client.get(f"/api/v1/tasks/{task.pk}/versions").json()["results"]
    assert [version["number"] for version in listed] == [1]
    assert listed[0]["settings"]["name"] == "versioned" and listed[0]["changed"] == []
    assert Task.objects.get(pk=task.pk).version == 1


def test_materialised_runs_record_the_version_too(user):
    task = task_create(owner=user, runner="noop", interval=timedelta(seconds=60))
    assert {e.task_version for e in Execution.objects.filter(task=task)} == {1}

    task_update(task=task, actor="alice", changes={"priority": 7})

    waiting = Execution.objects.filter(task=task, superseded=False, status="SCHEDULED")
    assert waiting.exists() and {e.task_version for e in waiting} == {2}


def test_secrets_never_appear_in_versions_in_the_clear(api_client, user):
    task = _task(user)
    new_secret = "Bearer sk-live-rotated-9876543210"
    api_client.patch(
        f"/api/v1/tasks/{task.pk}",
        {"config": {"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": new_secret}, "json": {"n": 1}}},
        format="json",
    )

    stored = json.dumps(list(TaskVersion.objects.filter(task=task).values("snapshot", "changed")))
    listed = api_client.get(f"/api/v1/tasks/{task.pk}/versions").content.decode()
    for text in (stored, listed):
        assert SECRET not in text and new_secret not in text and "sk-live" not in text
    versions = list(TaskVersion.objects.filter(task=task).order_by("number"))
    assert [v.number for v in versions] == [1, 2] and versions[1].changed == ["config"]
    assert versions[1].snapshot["config"]["headers"]["Authorization"] == "********"


def test_the_execution_page_shows_its_settings_and_the_diff_to_the_current_ones(api_client, client, user):
    task = _task(user)
    execution = _trigger(api_client, task)
    api_client.patch(f"/api/v1/tasks/{task.pk}", {"max_attempts": 5}, format="json")
    api_client.patch(f"/api/v1/tasks/{task.pk}", _config(7), format="json")
    client.force_login(user)

    page = client.get(f"/ui/executions/{execution.pk}/").content.decode()

    assert "Settings it ran with: version 1" in page and "it is at version 3" in page
    assert 'id="version-diff"' in page
    assert '<span class="diff-del">-      &quot;n&quot;: 1' in page
    assert '<span class="diff-add">+      &quot;n&quot;: 7' in page
    assert "max_attempts" in page.split('id="version-diff"')[1].split("</pre>")[0]
    assert SECRET not in page and "sk-live" not in page


def test_the_page_of_a_run_of_the_current_version_shows_no_diff(api_client, client, user):
    task = _task(user)
    execution = _trigger(api_client, task)
    client.force_login(user)

    page = client.get(f"/ui/executions/{execution.pk}/").content.decode()

    assert "Settings it ran with: version 1" in page and 'id="version-diff"' not in page
    assert "unchanged since" in page


def test_a_task_older_than_versions_gets_its_first_version_when_it_changes(api_client, user):
    task = _task(user)
    TaskVersion.objects.filter(task=task).delete()  # as a task made before versions existed

    api_client.patch(f"/api/v1/tasks/{task.pk}", {"max_attempts": 2}, format="json")

    versions = list(TaskVersion.objects.filter(task=task).order_by("number"))
    assert [(v.number, v.changed) for v in versions] == [(1, []), (2, ["max_attempts"])]


def test_another_owner_sees_no_versions(other_client, user):
    task = _task(user)
    assert other_client.get(f"/api/v1/tasks/{task.pk}/versions").status_code == 404


def test_the_admin_lists_versions_and_trigger_urls_read_only_without_secrets(admin_client, api_client, user):
    task = _task(user)
    api_client.patch(f"/api/v1/tasks/{task.pk}", {"max_attempts": 2}, format="json")
    made = api_client.post(f"/api/v1/tasks/{task.pk}/trigger-url").json()
    version = TaskVersion.objects.get(task=task, number=2)

    listed = admin_client.get("/admin/tasks_app/taskversion/").content.decode()
    page = admin_client.get(f"/admin/tasks_app/taskversion/{version.pk}/change/").content.decode()
    hooks = admin_client.get("/admin/tasks_app/taskhook/").content.decode()
    hook = admin_client.get(f"/admin/tasks_app/taskhook/{made['id']}/change/").content.decode()

    assert "max_attempts" in listed and "max_attempts" in page
    assert made["id"] in hooks and made["id"] in hook
    for text in (listed, page, hooks, hook):
        assert SECRET not in text and made["secret"] not in text and "$enc:" not in text
    assert admin_client.get("/admin/tasks_app/taskhook/add/").status_code == 403


def test_a_task_s_limits_are_in_every_version_not_only_when_they_change(api_client, user):
    api_client.post("/api/v1/limits", {"name": "api", "max_concurrency": 2}, format="json")
    created = api_client.post(
        "/api/v1/tasks", {"runner": "noop", "interval": "1m", "limits": ["api"]}, format="json"
    ).json()
    api_client.patch(f"/api/v1/tasks/{created['id']}", {"max_attempts": 2}, format="json")
    api_client.patch(f"/api/v1/tasks/{created['id']}", {"limits": []}, format="json")

    versions = api_client.get(f"/api/v1/tasks/{created['id']}/versions").json()["results"]
    assert [v["settings"].get("limits") for v in versions] == [None, ["api"], ["api"]]
    assert [v["changed"] for v in versions] == [["limits"], ["max_attempts"], []]


def test_a_malformed_task_id_is_a_404(api_client):
    assert api_client.get("/api/v1/tasks/null,null/versions").status_code == 404
