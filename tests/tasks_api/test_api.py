"""The task API: /api/v1/tasks and its actions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from executions.models import Execution, ExecutionEvent, ExecutionOrigin
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_app.models import Task, TaskStatus
from tests.factories import ExecutionFactory, TaskFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/tasks"


def _iso(when) -> str:
    return when.isoformat().replace("+00:00", "Z")


def _assert_error(response, status: int, type_: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["type"] == type_, body
    assert isinstance(body["detail"], str) and body["detail"]
    return body


# --- create ----------------------------------------------------------------------------------


def test_create_returns_the_task_owned_by_the_caller_and_materialises_its_first_run(api_client, user):
    response = api_client.post(URL, {"name": "hello", "runner": "sleep", "config": {"duration": "2s"}})
    assert response.status_code == 201, response.content
    body = response.json()
    # A one-shot task whose only run is materialised has nothing left to schedule: COMPLETED.
    assert body["name"] == "hello" and body["runner"] == "sleep" and body["status"] == "COMPLETED"
    assert body["config"] == {"duration": "2s"}
    assert body["interval"] is None and body["timeout"] == 1200.0
    task = Task.objects.get(pk=body["id"])
    assert task.owner == user
    (execution,) = Execution.objects.filter(task=task)
    assert execution.status == S.SCHEDULED and execution.origin == ExecutionOrigin.SCHEDULE


def test_create_recurring_task_with_duration_strings(api_client):
    start = timezone.now() + timedelta(hours=1)
    response = api_client.post(
        URL,
        {
            "runner": "noop",
            "start_at": _iso(start),
            "interval": "1h30m",
            "retry_backoff": "250ms",
            "end_at": _iso(start + timedelta(days=1)),
        },
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["interval"] == 5400.0 and body["retry_backoff"] == 0.25
    assert body["next_run_at"] is not None


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"runner": "warp-drive"}, "runner"),  # unknown runner
        ({"runner": "sleep", "config": {}}, "config"),  # bad runner config: duration missing
        ({"runner": "sleep", "config": {"duration": "soon"}}, "config"),
        ({"runner": "sleep", "config": {"duration": "1s", "colour": "red"}}, "config"),
        ({"runner": "noop", "config": {"anything": 1}}, "config"),
        ({"runner": "noop", "config": "not an object"}, "config"),
        ({"runner": "noop", "interval": "soon"}, "interval"),  # bad duration string
        ({"runner": "noop", "interval": "50ms"}, "interval"),  # too short
        ({"runner": "noop", "interval": -5}, "interval"),
        ({"runner": "noop", "timeout": "forever"}, "timeout"),
        ({"runner": "noop", "start_at": "2030-01-02T00:00:00Z", "end_at": "2030-01-01T00:00:00Z"}, "end_at"),
        ({"runner": "noop", "start_at": "tomorrow"}, "start_at"),
        ({"runner": "noop", "start_at": "0001-01-01T00:00:00Z"}, "start_at"),
        ({"runner": "noop", "flavour": "vanilla"}, "flavour"),  # unknown field
        ({"runner": "noop", "status": "PAUSED"}, "status"),
        ({"runner": "noop", "priority": 10}, "priority"),
        ({"runner": "noop", "priority": "high"}, "priority"),  # wrong type
        ({"runner": "noop", "max_attempts": 0}, "max_attempts"),
        ({"runner": "noop", "max_runs": 10**12}, "max_runs"),
        ({"runner": "noop", "retry_jitter": "maybe"}, "retry_jitter"),
        ({"runner": "noop", "interval": "5s", "cron": "* * * * *"}, "cron"),
        ({"runner": "noop", "cron": "every monday"}, "cron"),
        ({"runner": "noop", "timezone": "Mars/Olympus_Mons"}, "timezone"),
        ({"runner": "noop", "retry_backoff": "10s", "retry_backoff_max": "1s"}, "retry_backoff_max"),
        ({"runner": "noop", "misfire_policy": "panic"}, "misfire_policy"),
        ({"runner": "noop", "name": "x" * 201}, "name"),
        ({"runner": "noop", "name": "nul\x00byte"}, "name"),
        ({"runner": "sleep", "config": {"duration": "1s", "note\x00": "x"}}, "config"),
        ({}, "runner"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(api_client, payload, field):
    response = api_client.post(URL, payload)
    body = _assert_error(response, 400, "validation_error")
    assert field in body["errors"], body
    assert all(isinstance(message, str | dict | list) for message in body["errors"][field])
    assert Task.objects.count() == 0
    assert Execution.objects.count() == 0


def test_malformed_json_and_non_object_bodies_are_400s(api_client):
    response = api_client.generic("POST", URL, "{not json", content_type="application/json")
    _assert_error(response, 400, "parse_error")
    response = api_client.post(URL, ["runner", "noop"])
    body = _assert_error(response, 400, "validation_error")
    assert "non_field_errors" in body["errors"]
    assert Task.objects.count() == 0


def test_form_encoded_bodies_are_unsupported(api_client):
    response = api_client.post(URL, "runner=noop", content_type="application/x-www-form-urlencoded")
    _assert_error(response, 415, "unsupported_media_type")


def test_unauthenticated_requests_get_401_with_the_error_shape():
    response = APIClient().get(URL)
    _assert_error(response, 401, "not_authenticated")
    response = APIClient().post(URL, {"runner": "noop"}, HTTP_AUTHORIZATION="Token not-a-real-token")
    _assert_error(response, 401, "not_authenticated")


def test_put_is_not_allowed(api_client, user):
    task = TaskFactory(owner=user)
    response = api_client.put(f"{URL}/{task.pk}", {"runner": "noop"})
    _assert_error(response, 405, "method_not_allowed")


# --- Idempotency-Key -------------------------------------------------------------------------


def test_two_identical_posts_with_one_idempotency_key_create_one_task(api_client, user):
    payload = {"name": "once", "runner": "sleep", "config": {"duration": "1s"}}
    first = api_client.post(URL, payload, HTTP_IDEMPOTENCY_KEY="key-123")
    second = api_client.post(URL, payload, HTTP_IDEMPOTENCY_KEY="key-123")
    assert first.status_code == second.status_code == 201
    assert second.json() == first.json()
    assert "Idempotent-Replayed" not in first.headers
    assert second.headers["Idempotent-Replayed"] == "true"
    assert Task.objects.filter(owner=user).count() == 1
    assert Execution.objects.count() == 1


def test_same_idempotency_key_with_another_body_is_a_422_and_creates_nothing(api_client):
    api_client.post(URL, {"runner": "noop"}, HTTP_IDEMPOTENCY_KEY="key-1")
    response = api_client.post(URL, {"runner": "noop", "name": "other"}, HTTP_IDEMPOTENCY_KEY="key-1")
    _assert_error(response, 422, "idempotency_key_reused")
    assert Task.objects.count() == 1


def test_idempotency_keys_are_per_user(api_client, other_client):
    a = api_client.post(URL, {"runner": "noop"}, HTTP_IDEMPOTENCY_KEY="shared")
    b = other_client.post(URL, {"runner": "noop"}, HTTP_IDEMPOTENCY_KEY="shared")
    assert a.status_code == b.status_code == 201
    assert a.json()["id"] != b.json()["id"]


def test_a_failed_request_does_not_use_up_its_idempotency_key(api_client):
    bad = api_client.post(URL, {"runner": "warp-drive"}, HTTP_IDEMPOTENCY_KEY="k")
    assert bad.status_code == 400
    good = api_client.post(URL, {"runner": "noop"}, HTTP_IDEMPOTENCY_KEY="k")
    assert good.status_code == 201


def test_an_expired_idempotency_key_is_forgotten(api_client, settings):
    from tasks_app.models import ApiIdempotencyKey

    api_client.post(URL, {"runner": "noop"}, HTTP_IDEMPOTENCY_KEY="old")
    ApiIdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=25))
    response = api_client.post(URL, {"runner": "noop"}, HTTP_IDEMPOTENCY_KEY="old")
    assert response.status_code == 201 and "Idempotent-Replayed" not in response.headers
    assert Task.objects.count() == 2


def test_expiry_job_deletes_old_keys_only(api_client):
    from tasks_app.models import ApiIdempotencyKey
    from tasks_app.tasks import expire_idempotency_keys

    api_client.post(URL, {"runner": "noop"}, HTTP_IDEMPOTENCY_KEY="old")
    api_client.post(URL, {"runner": "noop"}, HTTP_IDEMPOTENCY_KEY="new")
    ApiIdempotencyKey.objects.filter(key="old").update(created_at=timezone.now() - timedelta(days=2))
    assert expire_idempotency_keys() == 1
    assert list(ApiIdempotencyKey.objects.values_list("key", flat=True)) == ["new"]


@pytest.mark.parametrize("key", ["", "x" * 256, "naïve", "tab\there"])
def test_malformed_idempotency_keys_are_400s(api_client, key):
    response = api_client.post(URL, {"runner": "noop"}, HTTP_IDEMPOTENCY_KEY=key)
    body = _assert_error(response, 400, "validation_error")
    assert "Idempotency-Key" in body["errors"]
    assert Task.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_posts_with_one_idempotency_key_create_one_task(user):
    """Eight clients race with the same key: the unique index makes all but one wait, then replay."""
    import threading

    from django.db import connection

    from tests.conftest import client_for

    barrier = threading.Barrier(8)
    results: list[tuple[int, str, str | None]] = []

    def post() -> None:
        try:
            client = client_for(user)
            barrier.wait()
            response = client.post(URL, {"runner": "noop", "name": "race"}, HTTP_IDEMPOTENCY_KEY="race-key")
            results.append((response.status_code, response.json()["id"], response.headers.get("Idempotent-Replayed")))
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 8
    assert {status for status, _, _ in results} == {201}
    assert len({task_id for _, task_id, _ in results}) == 1
    assert sorted(replayed or "" for _, _, replayed in results) == [""] + ["true"] * 7
    assert Task.objects.count() == 1
    assert Execution.objects.count() == 1


# --- list and get ----------------------------------------------------------------------------


def test_list_is_paginated_filtered_searched_and_ordered(api_client, user, other_user):
    TaskFactory(owner=user, name="alpha report", runner="noop", priority=1)
    TaskFactory(owner=user, name="beta report", runner="sleep", config={"duration": "1s"}, priority=9)
    TaskFactory(owner=user, name="gamma", runner="noop", status=TaskStatus.PAUSED, priority=5)
    TaskFactory(owner=user, name="deleted report", status=TaskStatus.DELETED)
    TaskFactory(owner=other_user, name="other's report")

    body = api_client.get(URL).json()
    assert set(body) == {"next", "previous", "results"} and len(body["results"]) == 3
    assert [t["name"] for t in body["results"]] == ["gamma", "beta report", "alpha report"]  # newest first

    def names(query: str) -> list[str]:
        response = api_client.get(f"{URL}?{query}")
        assert response.status_code == 200, response.content
        return [t["name"] for t in response.json()["results"]]

    assert names("status=PAUSED") == ["gamma"]
    assert names("runner=sleep") == ["beta report"]
    assert names("search=report&ordering=name") == ["alpha report", "beta report"]
    assert names("ordering=-priority") == ["beta report", "gamma", "alpha report"]
    first = api_client.get(f"{URL}?limit=1&ordering=name").json()
    assert [t["name"] for t in first["results"]] == ["alpha report"] and first["previous"] is None
    second = api_client.get(first["next"]).json()
    assert [t["name"] for t in second["results"]] == ["beta report"]
    assert api_client.get(f"{URL}?offset=1").status_code == 400  # paged by cursor: follow the links


@pytest.mark.parametrize("query", ["status=DELETED", "status=nope", "limit=-1&status=x"])
def test_bad_list_filters_are_400s(api_client, query):
    _assert_error(api_client.get(f"{URL}?{query}"), 400, "validation_error")


def test_nul_characters_in_query_parameters_are_400s(api_client):
    body = _assert_error(api_client.get(URL, {"search": "a\x00b"}), 400, "validation_error")
    assert "search" in body["errors"]


def test_get_a_task(api_client, user):
    task = TaskFactory(owner=user, name="mine")
    response = api_client.get(f"{URL}/{task.pk}")
    assert response.status_code == 200 and response.json()["name"] == "mine"
    assert api_client.get(f"{URL}/{task.pk}/").status_code == 200  # the trailing slash is optional


@pytest.mark.parametrize("task_id", ["not-a-uuid", "00000000-0000-0000-0000-000000000000", "%00"])
def test_unknown_task_ids_are_404s_with_the_error_shape(api_client, task_id):
    _assert_error(api_client.get(f"{URL}/{task_id}"), 404, "not_found")


# --- partial update --------------------------------------------------------------------------


def _create(user, **fields) -> Task:
    return task_create(owner=user, **{"runner": "noop", **fields})


def test_patch_changes_plain_fields_without_touching_executions(api_client, user):
    task = _create(user, name="before", interval=timedelta(minutes=1))
    before = list(Execution.objects.filter(task=task).values_list("pk", "status"))
    response = api_client.patch(f"{URL}/{task.pk}", {"name": "after", "max_attempts": 7, "timeout": "2m"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["name"], body["max_attempts"], body["timeout"]) == ("after", 7, 120.0)
    assert list(Execution.objects.filter(task=task).values_list("pk", "status")) == before


def test_patch_of_the_interval_replaces_future_executions_and_keeps_history(api_client, user):
    start = timezone.now() + timedelta(seconds=5)
    task = _create(user, start_at=start, interval=timedelta(seconds=20))
    old = list(Execution.objects.filter(task=task).order_by("scheduled_for"))
    assert len(old) == 3  # horizon 60 s: +5, +25, +45
    finished = ExecutionFactory(task=task, scheduled_for=start - timedelta(minutes=5), status=S.SUCCEEDED)

    response = api_client.patch(f"{URL}/{task.pk}", {"interval": "30s"})
    assert response.status_code == 200, response.content

    for execution in old:
        execution.refresh_from_db()
        assert execution.status == S.CANCELLED and execution.superseded
        last = execution.events.last()
        assert (last.from_status, last.to_status, last.detail) == (
            S.SCHEDULED,
            S.CANCELLED,
            "replaced: the task's schedule changed",
        )
    new = list(Execution.objects.filter(task=task, status=S.SCHEDULED).order_by("scheduled_for"))
    assert [e.scheduled_for - start for e in new] == [timedelta(0), timedelta(seconds=30)]
    finished.refresh_from_db()
    assert finished.status == S.SUCCEEDED  # history kept
    task.refresh_from_db()
    assert task.interval == timedelta(seconds=30) and task.next_run_at == start + timedelta(seconds=60)


def test_patch_of_the_config_runs_the_same_occurrences_again_as_new_executions(api_client, user):
    start = timezone.now() + timedelta(seconds=30)
    task = _create(user, runner="sleep", config={"duration": "1s"}, start_at=start)
    (old,) = Execution.objects.filter(task=task)
    response = api_client.patch(f"{URL}/{task.pk}", {"config": {"duration": "2s"}})
    assert response.status_code == 200, response.content
    old.refresh_from_db()
    assert old.status == S.CANCELLED and old.error == "replaced: the task's config changed"
    (new,) = Execution.objects.filter(task=task, status=S.SCHEDULED)
    assert new.pk != old.pk and new.scheduled_for == old.scheduled_for == start
    task.refresh_from_db()
    assert task.config == {"duration": "2s"} and task.status == TaskStatus.COMPLETED
    assert task.runs_materialised == 1


def test_patch_leaves_running_executions_and_pending_retries_alone(api_client, user):
    task = _create(user, start_at=timezone.now() + timedelta(hours=1), interval=timedelta(hours=1))
    running = ExecutionFactory(task=task, status=S.RUNNING, started_at=timezone.now(), lease_owner="w:1:1")
    retry = ExecutionFactory(task=task, status=S.SCHEDULED, attempt=2, started_at=timezone.now())
    triggered = ExecutionFactory(task=task, status=S.SCHEDULED, origin=ExecutionOrigin.TRIGGER)
    response = api_client.patch(f"{URL}/{task.pk}", {"interval": "2h", "priority": 9})
    assert response.status_code == 200
    for execution, status in ((running, S.RUNNING), (retry, S.SCHEDULED), (triggered, S.SCHEDULED)):
        execution.refresh_from_db()
        assert execution.status == status


def test_patch_can_restart_a_completed_one_shot_task_at_a_new_time(api_client, user):
    task = _create(user, start_at=timezone.now() - timedelta(minutes=10))
    Execution.objects.filter(task=task).update(status=S.SUCCEEDED)
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED
    later = timezone.now() + timedelta(seconds=20)
    response = api_client.patch(f"{URL}/{task.pk}", {"start_at": _iso(later)})
    assert response.status_code == 200, response.content
    assert Execution.objects.filter(task=task, status=S.SCHEDULED, scheduled_for=later).exists()


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"end_at": "2000-01-01T00:00:00Z"}, "end_at"),  # before the existing start_at
        ({"cron": "*/5 * * * *"}, "cron"),  # the task already has an interval
        ({"runner": "sleep"}, "config"),  # the existing config does not fit the new runner
        ({"runner": "warp-drive"}, "runner"),
        ({"retry_backoff": "1h"}, "retry_backoff_max"),
        ({"status": "PAUSED"}, "status"),  # read-only: use the actions
        ({"id": "00000000-0000-0000-0000-000000000000"}, "id"),
        ({"start_at": None}, "start_at"),
        ({"interval": "often"}, "interval"),
        ({"owner": 1}, "owner"),
    ],
)
def test_bad_patches_are_400s_and_change_nothing(api_client, user, payload, field):
    task = _create(user, start_at=timezone.now() + timedelta(hours=1), interval=timedelta(minutes=5))
    executions = list(Execution.objects.filter(task=task).values_list("pk", "status"))
    before = Task.objects.filter(pk=task.pk).values().get()
    body = _assert_error(api_client.patch(f"{URL}/{task.pk}", payload), 400, "validation_error")
    assert field in body["errors"], body
    assert Task.objects.filter(pk=task.pk).values().get() == before
    assert list(Execution.objects.filter(task=task).values_list("pk", "status")) == executions


# --- delete ----------------------------------------------------------------------------------


def test_delete_cancels_scheduled_pending_and_running_and_stops_the_external_run(api_client, user, test_runners):
    task = TaskFactory(owner=user, runner="cancellable")
    scheduled = ExecutionFactory(task=task)
    pending = ExecutionFactory(task=task, status=S.PENDING)
    running = ExecutionFactory(
        task=task, status=S.RUNNING, external_run_id="ext-1", run_handle={"job": "j1"}, started_at=timezone.now()
    )
    done = ExecutionFactory(task=task, status=S.SUCCEEDED)

    response = api_client.delete(f"{URL}/{task.pk}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"] == str(task.pk) and body["status"] == "DELETED"
    by_id = {item["execution"]: item for item in body["executions"]}
    assert set(by_id) == {scheduled.pk, pending.pk, running.pk}
    assert by_id[scheduled.pk]["from_status"] == "SCHEDULED" and by_id[scheduled.pk]["external_run"] == "none"
    assert by_id[pending.pk]["from_status"] == "PENDING"
    assert by_id[running.pk]["from_status"] == "RUNNING" and by_id[running.pk]["external_run"] == "stopped"
    assert all(item["status"] == "CANCELLED" for item in body["executions"])
    assert test_runners.CANCELLED == [("cancellable", "ext-1", {"job": "j1"})]

    for execution in (scheduled, pending, running):
        execution.refresh_from_db()
        assert execution.status == S.CANCELLED and execution.error == "task deleted"
    done.refresh_from_db()
    assert done.status == S.SUCCEEDED
    task.refresh_from_db()
    assert task.status == TaskStatus.DELETED and task.next_run_at is None

    # Gone from the task API; its history stays readable.
    _assert_error(api_client.get(f"{URL}/{task.pk}"), 404, "not_found")
    _assert_error(api_client.delete(f"{URL}/{task.pk}"), 404, "not_found")
    assert api_client.get(URL).json()["results"] == []
    assert len(api_client.get(f"/api/v1/executions?task={task.pk}").json()["results"]) == 4


@pytest.mark.parametrize(
    ("runner", "external_run_id", "outcome"),
    [
        ("uncancellable", "ext-1", "unsupported"),
        ("broken-cancel", "ext-1", "failed"),
        ("cancellable", "", "discarded"),  # claimed, but no external run recorded yet
    ],
)
def test_delete_answers_202_when_an_external_run_may_go_on(
    api_client, user, test_runners, runner, external_run_id, outcome
):
    task = TaskFactory(owner=user, runner=runner)
    ExecutionFactory(task=task, status=S.RUNNING, external_run_id=external_run_id, started_at=timezone.now())
    response = api_client.delete(f"{URL}/{task.pk}")
    assert response.status_code == 202, response.content
    (item,) = response.json()["executions"]
    assert item["external_run"] == outcome and item["status"] == "CANCELLED" and item["detail"]


def test_deleted_task_cannot_be_triggered_updated_or_paused(api_client, user):
    task = TaskFactory(owner=user, status=TaskStatus.DELETED)
    for method, path in [
        ("post", "trigger"),
        ("post", "pause"),
        ("post", "resume"),
        ("patch", ""),
        ("get", "executions"),
    ]:
        response = getattr(api_client, method)(f"{URL}/{task.pk}/{path}".rstrip("/"), {})
        _assert_error(response, 404, "not_found")
    assert not Execution.objects.exists()


# --- pause, resume, trigger ------------------------------------------------------------------


def test_pause_cancels_unpublished_executions_and_resume_creates_them_again(api_client, user):
    start = timezone.now() + timedelta(seconds=10)
    task = _create(user, start_at=start, interval=timedelta(seconds=20))
    scheduled = list(Execution.objects.filter(task=task).order_by("scheduled_for"))
    pending = scheduled[0]
    Execution.objects.filter(pk=pending.pk).update(status=S.PENDING)

    response = api_client.post(f"{URL}/{task.pk}/pause")
    assert response.status_code == 200 and response.json()["status"] == "PAUSED"
    for execution in scheduled[1:]:
        execution.refresh_from_db()
        assert execution.status == S.CANCELLED and execution.error == "paused"
    pending.refresh_from_db()
    assert pending.status == S.PENDING  # already published: it runs
    assert api_client.post(f"{URL}/{task.pk}/pause").json()["status"] == "PAUSED"  # idempotent

    from executions.materialiser import materialise_due

    materialise_due()
    assert not Execution.objects.filter(task=task, status=S.SCHEDULED).exists()  # paused: nothing new

    response = api_client.post(f"{URL}/{task.pk}/resume")
    assert response.status_code == 200 and response.json()["status"] == "ACTIVE"
    again = list(Execution.objects.filter(task=task, status=S.SCHEDULED).order_by("scheduled_for"))
    assert [e.scheduled_for for e in again] == [e.scheduled_for for e in scheduled[1:]]
    assert api_client.post(f"{URL}/{task.pk}/resume").json()["status"] == "ACTIVE"  # idempotent


@pytest.mark.parametrize(("policy", "runs"), [("skip", 0), ("run_once", 1), ("run_all", 3)])
def test_resume_applies_the_misfire_policy_to_runs_missed_while_paused(api_client, user, policy, runs):
    start = timezone.now() + timedelta(seconds=30)
    task = _create(user, start_at=start, interval=timedelta(minutes=10), misfire_policy=policy)
    api_client.post(f"{URL}/{task.pk}/pause")
    # Time passes: the task was due 3 times (31, 21 and 11 minutes ago), and again 30 s ago (not a miss).
    shift = timedelta(minutes=31)
    Task.objects.filter(pk=task.pk).update(start_at=start - shift, next_run_at=start - shift)
    Execution.objects.filter(task=task).update(scheduled_for=start - timedelta(hours=5))
    api_client.post(f"{URL}/{task.pk}/resume")
    now = timezone.now()
    created = Execution.objects.filter(task=task, status=S.SCHEDULED)
    assert created.filter(scheduled_for__lt=now - timedelta(minutes=1)).count() == runs
    assert created.filter(scheduled_for__gte=now - timedelta(minutes=1)).count() == 1


def test_trigger_runs_the_task_now_outside_its_schedule(api_client, user):
    task = _create(user, start_at=timezone.now() + timedelta(days=1))
    before = timezone.now()
    response = api_client.post(f"{URL}/{task.pk}/trigger")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "SCHEDULED" and body["origin"] == "trigger" and body["attempt"] == 1
    assert response.headers["Location"] == f"/api/v1/executions/{body['id']}"
    assert [e["to_status"] for e in body["events"]] == ["SCHEDULED"]
    execution = Execution.objects.get(pk=body["id"])
    assert before - timedelta(seconds=5) < execution.scheduled_for <= timezone.now()
    assert execution.due_at == execution.scheduled_for
    # Twice is two runs; a paused task can be run by hand too.
    api_client.post(f"{URL}/{task.pk}/pause")
    assert api_client.post(f"{URL}/{task.pk}/trigger").status_code == 201
    assert Execution.objects.filter(task=task, origin=ExecutionOrigin.TRIGGER).count() == 2


# --- materialise and the nested execution list ------------------------------------------------


def test_materialise_up_to_returns_the_ids_created_and_is_idempotent(api_client, user):
    start = timezone.now() + timedelta(hours=1)
    task = _create(user, start_at=start, interval=timedelta(minutes=10))
    until = start + timedelta(minutes=25)
    response = api_client.post(f"{URL}/{task.pk}/materialise", {"until": _iso(until)})
    assert response.status_code == 200, response.content
    body = response.json()
    executions = list(Execution.objects.filter(task=task).order_by("scheduled_for"))
    assert body["execution_ids"] == [e.pk for e in executions]
    assert [e.scheduled_for - start for e in executions] == [timedelta(minutes=m) for m in (0, 10, 20)]
    again = api_client.post(f"{URL}/{task.pk}/materialise", {"until": _iso(until)})
    assert again.json()["execution_ids"] == []


def test_materialise_refuses_too_far_or_too_many_and_paused_tasks(api_client, user):
    task = _create(user, start_at=timezone.now() + timedelta(hours=1), interval=timedelta(seconds=1))
    url = f"{URL}/{task.pk}/materialise"
    far = timezone.now() + timedelta(days=30)
    body = _assert_error(api_client.post(url, {"until": _iso(far)}), 400, "validation_error")
    assert "until" in body["errors"]
    many = timezone.now() + timedelta(days=1)
    body = _assert_error(api_client.post(url, {"until": _iso(many)}), 400, "validation_error")
    assert "1000" in body["errors"]["until"][0]
    _assert_error(api_client.post(f"{URL}/{task.pk}/materialise", {}), 400, "validation_error")
    api_client.post(f"{URL}/{task.pk}/pause")
    soon = timezone.now() + timedelta(hours=2)
    _assert_error(api_client.post(f"{URL}/{task.pk}/materialise", {"until": _iso(soon)}), 409, "conflict")
    assert Execution.objects.filter(task=task, status=S.SCHEDULED).count() == 0


def test_task_executions_lists_one_tasks_executions_newest_first(api_client, user):
    task, other = TaskFactory(owner=user), TaskFactory(owner=user)
    now = timezone.now()
    old = ExecutionFactory(task=task, scheduled_for=now - timedelta(hours=1), status=S.FAILED)
    new = ExecutionFactory(task=task, scheduled_for=now)
    ExecutionFactory(task=other)
    body = api_client.get(f"{URL}/{task.pk}/executions").json()
    assert [e["id"] for e in body["results"]] == [new.pk, old.pk]
    body = api_client.get(f"{URL}/{task.pk}/executions?status=FAILED").json()
    assert [e["id"] for e in body["results"]] == [old.pk]


def test_event_trail_names_the_user(api_client, user):
    task = _create(user, start_at=timezone.now() + timedelta(seconds=30))
    api_client.post(f"{URL}/{task.pk}/pause")
    assert ExecutionEvent.objects.filter(to_status=S.CANCELLED, actor="user:alice").count() == 1


# --- throttling ------------------------------------------------------------------------------


def test_requests_over_the_rate_get_429_with_the_error_shape(api_client, monkeypatch):
    from django.core.cache import cache
    from rest_framework.throttling import UserRateThrottle

    cache.clear()
    monkeypatch.setattr(UserRateThrottle, "THROTTLE_RATES", {"user": "3/minute", "anon": "3/minute"})
    statuses = [api_client.get(URL).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    response = api_client.get(URL)
    _assert_error(response, 429, "throttled")
    assert int(response.headers["Retry-After"]) > 0
    cache.clear()
