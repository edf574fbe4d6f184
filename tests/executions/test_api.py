"""The execution API (/api/v1/executions) and the worker API (/api/v1/workers)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from executions.models import Execution, ExecutionOrigin, Worker, WorkerStatus
from executions.models import ExecutionStatus as S
from tasks_app.models import Task, TaskStatus
from tests.factories import ExecutionFactory, TaskFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/executions"


def _assert_error(response, status: int, type_: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["type"] == type_ and body["detail"], body
    return body


def _iso(when) -> str:
    return when.isoformat().replace("+00:00", "Z")


# --- list and get ----------------------------------------------------------------------------


def test_list_filters_by_task_status_origin_and_scheduled_time(api_client, user, other_user):
    now = timezone.now()
    task, second = TaskFactory(owner=user), TaskFactory(owner=user)
    early = ExecutionFactory(task=task, scheduled_for=now - timedelta(hours=2), status=S.FAILED)
    middle = ExecutionFactory(task=task, scheduled_for=now - timedelta(hours=1), status=S.SUCCEEDED)
    late = ExecutionFactory(task=second, scheduled_for=now, origin=ExecutionOrigin.TRIGGER)
    ExecutionFactory(task=TaskFactory(owner=other_user), scheduled_for=now)

    def ids(query: str = "") -> list[int]:
        response = api_client.get(f"{URL}?{query}")
        assert response.status_code == 200, response.content
        return [e["id"] for e in response.json()["results"]]

    assert ids() == [late.pk, middle.pk, early.pk]  # newest first, only mine
    assert ids(f"task={task.pk}") == [middle.pk, early.pk]
    assert ids("status=FAILED") == [early.pk]
    assert ids("origin=trigger") == [late.pk]
    after, before = _iso(now - timedelta(minutes=90)), _iso(now - timedelta(minutes=1))
    assert ids(f"scheduled_after={after}&scheduled_before={before}") == [middle.pk]
    assert ids("ordering=scheduled_for&limit=2") == [early.pk, middle.pk]


@pytest.mark.parametrize("query", ["task=not-a-uuid", "status=DONE", "scheduled_after=yesterday", "origin=x"])
def test_bad_filters_are_400s(api_client, query):
    _assert_error(api_client.get(f"{URL}?{query}"), 400, "validation_error")


def test_get_an_execution_with_its_event_timeline(api_client, user):
    execution = ExecutionFactory(task=TaskFactory(owner=user))
    response = api_client.get(f"{URL}/{execution.pk}")
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == execution.pk and body["task"] == str(execution.task_id)
    assert body["origin"] == "schedule" and body["retry_of"] is None
    (event,) = body["events"]
    assert (event["from_status"], event["to_status"], event["attempt"], event["actor"]) == (
        "",
        "SCHEDULED",
        1,
        "factory",
    )


@pytest.mark.parametrize("execution_id", ["abc", "0", "-1", "99999999999999999999999", "1.5"])
def test_unknown_or_malformed_execution_ids_are_json_404s(api_client, execution_id):
    _assert_error(api_client.get(f"{URL}/{execution_id}"), 404, "not_found")
    _assert_error(api_client.post(f"{URL}/{execution_id}/cancel"), 404, "not_found")


# --- cancel ----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [S.SCHEDULED, S.PENDING])
def test_cancel_of_an_execution_that_has_not_started(api_client, user, status):
    execution = ExecutionFactory(task=TaskFactory(owner=user), status=status)
    response = api_client.post(f"{URL}/{execution.pk}/cancel")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "execution": execution.pk,
        "task": str(execution.task_id),
        "from_status": status,
        "status": "CANCELLED",
        "external_run": "none",
        "detail": "",
    }
    execution.refresh_from_db()
    assert execution.status == S.CANCELLED and not execution.superseded
    last = execution.events.last()
    assert (last.from_status, last.to_status, last.actor) == (status, S.CANCELLED, "user:alice")


def test_cancel_of_a_running_execution_stops_its_external_run(api_client, user, test_runners):
    task = TaskFactory(owner=user, runner="cancellable")
    execution = ExecutionFactory(
        task=task, status=S.RUNNING, lease_owner="w:1:1", external_run_id="ext-9", run_handle={"k": 1}
    )
    response = api_client.post(f"{URL}/{execution.pk}/cancel")
    assert response.status_code == 200, response.content
    assert response.json()["external_run"] == "stopped"
    assert test_runners.CANCELLED == [("cancellable", "ext-9", {"k": 1})]
    execution.refresh_from_db()
    assert execution.status == S.CANCELLED and execution.lease_owner == ""


@pytest.mark.parametrize(
    ("runner", "external_run_id", "outcome"),
    [("uncancellable", "ext-1", "unsupported"), ("broken-cancel", "ext-1", "failed"), ("cancellable", "", "discarded")],
)
def test_cancel_answers_202_when_the_external_run_may_go_on(
    api_client, user, test_runners, runner, external_run_id, outcome
):
    task = TaskFactory(owner=user, runner=runner)
    execution = ExecutionFactory(task=task, status=S.RUNNING, external_run_id=external_run_id)
    response = api_client.post(f"{URL}/{execution.pk}/cancel")
    assert response.status_code == 202, response.content
    assert response.json()["external_run"] == outcome
    execution.refresh_from_db()
    assert execution.status == S.CANCELLED


@pytest.mark.parametrize("status", [S.SUCCEEDED, S.FAILED, S.CANCELLED])
def test_cancel_of_a_finished_execution_is_a_409_and_changes_nothing(api_client, user, status):
    execution = ExecutionFactory(task=TaskFactory(owner=user), status=status)
    body = _assert_error(api_client.post(f"{URL}/{execution.pk}/cancel"), 409, "conflict")
    assert status in body["detail"]
    execution.refresh_from_db()
    assert execution.status == status and execution.events.count() == 1


# --- retry -----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [S.FAILED, S.CANCELLED])
def test_retry_runs_a_failed_or_cancelled_execution_again_as_a_new_attempt(api_client, user, status):
    old = ExecutionFactory(task=TaskFactory(owner=user), status=status, attempt=3, error="boom")
    response = api_client.post(f"{URL}/{old.pk}/retry")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] != old.pk and body["task"] == str(old.task_id)
    assert (body["status"], body["attempt"], body["origin"], body["retry_of"]) == ("SCHEDULED", 4, "retry", old.pk)
    assert response.headers["Location"] == f"{URL}/{body['id']}"
    old.refresh_from_db()
    assert (old.status, old.attempt, old.error) == (status, 3, "boom")  # terminal rows stay as they were

    again = _assert_error(api_client.post(f"{URL}/{old.pk}/retry"), 409, "conflict")
    assert f"already retried as execution {body['id']}" in again["detail"]
    # The retry can itself be retried once it failed.
    Execution.objects.filter(pk=body["id"]).update(status=S.FAILED)
    third = api_client.post(f"{URL}/{body['id']}/retry")
    assert third.status_code == 201 and third.json()["attempt"] == 5


@pytest.mark.parametrize("status", [S.SCHEDULED, S.PENDING, S.RUNNING, S.SUCCEEDED])
def test_retry_of_an_execution_that_did_not_fail_is_a_409(api_client, user, status):
    execution = ExecutionFactory(task=TaskFactory(owner=user), status=status)
    body = _assert_error(api_client.post(f"{URL}/{execution.pk}/retry"), 409, "conflict")
    assert "FAILED or CANCELLED" in body["detail"]
    assert Execution.objects.count() == 1


def test_retry_of_an_execution_of_a_deleted_task_is_a_409(api_client, user):
    execution = ExecutionFactory(task=TaskFactory(owner=user, status=TaskStatus.DELETED), status=S.FAILED)
    body = _assert_error(api_client.post(f"{URL}/{execution.pk}/retry"), 409, "conflict")
    assert "deleted" in body["detail"]


# --- workers ---------------------------------------------------------------------------------


def test_staff_list_workers_with_state_and_last_heartbeat(staff_client):
    Worker.objects.create(id="host-a:10", hostname="host-a", pid=10)
    Worker.objects.create(id="host-b:20", hostname="host-b", pid=20, status=WorkerStatus.DEAD)
    Worker.objects.filter(id="host-b:20").update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    response = staff_client.get("/api/v1/workers")
    assert response.status_code == 200, response.content
    workers = response.json()["results"]
    assert [w["id"] for w in workers] == ["host-a:10", "host-b:20"]
    alive, dead = workers
    assert alive["status"] == "ALIVE" and alive["seconds_since_heartbeat"] < 5
    assert dead["status"] == "DEAD" and 290 < dead["seconds_since_heartbeat"] < 310
    assert {"hostname", "pid", "started_at", "last_heartbeat"} <= set(alive)
    assert [w["id"] for w in staff_client.get("/api/v1/workers?status=DEAD").json()["results"]] == ["host-b:20"]
    assert staff_client.get("/api/v1/workers/host-a:10").json()["pid"] == 10
    _assert_error(staff_client.get("/api/v1/workers/nobody:1"), 404, "not_found")


def test_an_empty_worker_filter_is_refused_not_read_as_no_filter(staff_client):
    """Found by the schema walk: ``?status=`` listed every worker, where the schema says the
    value is one of the states (the other lists refuse it through StrictFilterSet)."""
    Worker.objects.create(id="host-a:10", hostname="host-a", pid=10)
    body = _assert_error(staff_client.get("/api/v1/workers?status="), 400, "validation_error")
    assert "status" in body["errors"], body
    # The rule holds for every list: each filter set of the API refuses an empty value.
    import django_filters

    from tms_core.api.base import StrictFilterSet

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    product = [cls for cls in subclasses(django_filters.FilterSet) if not cls.__module__.startswith("django_filters")]
    loose = [f"{cls.__module__}.{cls.__name__}" for cls in product if not issubclass(cls, StrictFilterSet)]
    assert len(product) >= 5 and loose == [], loose


def test_workers_are_staff_only(api_client):
    Worker.objects.create(id="host-a:10", hostname="host-a", pid=10)
    _assert_error(api_client.get("/api/v1/workers"), 403, "permission_denied")
    _assert_error(api_client.get("/api/v1/workers/host-a:10"), 403, "permission_denied")
    _assert_error(APIClient().get("/api/v1/workers"), 401, "not_authenticated")


# --- end to end: cancel and retry on the real platform ----------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_cancel_stops_a_running_execution_and_retry_runs_it_again_on_the_real_worker(user):
    from tests.conftest import client_for
    from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready

    client = client_for(user)
    worker, monitor = start_worker(concurrency=2), start_monitor()
    with running(worker, monitor):
        wait_worker_ready(worker)
        # 40 s is past the sleep runner's inline limit: an asynchronous run, polled by deadline.
        task = client.post("/api/v1/tasks", {"runner": "sleep", "config": {"duration": "40s"}}).json()
        (execution,) = Execution.objects.filter(task_id=task["id"])
        wait_for(
            lambda: Execution.objects.filter(pk=execution.pk, status=S.RUNNING).exclude(external_run_id="").exists(),
            timeout=30,
            what="the run to start",
        )
        response = client.post(f"{URL}/{execution.pk}/cancel")
        assert response.status_code == 200, response.content
        assert response.json()["from_status"] == "RUNNING" and response.json()["external_run"] == "stopped"

        # Made quick before the retry exists: a worker may claim it (and read the config) at once.
        Task.objects.filter(pk=task["id"]).update(config={"duration": "100ms"})
        retry = client.post(f"{URL}/{execution.pk}/retry")
        assert retry.status_code == 201, retry.content
        wait_for(
            lambda: Execution.objects.filter(pk=retry.json()["id"], status=S.SUCCEEDED).exists(),
            timeout=30,
            what="the retry to succeed",
        )
    execution.refresh_from_db()
    assert execution.status == S.CANCELLED
    assert not execution.events.filter(to_status=S.SUCCEEDED).exists()
    new = Execution.objects.get(pk=retry.json()["id"])
    assert (new.attempt, new.retry_of_id, new.output) == (2, execution.pk, "slept 0.1s")
