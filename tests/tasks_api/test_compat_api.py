"""The original service's API at the root: POST /tasks, GET /tasks, GET /tasks/<id>."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from executions.models import Execution
from executions.models import ExecutionStatus as S
from tasks_app.models import Task, TaskStatus
from tests.factories import ExecutionFactory, TaskFactory
from tests.processes import (
    run_command,
    running,
    start_monitor,
    start_worker,
    wait_for,
    wait_worker_ready,
)
from tests.web import start_web

FIELDS = {"id", "status", "start_at", "recurring", "command"}


def _assert_error(response, status: int, type_: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["type"] == type_ and body["detail"], body
    return body


# --- POST /tasks -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_post_answers_200_with_the_original_task_response(api_client, user):
    response = api_client.post("/tasks", {"command": "5s"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == FIELDS
    assert body["status"] == "SCHEDULED" and body["command"] == "5s" and body["recurring"] == ""
    task = Task.objects.get(pk=body["id"])
    assert task.owner == user and task.runner == "sleep" and task.config == {"duration": "5s"}
    assert task.interval is None
    assert Execution.objects.filter(task=task, status=S.SCHEDULED).count() == 1


@pytest.mark.django_db
def test_post_with_start_at_and_recurring(api_client):
    start = timezone.now() + timedelta(days=1)
    response = api_client.post(
        "/tasks/", {"command": "1500ms", "start_at": start.isoformat(), "recurring": "3s"}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["command"], body["recurring"], body["status"]) == ("1s500ms", "3s", "SCHEDULED")
    assert body["start_at"] == start.isoformat().replace("+00:00", "Z")
    task = Task.objects.get(pk=body["id"])
    assert task.interval == timedelta(seconds=3) and task.start_at == start


@pytest.mark.django_db
def test_empty_optional_fields_mean_absent_as_in_the_original(api_client):
    response = api_client.post("/tasks", {"command": "10ms", "start_at": "", "recurring": ""})
    assert response.status_code == 200, response.content
    assert response.json()["recurring"] == ""


@pytest.mark.django_db
def test_a_long_sleep_gets_a_timeout_that_lets_it_finish(api_client, settings):
    response = api_client.post("/tasks", {"command": "2h"})
    assert response.status_code == 200
    assert Task.objects.get().timeout == timedelta(hours=2, minutes=1)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "command"),
        ({"command": "soon"}, "command"),
        ({"command": ""}, "command"),
        ({"command": True}, "command"),
        ({"command": "1s", "recurring": "1ms"}, "recurring"),
        ({"command": "1s", "recurring": "weekly"}, "recurring"),
        ({"command": "1s", "start_at": "yesterday"}, "start_at"),
        ({"command": "1s", "start_at": 12}, "start_at"),
        ({"command": "1s", "runner": "http"}, "runner"),
    ],
)
def test_bad_input_is_a_400_with_per_field_messages(api_client, payload, field):
    body = _assert_error(api_client.post("/tasks", payload, format="json"), 400, "validation_error")
    assert field in body["errors"]
    assert Task.objects.count() == 0


@pytest.mark.django_db
def test_post_honours_idempotency_keys(api_client):
    first = api_client.post("/tasks", {"command": "1s"}, HTTP_IDEMPOTENCY_KEY="compat-1")
    second = api_client.post("/tasks", {"command": "1s"}, HTTP_IDEMPOTENCY_KEY="compat-1")
    assert first.status_code == second.status_code == 200
    assert first.json()["id"] == second.json()["id"] and Task.objects.count() == 1


@pytest.mark.django_db
def test_compat_requires_authentication():
    _assert_error(APIClient().post("/tasks", {"command": "1s"}, format="json"), 401, "not_authenticated")
    _assert_error(APIClient().get("/tasks"), 401, "not_authenticated")


# --- GET /tasks and /tasks/<id> --------------------------------------------------------------


@pytest.mark.django_db
def test_get_lists_your_tasks_newest_first_and_gets_one(api_client, user, other_user):
    first = api_client.post("/tasks", {"command": "1s"}).json()
    second = api_client.post("/tasks", {"command": "2s", "recurring": "1m"}).json()
    TaskFactory(owner=other_user)
    TaskFactory(owner=user, status=TaskStatus.DELETED)
    listed = api_client.get("/tasks")
    assert listed.status_code == 200
    assert [t["id"] for t in listed.json()] == [second["id"], first["id"]]
    assert all(set(t) == FIELDS for t in listed.json())
    one = api_client.get(f"/tasks/{first['id']}")
    assert one.status_code == 200 and one.json() == first


@pytest.mark.django_db
# A fixed unknown id: pytest-xdist needs every worker to collect the same test ids.
@pytest.mark.parametrize("task_id", ["0fff4d6b-1cf3-469a-ae10-2cd2d36c1b42", "not-a-uuid", "123"])
def test_get_of_an_unknown_task_is_a_404(api_client, task_id):
    _assert_error(api_client.get(f"/tasks/{task_id}"), 404, "not_found")


@pytest.mark.django_db
def test_tasks_of_other_runners_show_the_runner_as_command(api_client, user):
    task = TaskFactory(owner=user, runner="noop", interval=timedelta(minutes=5))
    assert api_client.get(f"/tasks/{task.pk}").json()["command"] == "noop"
    assert api_client.get(f"/tasks/{task.pk}").json()["recurring"] == "5m"


# --- the status of a task, from its executions ------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("recurring", "task_status", "executions", "expected"),
    [
        (False, TaskStatus.ACTIVE, [], "SCHEDULED"),  # start_at in the future, not materialised yet
        (False, TaskStatus.COMPLETED, [S.SCHEDULED], "SCHEDULED"),
        (False, TaskStatus.COMPLETED, [S.PENDING], "PENDING"),
        (False, TaskStatus.COMPLETED, [S.RUNNING], "RUNNING"),
        (False, TaskStatus.COMPLETED, [S.SUCCEEDED], "FINISHED"),
        (False, TaskStatus.COMPLETED, [S.FAILED], "FINISHED"),
        (False, TaskStatus.COMPLETED, [S.CANCELLED], "FINISHED"),
        (False, TaskStatus.PAUSED, [S.CANCELLED], "SCHEDULED"),  # paused before it ran: it runs on resume
        (True, TaskStatus.ACTIVE, [S.SUCCEEDED], "SCHEDULED"),  # between runs
        (True, TaskStatus.ACTIVE, [S.SUCCEEDED, S.RUNNING, S.SCHEDULED], "RUNNING"),
        (True, TaskStatus.ACTIVE, [S.SUCCEEDED, S.PENDING, S.SCHEDULED], "PENDING"),
        (True, TaskStatus.COMPLETED, [S.SUCCEEDED, S.FAILED], "FINISHED"),  # past its end_at / max_runs
    ],
)
def test_status_follows_the_tasks_executions(api_client, user, recurring, task_status, executions, expected):
    task = TaskFactory(owner=user, status=task_status, interval=timedelta(minutes=1) if recurring else None)
    now = timezone.now()
    for index, status in enumerate(executions):
        ExecutionFactory(task=task, status=status, scheduled_for=now + timedelta(minutes=index))
    assert api_client.get(f"/tasks/{task.pk}").json()["status"] == expected
    assert api_client.get("/tasks").json()[0]["status"] == expected


# --- end to end: the README's first example on the real platform ------------------------------


def _curl(*args: str) -> dict:
    result = subprocess.run(["curl", "-sS", "--fail-with-body", *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_original_curl_example_reaches_finished_on_the_real_worker():
    """The README's first example, verbatim: curl POST /tasks {"command": "1s"} against a real web
    process (gunicorn), then a real monitor and Celery worker run it; GET /tasks/<id> says FINISHED."""
    made = run_command("tms_create_user", "carol")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    web, base = start_web()
    worker, monitor = start_worker(concurrency=2), start_monitor()
    with running(web, worker, monitor):
        wait_worker_ready(worker)
        created = _curl(
            "-X", "POST", f"{base}/tasks",
            "-H", f"Authorization: Token {token}",
            "-H", "Content-Type: application/json",
            "-d", '{"command": "1s"}',
        )  # fmt: skip
        assert set(created) == FIELDS and created["command"] == "1s" and created["recurring"] == ""
        assert created["status"] in ("SCHEDULED", "PENDING", "RUNNING")
        seen: list[str] = []

        def finished() -> bool:
            status = _curl(f"{base}/tasks/{created['id']}", "-H", f"Authorization: Token {token}")["status"]
            if not seen or seen[-1] != status:
                seen.append(status)
            return status == "FINISHED"

        wait_for(finished, timeout=60, interval=0.1, what="the task to be FINISHED")
        listed = _curl(f"{base}/tasks", "-H", f"Authorization: Token {token}")
        assert [t["id"] for t in listed] == [created["id"]] and listed[0]["status"] == "FINISHED"
    (execution,) = Execution.objects.filter(task_id=created["id"])
    assert execution.status == S.SUCCEEDED and execution.output == "slept 1s"
    assert execution.finished_at - execution.started_at >= timedelta(seconds=1)
    assert "RUNNING" in seen and seen[-1] == "FINISHED", seen
