"""What a new user reads in the API: a task's state, its next run, its first execution, the order
of execution lists, wall-clock start times, and the 401 for the wrong auth scheme (issue 12)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from executions.models import Execution
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_api.lifecycle import task_pause
from tasks_app.models import Task
from tests.factories import ExecutionFactory, TaskFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/tasks"


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def _finish(execution: Execution, status: str) -> None:
    # Test set-up only: put the run into the state the worker would have left it in.
    Execution.objects.filter(pk=execution.pk).update(status=status, finished_at=timezone.now())


# --- state -------------------------------------------------------------------------------------


def test_a_one_shot_task_reads_scheduled_until_it_runs_then_how_its_run_ended(api_client):
    body = api_client.post(URL, {"runner": "noop"}).json()
    # The lifecycle status says the schedule has nothing left to create; the state says it has not run.
    assert body["status"] == "COMPLETED" and body["state"] == "scheduled"
    (execution,) = Execution.objects.filter(task_id=body["id"])

    Execution.objects.filter(pk=execution.pk).update(status=S.RUNNING, started_at=timezone.now())
    assert api_client.get(f"{URL}/{body['id']}").json()["state"] == "running"
    _finish(execution, S.FAILED)
    detail = api_client.get(f"{URL}/{body['id']}").json()
    assert detail["status"] == "COMPLETED" and detail["state"] == "failed"
    listed = api_client.get(URL).json()["results"]
    assert [(t["id"], t["state"]) for t in listed] == [(body["id"], "failed")]


def test_a_one_shot_task_whose_run_succeeded_reads_succeeded(api_client):
    body = api_client.post(URL, {"runner": "noop"}).json()
    _finish(Execution.objects.get(task_id=body["id"]), S.SUCCEEDED)
    assert api_client.get(f"{URL}/{body['id']}").json()["state"] == "succeeded"


def test_recurring_paused_and_ended_tasks_read_scheduled_paused_and_completed(api_client, user):
    now = timezone.now()
    recurring = task_create(owner=user, runner="noop", interval=timedelta(minutes=1))
    paused = task_pause(task=task_create(owner=user, runner="noop", interval=timedelta(minutes=1)), actor="t")
    ended = task_create(
        owner=user,
        runner="noop",
        start_at=now - timedelta(hours=1),
        interval=timedelta(minutes=1),
        end_at=now - timedelta(minutes=30),
        misfire_policy="skip",
    )
    states = {t["id"]: t["state"] for t in api_client.get(URL).json()["results"]}
    assert states == {str(recurring.pk): "scheduled", str(paused.pk): "paused", str(ended.pk): "completed"}


def test_the_task_list_costs_the_same_queries_for_one_task_and_for_twenty(api_client, user):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert api_client.get(URL).status_code == 200
        return len(captured)

    task_create(owner=user, runner="noop", interval=timedelta(minutes=1))
    one = queries()
    for _ in range(19):
        task_create(owner=user, runner="noop", interval=timedelta(minutes=1))
    assert queries() == one


# --- first execution, next run ---------------------------------------------------------------


def test_create_answers_the_first_execution(api_client):
    body = api_client.post(URL, {"runner": "noop"}).json()
    (execution,) = Execution.objects.filter(task_id=body["id"])
    assert body["first_execution"] == execution.pk
    assert api_client.get(f"/api/v1/executions/{body['first_execution']}").status_code == 200


def test_create_answers_no_first_execution_beyond_the_horizon(api_client):
    body = api_client.post(URL, {"runner": "noop", "start_at": _iso(timezone.now() + timedelta(days=2))}).json()
    assert body["first_execution"] is None and body["state"] == "scheduled"


def test_next_run_at_is_the_next_run_and_the_cursor_has_its_own_name(api_client):
    start = timezone.now() + timedelta(seconds=20)
    body = api_client.post(URL, {"runner": "noop", "start_at": _iso(start), "interval": 10}).json()
    task = Task.objects.get(pk=body["id"])
    first = Execution.objects.filter(task=task).order_by("due_at").first()
    # The horizon (60 s in the tests) holds several runs: the cursor is past them all.
    assert task.next_run_at > first.due_at
    assert datetime.fromisoformat(body["next_run_at"]) == first.due_at
    assert datetime.fromisoformat(body["next_occurrence_at"]) == task.next_run_at
    listed = api_client.get(URL).json()["results"][0]
    assert datetime.fromisoformat(listed["next_run_at"]) == first.due_at
    paused = api_client.post(f"{URL}/{task.pk}/pause").json()
    assert paused["next_run_at"] is None and paused["state"] == "paused"


def test_ordering_by_next_run_at_orders_by_the_next_run(api_client, user):
    now = timezone.now()
    later = task_create(owner=user, runner="noop", start_at=now + timedelta(seconds=40), interval=timedelta(hours=1))
    sooner = task_create(owner=user, runner="noop", start_at=now + timedelta(seconds=20), interval=timedelta(hours=1))
    ids = [t["id"] for t in api_client.get(f"{URL}?ordering=next_run_at").json()["results"]]
    assert ids == [str(sooner.pk), str(later.pk)]


# --- execution lists: what ran before what will run --------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/executions", "/api/v1/tasks/{task}/executions"])
def test_execution_lists_show_what_ran_before_what_will_run(api_client, user, path):
    now = timezone.now()
    task = TaskFactory(owner=user)
    future = [ExecutionFactory(task=task, scheduled_for=now + timedelta(minutes=m)) for m in (3, 1, 2)]
    old = ExecutionFactory(task=task, scheduled_for=now - timedelta(hours=2), status=S.SUCCEEDED)
    last = ExecutionFactory(task=task, scheduled_for=now - timedelta(minutes=1), status=S.FAILED)
    running = ExecutionFactory(task=task, scheduled_for=now - timedelta(seconds=5), status=S.RUNNING)
    url = path.format(task=task.pk)
    ids = [e["id"] for e in api_client.get(url).json()["results"]]
    soonest_first = sorted(future, key=lambda e: e.scheduled_for)
    assert ids == [running.pk, last.pk, old.pk, *(e.pk for e in soonest_first)]
    ordered = [e["id"] for e in api_client.get(f"{url}?ordering=-scheduled_for").json()["results"]]
    assert ordered[0] == max(future, key=lambda e: e.scheduled_for).pk


# --- wall-clock start times --------------------------------------------------------------------


def test_a_start_at_without_offset_is_read_in_the_tasks_time_zone(api_client):
    body = api_client.post(
        URL, {"runner": "noop", "start_at": "2030-01-15T09:00:00", "timezone": "Europe/Berlin", "cron": "0 9 * * *"}
    ).json()
    assert body["start_at"] == "2030-01-15T08:00:00Z"
    (first,) = api_client.get(f"{URL}/{body['id']}/preview?count=1").json()["fire_times"]
    assert first["utc"] == "2030-01-15T08:00:00Z"
    # With an offset it is that instant, whatever the zone.
    body = api_client.post(
        URL, {"runner": "noop", "start_at": "2030-01-15T09:00:00Z", "timezone": "Europe/Berlin"}
    ).json()
    assert body["start_at"] == "2030-01-15T09:00:00Z"


def test_a_wall_clock_start_at_in_the_spring_gap_is_a_400_that_says_so(api_client):
    response = api_client.post(URL, {"runner": "noop", "start_at": "2030-03-31T02:30:00", "timezone": "Europe/Berlin"})
    assert response.status_code == 400, response.content
    (message,) = response.json()["errors"]["start_at"]
    assert "does not exist in Europe/Berlin" in message
    assert not Task.objects.exists()


def test_a_repeated_wall_clock_time_is_read_as_its_first_occurrence(api_client):
    body = api_client.post(
        URL, {"runner": "noop", "start_at": "2030-10-27T02:30:00", "timezone": "Europe/Berlin"}
    ).json()
    assert body["start_at"] == "2030-10-27T00:30:00Z"  # 02:30 CEST, not 02:30 CET (01:30Z)


def test_patch_reads_a_wall_clock_start_at_in_the_new_time_zone(api_client, user):
    task = task_create(owner=user, runner="noop", start_at=datetime(2030, 1, 1, tzinfo=UTC))
    body = api_client.patch(
        f"{URL}/{task.pk}", {"start_at": "2030-06-01T12:00:00", "timezone": "America/New_York"}
    ).json()
    assert body["start_at"] == "2030-06-01T16:00:00Z"


def test_schedule_preview_reads_wall_clock_times_in_its_time_zone(api_client):
    body = api_client.post(
        "/api/v1/schedules/preview",
        {"start_at": "2030-01-15T09:00:00", "timezone": "Asia/Tokyo", "interval": 60, "count": 1},
    ).json()
    assert body["fire_times"][0]["utc"] == "2030-01-15T00:00:00Z"


# --- authentication scheme ---------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["Token", "Bearer", "bearer", "TOKEN"])
def test_the_key_is_accepted_with_the_token_and_the_bearer_scheme(user, scheme):
    from tests.conftest import account_key_for

    key = account_key_for(user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {key}")
    response = client.get(URL)
    assert response.status_code == 200, response.content
    assert response.json()["results"] == []
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {key}x")
    assert client.get(URL).status_code == 401  # a wrong key is refused under either scheme


@pytest.mark.parametrize(
    "header",
    ["Bearer", "Bearer a b", "Token", "Digest abc", "ApiKey abc"],
)
def test_a_bad_authorization_header_gets_a_401_that_names_both_schemes(header):
    response = APIClient(HTTP_AUTHORIZATION=header).get(URL)
    assert response.status_code == 401
    body = response.json()
    assert body["type"] == "not_authenticated", body
    if header.split()[0] not in {"Bearer", "Token"}:
        assert "Authorization: Token <key>" in body["detail"] and "Authorization: Bearer <key>" in body["detail"]
    assert response["WWW-Authenticate"] == "Token, Bearer"


def test_no_credentials_gets_a_401_that_names_the_token_scheme():
    body = APIClient().get(URL).json()
    assert body["type"] == "not_authenticated" and "Authorization: Token <key>" in body["detail"]
    assert "Authorization: Bearer <key>" in body["detail"]
