"""Named events (issue 48 item 5): ``POST /api/v1/events/{name}`` starts every subscribed task of
the caller's teams once, debounced by a key of the payload; the ``wait_event`` step (item 4) ends
on a matching event or on its timeout."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from executions import transitions, worker_services
from executions.models import EventRun, Execution, ExecutionOrigin, ExecutionStatus, ReceivedEvent
from executions.retention import retention_prune
from tasks_api.creation import task_create
from tasks_api.events import event_post
from tasks_api.triggers import task_trigger
from tasks_app.models import TaskStatus
from tasks_app.teams.services import member_set, personal_team_of, team_create
from tests.conftest import client_for
from tms_core.clock import db_now

pytestmark = pytest.mark.django_db


def _task(client, **fields) -> str:
    body = {"runner": "noop", "start_at": (timezone.now() + timedelta(days=1)).isoformat(), **fields}
    response = client.post("/api/v1/tasks", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _runs(task_id: str):
    return Execution.objects.filter(task_id=task_id, origin=ExecutionOrigin.TRIGGER)


def test_an_event_starts_each_subscribed_task_once_with_the_payload_as_input(api_client):
    first = _task(api_client, name="mail", on_events=["order.paid"])
    second = _task(api_client, name="ship", on_events=[{"name": "order.paid"}, "order.refunded"])
    other = _task(api_client, name="other", on_events=["order.refunded"])
    _task(api_client, name="none")

    response = api_client.post("/api/v1/events/order.paid", {"order": 7}, format="json")

    assert response.status_code == 202, response.content
    body = response.json()
    assert body["name"] == "order.paid" and len(body["events"]) == 1
    assert [(row["task_name"], row["outcome"]) for row in body["tasks"]] == [("mail", "created"), ("ship", "created")]
    for task in (first, second):
        run = _runs(task).get()
        assert run.input == {"order": 7} and run.status == ExecutionStatus.SCHEDULED
    assert not _runs(other).exists()
    event = ReceivedEvent.objects.get()
    assert event.payload == {"order": 7} and event.name == "order.paid"
    assert EventRun.objects.filter(event=event).count() == 2
    shown = api_client.get(f"/api/v1/tasks/{second}").json()["on_events"]
    assert shown == [
        {"name": "order.paid", "debounce": None, "debounce_key": "", "debounce_max_wait": None},
        {"name": "order.refunded", "debounce": None, "debounce_key": "", "debounce_max_wait": None},
    ]


def test_an_event_reaches_only_the_callers_teams_and_active_tasks(api_client, other_client, user, other_user):
    mine = _task(api_client, on_events=["deploy"])
    paused = _task(api_client, on_events=["deploy"])
    api_client.post(f"/api/v1/tasks/{paused}/pause")
    team = team_create(creator=other_user, name="Shop")
    theirs = _task(other_client, team=team.slug, on_events=["deploy"])

    assert api_client.post("/api/v1/events/deploy", {}, format="json").status_code == 202

    assert _runs(mine).count() == 1
    assert not _runs(paused).exists() and not _runs(theirs).exists()
    # A viewer of bob's team may not post there; as an operator, ?team= narrows it to that team.
    member_set(team=team, username=user.username, role="viewer")
    refused = api_client.post(f"/api/v1/events/deploy?team={team.slug}", {}, format="json")
    assert refused.status_code == 403 and not _runs(theirs).exists()
    member_set(team=team, username=user.username, role="operator")
    assert api_client.post(f"/api/v1/events/deploy?team={team.slug}", {}, format="json").status_code == 202
    assert _runs(theirs).count() == 1 and _runs(mine).count() == 1


def test_a_task_that_refuses_the_payload_does_not_stop_the_others(api_client):
    strict = _task(api_client, name="strict", on_events=["signup"], input_schema={"required": ["email"]})
    lenient = _task(api_client, name="lenient", on_events=["signup"])

    response = api_client.post("/api/v1/events/signup", {"name": "x"}, format="json")

    assert response.status_code == 202
    rows = {row["task_name"]: row for row in response.json()["tasks"]}
    assert rows["strict"]["outcome"] == "refused" and rows["strict"]["execution"] is None
    assert "input" in rows["strict"]["errors"]
    assert rows["lenient"]["outcome"] == "created"
    assert not _runs(strict).exists() and _runs(lenient).count() == 1


def test_an_event_sent_again_with_its_idempotency_key_starts_nothing(api_client):
    task = _task(api_client, on_events=["invoice"])
    headers = {"HTTP_IDEMPOTENCY_KEY": "invoice-41"}

    first = api_client.post("/api/v1/events/invoice", {"n": 41}, format="json", **headers)
    again = api_client.post("/api/v1/events/invoice", {"n": 41}, format="json", **headers)
    other_body = api_client.post("/api/v1/events/invoice", {"n": 42}, format="json", **headers)

    assert first.status_code == again.status_code == 202 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert other_body.status_code == 422
    assert _runs(task).count() == 1 and ReceivedEvent.objects.get().key == "invoice-41"


def test_bad_names_payloads_and_subscriptions_are_400_per_field(api_client):
    assert api_client.post("/api/v1/events/.bad", {}, format="json").status_code == 400
    assert "payload" in api_client.post("/api/v1/events/ok", [1, 2], format="json").json()["errors"]
    response = api_client.post(
        "/api/v1/tasks",
        {
            "runner": "noop",
            "on_events": [
                "fine",
                {"name": "a b"},
                {"name": "x", "debounce_key": "$.customer"},
                {"name": "y", "debounce": 5, "debounce_key": "$.a b"},
                {"name": "z", "extra": 1},
                "fine",
            ],
        },
        format="json",
    )
    assert response.status_code == 400
    errors = response.json()["errors"]["on_events"]
    assert set(errors) == {"1", "2", "3", "4", "5"}, errors
    assert "debounce" in errors["2"] and "debounce_key" in errors["3"] and "extra" in errors["4"]


def _debounced(client) -> str:
    return _task(
        client,
        on_events=[{"name": "cart", "debounce": 60, "debounce_key": "$.customer", "debounce_max_wait": 300}],
    )


def test_debounce_restarts_the_window_per_key_and_keeps_the_last_payload(api_client):
    task = _debounced(api_client)

    first = api_client.post("/api/v1/events/cart", {"customer": 1, "items": 1}, format="json").json()
    run = _runs(task).get()
    assert first["tasks"][0]["outcome"] == "created"
    assert abs((run.due_at - db_now()).total_seconds() - 60) < 5
    # Later in the window (moved back 40 s instead of waiting): the next event restarts it.
    Execution.objects.filter(pk=run.pk).update(due_at=F("due_at") - timedelta(seconds=40))
    second = api_client.post("/api/v1/events/cart", {"customer": 1, "items": 2}, format="json").json()
    other_key = api_client.post("/api/v1/events/cart", {"customer": 2, "items": 9}, format="json").json()

    assert second["tasks"][0]["outcome"] == "joined" and second["tasks"][0]["execution"] == run.pk
    assert other_key["tasks"][0]["outcome"] == "created"
    run.refresh_from_db()
    assert abs((run.due_at - db_now()).total_seconds() - 60) < 5
    assert run.input == {"customer": 1, "items": 2}
    assert _runs(task).count() == 2


def test_debounce_never_waits_past_the_max_wait_and_a_taken_run_starts_a_new_window(api_client):
    task = _debounced(api_client)
    api_client.post("/api/v1/events/cart", {"customer": 1}, format="json")
    run = _runs(task).get()
    # Its first event came 280 s ago: the window would end at +60 s, the max wait ends at +20 s.
    Execution.objects.filter(pk=run.pk).update(created_at=F("created_at") - timedelta(seconds=280))

    api_client.post("/api/v1/events/cart", {"customer": 1}, format="json")

    run.refresh_from_db()
    assert abs((run.due_at - (run.created_at + timedelta(seconds=300))).total_seconds()) < 1
    # The monitor takes it: the next event of the key is a new run, a new window.
    Execution.objects.filter(pk=run.pk).update(status=ExecutionStatus.PENDING)
    after = api_client.post("/api/v1/events/cart", {"customer": 1}, format="json").json()
    assert after["tasks"][0]["outcome"] == "created" and after["tasks"][0]["execution"] != run.pk
    assert _runs(task).count() == 2


def test_the_debounce_join_loses_to_a_run_already_due():
    assert not transitions.execution_debounce_event(
        execution_id=0, run_input={}, window=timedelta(seconds=5), max_wait=None
    )


def _waiting_step(user, *, on_timeout: str = "fail", timeout: int = 3600) -> Execution:
    """A ``wait_event`` run started by a worker: RUNNING, polled, holding no worker."""
    task = task_create(
        owner=user,
        runner="wait_event",
        config={"event": "order.paid", "input_path": "$.order", "event_path": "$.id", "on_timeout": on_timeout},
        timeout=timedelta(seconds=timeout),
        start_at=timezone.now() + timedelta(days=1),
    )
    task_trigger(task=task, actor="test", run_input={"order": 7})
    (dispatch,) = transitions.executions_take_due(limit=10, actor="monitor")
    outcome = worker_services.execution_run(execution_id=dispatch.execution_id, attempt=1, worker_id="worker-1")
    assert outcome == "polling"
    execution = Execution.objects.get(pk=dispatch.execution_id)
    assert execution.status == ExecutionStatus.RUNNING and execution.lease_owner == ""
    assert execution.run_handle == {"wait_event": "order.paid"}
    return execution


def test_wait_event_ends_with_the_matching_events_payload_and_is_nudged(user):
    execution = _waiting_step(user)
    Execution.objects.filter(pk=execution.pk).update(next_poll_at=timezone.now() + timedelta(minutes=5))
    team = personal_team_of(user)

    unrelated = event_post(team_ids=[team.pk], name="order.paid", payload={"id": 8}, actor="test")
    assert unrelated.nudged == 1
    assert worker_services.execution_resume(execution_id=execution.pk, attempt=1, worker_id="w2") == "polling"
    Execution.objects.filter(pk=execution.pk).update(next_poll_at=timezone.now() + timedelta(minutes=5))

    posted = event_post(team_ids=[team.pk], name="order.paid", payload={"id": 7, "total": 12.5}, actor="test")

    execution.refresh_from_db()
    assert posted.nudged == 1 and execution.next_poll_at <= db_now()
    assert worker_services.execution_resume(execution_id=execution.pk, attempt=1, worker_id="w2") == "finished"
    execution.refresh_from_db()
    assert execution.status == ExecutionStatus.SUCCEEDED
    assert json.loads(execution.output) == {"id": 7, "total": 12.5}


def test_wait_event_ignores_other_teams_and_earlier_events(user, other_user):
    ReceivedEvent.objects.create(name="order.paid", team_id=personal_team_of(user).pk, payload={"id": 7})
    ReceivedEvent.objects.filter().update(received_at=timezone.now() - timedelta(hours=1))
    execution = _waiting_step(user)
    event_post(team_ids=[personal_team_of(other_user).pk], name="order.paid", payload={"id": 7}, actor="test")

    assert worker_services.execution_resume(execution_id=execution.pk, attempt=1, worker_id="w2") == "polling"


@pytest.mark.parametrize(("on_timeout", "status"), [("fail", "FAILED"), ("succeed", "SUCCEEDED")])
def test_wait_event_times_out_with_its_own_outcome(user, on_timeout, status):
    execution = _waiting_step(user, on_timeout=on_timeout, timeout=30)
    Execution.objects.filter(pk=execution.pk).update(started_at=F("started_at") - timedelta(seconds=30))

    assert worker_services.execution_resume(execution_id=execution.pk, attempt=1, worker_id="w2") == "finished"

    execution.refresh_from_db()
    assert execution.status == status and execution.attempt == 1
    if status == "SUCCEEDED":
        assert json.loads(execution.output) == {"timed_out": True}
    else:
        assert "no event 'order.paid' came within 30s" in execution.error


def test_wait_event_without_its_key_in_the_input_fails_at_its_poll(user):
    task = task_create(
        owner=user,
        runner="wait_event",
        config={"event": "order.paid", "input_path": "$.order"},
        start_at=timezone.now() + timedelta(days=1),
    )
    task_trigger(task=task, actor="test", run_input={"other": 1})
    (dispatch,) = transitions.executions_take_due(limit=10, actor="monitor")
    worker_services.execution_run(execution_id=dispatch.execution_id, attempt=1, worker_id="worker-1")

    worker_services.execution_resume(execution_id=dispatch.execution_id, attempt=1, worker_id="w2")

    execution = Execution.objects.get(pk=dispatch.execution_id)
    assert execution.status == ExecutionStatus.FAILED and "has no $.order" in execution.error
    assert task.status == TaskStatus.ACTIVE


def test_retention_prunes_events_older_than_keep_for(api_client):
    task = _task(api_client, on_events=["tick"])
    api_client.post("/api/v1/events/tick", {"n": 1}, format="json")
    api_client.post("/api/v1/events/tick", {"n": 2}, format="json")
    old = ReceivedEvent.objects.order_by("id").first()
    ReceivedEvent.objects.filter(pk=old.pk).update(received_at=timezone.now() - timedelta(days=31))

    report = retention_prune()

    assert report.received_events == 1
    assert list(ReceivedEvent.objects.values_list("payload", flat=True)) == [{"n": 2}]
    assert EventRun.objects.count() == 1 and _runs(task).count() == 2


def test_payloads_the_database_cannot_store_are_400_not_500(api_client):
    _task(api_client, on_events=["odd"])
    nul = api_client.post("/api/v1/events/odd", {"a": "x\u0000y"}, format="json")
    text = api_client.post("/api/v1/events/odd", "just text", content_type="text/plain")
    bad_team = api_client.post("/api/v1/events/odd?team=nope", {}, format="json")

    assert nul.status_code == 400 and "payload" in nul.json()["errors"]
    assert text.status_code in (400, 415)
    assert bad_team.status_code == 404
    assert not ReceivedEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_events_of_one_key_make_one_debounced_run(user):
    client = client_for(user)
    task = _debounced(client)
    barrier = threading.Barrier(10)
    outcomes: list[str] = []

    def post(n: int) -> None:
        try:
            mine = client_for(user)
            barrier.wait()
            response = mine.post("/api/v1/events/cart", {"customer": 1, "n": n}, format="json")
            outcomes.append(response.json()["tasks"][0]["outcome"])
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(n,)) for n in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert sorted(outcomes) == ["created"] + ["joined"] * 9
    assert _runs(task).count() == 1 and EventRun.objects.count() == 10


def test_a_patch_changes_the_subscriptions_and_is_versioned(api_client):
    task = _task(api_client, on_events=["a"])

    changed = api_client.patch(f"/api/v1/tasks/{task}", {"on_events": ["b"]}, format="json")
    api_client.post("/api/v1/events/a", {}, format="json")
    api_client.post("/api/v1/events/b", {}, format="json")

    assert changed.status_code == 200 and [item["name"] for item in changed.json()["on_events"]] == ["b"]
    assert _runs(task).count() == 1
    versions = api_client.get(f"/api/v1/tasks/{task}/versions").json()["results"]
    assert versions[0]["changed"] == ["on_events"]
    cleared = api_client.patch(f"/api/v1/tasks/{task}", {"on_events": []}, format="json")
    assert cleared.status_code == 200 and cleared.json()["on_events"] == []


def test_over_the_teams_quota_a_task_is_refused_and_the_event_still_recorded(api_client, settings):
    first = _task(api_client, name="first", on_events=["burst"])
    second = _task(api_client, name="second", on_events=["burst"])
    settings.TMS = {**settings.TMS, "QUOTA_EXECUTIONS_PER_HOUR": 1}

    body = api_client.post("/api/v1/events/burst", {}, format="json").json()

    assert [(row["task_name"], row["outcome"]) for row in body["tasks"]] == [
        ("first", "created"),
        ("second", "refused"),
    ]
    assert "quota" in body["tasks"][1]["errors"]["non_field_errors"][0].lower()
    assert _runs(first).count() == 1 and not _runs(second).exists() and ReceivedEvent.objects.count() == 1


@pytest.mark.django_db
def test_the_subscribers_of_an_event_are_read_through_their_index(user, settings):
    """``POST /api/v1/events/{name}`` reads a team's subscribers through the partial GIN index of
    the tasks that subscribe to anything, not by walking the team's every task."""
    from tasks_api.creation import task_bulk_create
    from tasks_api.events import subscribed_tasks
    from tasks_app.models import Task

    settings.TMS = {**settings.TMS, "QUOTA_MAX_TASKS": 0}  # no quota: a team of thousands of tasks
    task_bulk_create(
        owner=user, specs=[{"runner": "noop", "name": f"quiet {i}", "cron": "0 3 * * *"} for i in range(3000)]
    )
    (paid,) = task_bulk_create(
        owner=user, specs=[{"runner": "noop", "name": "paid", "cron": "0 3 * * *", "on_events": [{"name": "paid"}]}]
    )
    team = paid.team_id
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_app_task")
        # Bitmap scans only (what a GIN index gives): of the indexes the query could use, the
        # subscribers' is the one that reads only them (with plain index scans on, a small test
        # table is as cheap to walk by status).
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute("SET LOCAL enable_seqscan = off")
        query = (
            Task.objects.filter(team_id__in=[team], status="ACTIVE", on_events__contains=[{"name": "paid"}])
            .exclude(on_events=[])
            .order_by("created_at", "id")
        )
        sql, params = query.query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "task_on_events_idx" in plan, plan
    assert subscribed_tasks(team_ids=[team], name="paid") == [paid]
