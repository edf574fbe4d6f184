"""GET /api/v1/tasks/{id}/occurrences: a task's occurrence timeline over a window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from executions import transitions
from executions.materialiser import materialise_task, task_schedule
from executions.models import Execution, SkippedOccurrence
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_api.lifecycle import task_delete, task_pause
from tasks_api.triggers import task_trigger
from tasks_app.models import Task
from tests.factories import ExecutionFactory, TaskFactory

pytestmark = pytest.mark.django_db

MINUTE = timedelta(minutes=1)


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _url(task: Task) -> str:
    return f"/api/v1/tasks/{task.pk}/occurrences"


def _window(client, task: Task, start: datetime, end: datetime) -> dict:
    response = client.get(_url(task), {"from": _iso(start), "to": _iso(end)})
    assert response.status_code == 200, response.json()
    return response.json()


def _items(client, task: Task, start: datetime, end: datetime) -> list[dict]:
    return _window(client, task, start, end)["items"]


def _outage(user, *, minutes: int = 1500, policy: str = "skip") -> tuple[Task, datetime, datetime]:
    """An every-minute task whose scheduler was down since ``minutes`` ago, then materialised
    once: the latest 1000 misses are listed one by one, a summary row stands for the others."""
    now = timezone.now()
    start = now.replace(second=0, microsecond=0) - minutes * MINUTE
    task = TaskFactory(owner=user, start_at=start, next_run_at=start, interval=MINUTE, misfire_policy=policy)
    materialise_task(task_id=task.pk, until=now + 5 * MINUTE)
    task.refresh_from_db()
    return task, start, now


def _fire_times(task: Task, start: datetime, end: datetime) -> list[datetime]:
    times = []
    for when in task_schedule(task).fire_times(since=start):
        if when >= end:
            break
        times.append(when)
    return times


# --- what became of each fire time -----------------------------------------------------------


def test_past_fire_times_are_executed_or_skipped_future_ones_scheduled_or_upcoming(api_client, user):
    task, _, now = _outage(user)
    grace = Execution.objects.filter(task=task, scheduled_for__lte=now).order_by("scheduled_for").first()
    Execution.objects.filter(pk=grace.pk).update(status=S.SUCCEEDED, started_at=now, finished_at=now)
    start, end = now - 5 * MINUTE, task.next_run_at + 3 * MINUTE
    body = _window(api_client, task, start, end)
    assert (body["from"], body["to"], body["timezone"]) == (_iso(start), _iso(end), "UTC")
    items = body["items"]

    fire_times = [item["scheduled_for"] for item in items]
    expected = [_iso(when) for when in _fire_times(task, start, end)]
    assert fire_times == expected and all(item["fire_time"] for item in items)
    executions = {_iso(e.scheduled_for): e for e in Execution.objects.filter(task=task)}
    skipped = {_iso(s.scheduled_for): s for s in SkippedOccurrence.objects.filter(task=task)}
    for item in items:
        when = item["scheduled_for"]
        if when in skipped:
            assert (item["state"], item["skip"]["reason"], item["skip"]["recorded"]) == ("skipped", "missed", True)
            assert item["execution"] is None and "missed by more than its misfire grace of 60s" in item["reason"]
        elif when in executions:
            execution = executions[when]
            state = "executed" if execution.status == S.SUCCEEDED else "scheduled"
            assert (item["state"], item["execution"]["id"]) == (state, execution.pk)
            assert (item["execution"]["status"], item["execution"]["origin"]) == (execution.status, "schedule")
            assert item["skip"] is None
        else:
            assert item["scheduled_for"] >= _iso(task.next_run_at)
            assert (item["state"], item["execution"], item["skip"]) == ("upcoming", None, None)
    assert {item["state"] for item in items} == {"skipped", "executed", "scheduled", "upcoming"}
    assert [i["execution"]["id"] for i in items if i["state"] == "executed"] == [grace.pk]


def test_a_summary_row_stands_for_the_fire_times_it_does_not_list(api_client, user):
    task, start, _ = _outage(user)
    first_listed = (
        SkippedOccurrence.objects.filter(task=task, scheduled_for__gt=start).order_by("scheduled_for").first()
    ).scheduled_for
    assert start + 100 * MINUTE < first_listed < start + 600 * MINUTE
    items = _items(api_client, task, start, start + 600 * MINUTE)
    assert len(items) == 600
    assert all(item["state"] == "skipped" and item["skip"]["reason"] == "missed" for item in items)
    head, *covered = [item for item in items if item["scheduled_for"] < _iso(first_listed)]
    assert (head["scheduled_for"], head["skip"]["summary"], head["skip"]["row_scheduled_for"]) == (
        _iso(start),
        True,
        _iso(start),
    )
    assert covered and all(item["skip"]["summary"] for item in covered)
    assert {item["skip"]["row_scheduled_for"] for item in covered} == {_iso(start)}
    assert all("one of many recorded in one row" in item["reason"] for item in covered)
    listed = [item for item in items if item["scheduled_for"] >= _iso(first_listed)]
    assert listed and not any(item["skip"]["summary"] for item in listed)
    assert all(item["skip"]["row_scheduled_for"] == item["scheduled_for"] for item in listed)

    # A window that starts after the summary row still finds it; "why" says the same.
    later = _items(api_client, task, start + 50 * MINUTE, start + 60 * MINUTE)
    assert [item["skip"]["row_scheduled_for"] for item in later] == [_iso(start)] * 10
    why = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": _iso(start + 50 * MINUTE)}).json()
    assert (why["verdict"], why["skipped"]["scheduled_for"]) == ("skipped", _iso(start))


def test_each_skip_reason_is_shown_with_its_detail(api_client, user):
    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(minutes=5, seconds=30)
    once = TaskFactory(owner=user, start_at=start, next_run_at=start, interval=MINUTE, misfire_policy="run_once")
    paused = TaskFactory(
        owner=user,
        start_at=start,
        next_run_at=start,
        interval=MINUTE,
        misfire_policy="skip",
        paused_at=start + timedelta(minutes=2, seconds=1),
    )
    for task in (once, paused):
        materialise_task(task_id=task.pk, until=now)
    end = start + 5 * MINUTE

    def states(task: Task) -> list[tuple[str, str | None]]:
        return [(i["state"], i["skip"] and i["skip"]["reason"]) for i in _items(api_client, task, start, end)]

    assert states(once) == [("skipped", "coalesced")] * 4 + [("scheduled", None)]
    assert states(paused) == [("skipped", "missed")] * 3 + [("skipped", "paused")] * 2
    coalesced = _items(api_client, once, start, end)[0]
    assert coalesced["skip"]["detail"] == "misfire policy run_once: folded into one catch-up run"

    # Overlap: the previous run still runs when the next one is claimed.
    first = now.replace(second=0) - 3 * MINUTE
    overlap = TaskFactory(
        owner=user, start_at=first, next_run_at=first + 2 * MINUTE, interval=MINUTE, overlap_policy="skip"
    )
    running = ExecutionFactory(task=overlap, scheduled_for=first, status=S.RUNNING, started_at=now)
    waiting = ExecutionFactory(task=overlap, scheduled_for=first + MINUTE, status=S.PENDING, exclusive=True)
    claim = transitions.execution_claim_exclusive(execution_id=waiting.pk, attempt=1, worker_id="w1", lease_seconds=60)
    assert claim.outcome == "skipped"
    ran, skipped = _items(api_client, overlap, first, first + 2 * MINUTE)
    assert (ran["state"], ran["execution"]["id"], ran["execution"]["status"]) == ("executed", running.pk, "RUNNING")
    assert (skipped["state"], skipped["skip"]["reason"]) == ("skipped", "overlap")
    assert (skipped["execution"]["id"], skipped["execution"]["status"]) == (waiting.pk, "CANCELLED")
    assert "still running" in skipped["skip"]["detail"]


def test_a_fire_time_with_no_record_behind_the_scheduler_is_missing(api_client, user):
    now = timezone.now().replace(second=0, microsecond=0)
    start = now - 10 * MINUTE
    task = TaskFactory(owner=user, start_at=start, next_run_at=now - 3 * MINUTE, interval=MINUTE)
    items = _items(api_client, task, start, now)
    assert [item["state"] for item in items] == ["missing"] * 7 + ["upcoming"] * 3
    assert items[0]["reason"] == "No execution was created for this fire time and no reason was recorded."
    assert items[-1]["reason"] == "Not created yet: the materialiser has not reached it."


def test_a_missed_fire_time_that_was_backfilled_shows_its_run_and_the_recorded_skip(api_client, user):
    start = datetime(2025, 1, 1, tzinfo=UTC)
    task = task_create(owner=user, runner="noop", start_at=start, interval=timedelta(hours=1), misfire_policy="skip")
    assert SkippedOccurrence.objects.filter(task=task, scheduled_for=start).exists()  # the summary row
    body = {"start": _iso(start), "end": _iso(start + timedelta(hours=1))}
    ids = api_client.post(f"/api/v1/tasks/{task.pk}/backfill", body, format="json").json()["execution_ids"]
    first, second = _items(api_client, task, start, start + timedelta(hours=2))
    assert (first["state"], first["execution"]["id"], first["skip"]["reason"]) == ("scheduled", ids[0], "missed")
    assert first["skip"]["summary"] is True
    assert (second["state"], second["execution"]["id"], second["skip"]) == ("scheduled", ids[1], None)
    assert second["execution"]["due_at"] > _iso(start + timedelta(days=1))  # due when backfilled


# --- executions that are not fire times, and history -----------------------------------------


def test_trigger_and_retry_executions_are_interleaved_with_the_fire_times(api_client, user):
    now = timezone.now().replace(microsecond=0)
    start = now - 23 * MINUTE
    task = task_create(owner=user, runner="noop", start_at=start, interval=timedelta(minutes=10), misfire_policy="skip")
    triggered = task_trigger(task=task, actor="user:alice").execution
    Execution.objects.filter(pk=triggered.pk).update(status=S.FAILED, finished_at=timezone.now())
    retry = api_client.post(f"/api/v1/executions/{triggered.pk}/retry").json()
    items = _items(api_client, task, start - MINUTE, start + 41 * MINUTE)
    summary = [
        (
            i["fire_time"],
            i["state"],
            i["execution"] and i["execution"]["origin"],
            i["execution"] and i["execution"]["id"],
        )
        for i in items
    ]
    assert summary == [
        (True, "skipped", None, None),  # now - 23 min: missed
        (True, "skipped", None, None),  # now - 13 min
        (True, "skipped", None, None),  # now - 3 min
        (False, "executed", "trigger", triggered.pk),
        (False, "scheduled", "retry", retry["id"]),
        (True, "upcoming", None, None),  # now + 7 min: beyond the materialiser's horizon
        (True, "upcoming", None, None),
    ]
    trigger_item, retry_item = items[3], items[4]
    assert trigger_item["execution"]["status"] == "FAILED" and "trigger" in trigger_item["reason"]
    assert (retry_item["execution"]["retry_of"], retry_item["execution"]["attempt"]) == (triggered.pk, 2)
    assert trigger_item["scheduled_for"] == _iso(triggered.scheduled_for)


def test_executions_superseded_by_a_schedule_change_stay_in_the_timeline(api_client, user):
    start = timezone.now().replace(microsecond=0) + timedelta(seconds=5)
    task = task_create(owner=user, runner="noop", start_at=start, interval=timedelta(seconds=10))
    old = list(Execution.objects.filter(task=task).order_by("scheduled_for"))
    assert len(old) >= 3
    assert api_client.patch(f"/api/v1/tasks/{task.pk}", {"priority": 9}, format="json").status_code == 200
    new = {e.scheduled_for: e for e in Execution.objects.filter(task=task, superseded=False)}
    items = _items(api_client, task, start, old[2].scheduled_for + timedelta(seconds=1))
    pairs = [(i["state"], i["execution"]["id"], i["execution"]["superseded"], i["fire_time"]) for i in items]
    expected = []
    for execution in old[:3]:
        expected.append(("scheduled", new[execution.scheduled_for].pk, False, True))
        expected.append(("superseded", execution.pk, True, True))
    assert pairs == expected
    assert "replaced before it started: replaced: the task's priority changed" in items[1]["reason"]


def test_a_paused_task_shows_its_passed_fire_times_as_unrecorded_skips(api_client, user):
    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(minutes=10, seconds=30)
    task = task_create(owner=user, runner="noop", start_at=start, interval=MINUTE, misfire_policy="skip")
    superseded = set(Execution.objects.filter(task=task).values_list("pk", flat=True))
    task_pause(task=task, actor="user:alice")
    # The pause began 50 s before the last fire time that passed.
    Task.objects.filter(pk=task.pk).update(paused_at=start + timedelta(minutes=9, seconds=10))
    items = _items(api_client, task, start + 8 * MINUTE, start + 13 * MINUTE)
    rows = [(i["scheduled_for"], i["state"], i["skip"] and (i["skip"]["reason"], i["skip"]["recorded"])) for i in items]
    fire = [start + k * MINUTE for k in range(8, 13)]
    # Each fire time once (issue 44 item 5: the executions the pause replaced were listed again,
    # as superseded, beside "upcoming"): the fire time's item stands for its replaced execution.
    assert rows == [
        (_iso(fire[0]), "skipped", ("missed", True)),  # recorded before the pause
        (_iso(fire[1]), "skipped", ("missed", True)),
        (_iso(fire[2]), "skipped", ("paused", False)),  # passed while paused, not recorded yet
        (_iso(fire[3]), "upcoming", None),
        (_iso(fire[4]), "upcoming", None),
    ]
    (ahead,) = [i for i in items if i["scheduled_for"] == _iso(fire[3])]
    assert "has not been resumed" in ahead["reason"]
    shown = {i["execution"]["id"] for i in items if i["execution"]}
    assert shown and shown <= superseded
    for item in items:
        if item["execution"]:
            assert item["execution"]["superseded"] and item["execution"]["status"] == "CANCELLED"
            assert "was replaced before it started" in item["reason"]


def test_a_task_that_used_up_max_runs_lists_no_fire_time_after_its_last_run(api_client, user):
    start = timezone.now().replace(microsecond=0) - timedelta(hours=2)
    task = task_create(
        owner=user, runner="noop", start_at=start, interval=timedelta(hours=1), max_runs=3, misfire_policy="run_all"
    )
    items = _items(api_client, task, start - timedelta(hours=1), start + timedelta(hours=10))
    assert [i["scheduled_for"] for i in items] == [_iso(start + k * timedelta(hours=1)) for k in range(3)]
    assert {i["state"] for i in items} == {"scheduled"}
    once = task_create(owner=user, runner="noop", start_at=start + timedelta(hours=30))
    (only,) = _items(api_client, once, start, start + timedelta(days=2))
    assert (only["state"], only["scheduled_for"]) == ("upcoming", _iso(start + timedelta(hours=30)))


# --- time zones ------------------------------------------------------------------------------


def test_a_cron_task_across_the_spring_gap_lists_the_documented_instants(api_client, user):
    task = TaskFactory(
        owner=user, start_at=datetime(2026, 3, 1, tzinfo=UTC), cron="30 2 * * *", timezone="Europe/Berlin"
    )
    body = api_client.get(_url(task), {"from": "2026-03-27T00:00:00+01:00", "to": "2026-03-31T00:00:00+02:00"}).json()
    assert (body["from"], body["to"], body["timezone"]) == (
        "2026-03-26T23:00:00Z",
        "2026-03-30T22:00:00Z",
        "Europe/Berlin",
    )
    # 02:30 does not exist on 29 March: it fires once, at 03:00 CEST, right after the gap.
    assert [(i["scheduled_for"], i["local_time"]) for i in body["items"]] == [
        ("2026-03-27T01:30:00Z", "2026-03-27T02:30:00+01:00"),
        ("2026-03-28T01:30:00Z", "2026-03-28T02:30:00+01:00"),
        ("2026-03-29T01:00:00Z", "2026-03-29T03:00:00+02:00"),
        ("2026-03-30T00:30:00Z", "2026-03-30T02:30:00+02:00"),
    ]

    quarter = TaskFactory(
        owner=user, start_at=datetime(2026, 3, 1, tzinfo=UTC), cron="*/15 * * * *", timezone="Europe/Berlin"
    )
    # An unescaped "+" arrives as a space: it is read as the offset's sign.
    response = api_client.get(_url(quarter) + "?from=2026-03-29T01:30:00+01:00&to=2026-03-29T03:30:00+02:00")
    assert response.status_code == 200, response.json()
    assert [(i["scheduled_for"], i["local_time"]) for i in response.json()["items"]] == [
        ("2026-03-29T00:30:00Z", "2026-03-29T01:30:00+01:00"),
        ("2026-03-29T00:45:00Z", "2026-03-29T01:45:00+01:00"),
        ("2026-03-29T01:00:00Z", "2026-03-29T03:00:00+02:00"),
        ("2026-03-29T01:15:00Z", "2026-03-29T03:15:00+02:00"),
    ]


def test_a_cron_task_through_the_autumn_repeat_fires_at_both_occurrences_of_the_hour(api_client, user):
    task = TaskFactory(
        owner=user, start_at=datetime(2026, 10, 1, tzinfo=UTC), cron="*/30 * * * *", timezone="Europe/Berlin"
    )
    items = _items(api_client, task, datetime(2026, 10, 25, 0, tzinfo=UTC), datetime(2026, 10, 25, 2, tzinfo=UTC))
    assert [(i["scheduled_for"], i["local_time"]) for i in items] == [
        ("2026-10-25T00:00:00Z", "2026-10-25T02:00:00+02:00"),
        ("2026-10-25T00:30:00Z", "2026-10-25T02:30:00+02:00"),
        ("2026-10-25T01:00:00Z", "2026-10-25T02:00:00+01:00"),
        ("2026-10-25T01:30:00Z", "2026-10-25T02:30:00+01:00"),
    ]


# --- the window ------------------------------------------------------------------------------


def test_the_default_window_is_two_days_around_now_or_from_the_bound_given(api_client, user):
    task = TaskFactory(owner=user, start_at=datetime(2026, 1, 1, tzinfo=UTC), interval=timedelta(hours=6))
    body = api_client.get(_url(task)).json()
    now = datetime.fromisoformat(body["now"])
    assert datetime.fromisoformat(body["from"]) == now - timedelta(days=1)
    assert datetime.fromisoformat(body["to"]) == now + timedelta(days=1)
    assert len(body["items"]) == 8
    only_from = api_client.get(_url(task), {"from": "2026-02-01T00:00:00Z"}).json()
    assert (only_from["from"], only_from["to"]) == ("2026-02-01T00:00:00Z", "2026-02-03T00:00:00Z")
    only_to = api_client.get(_url(task), {"to": "2026-02-01T00:00:00Z"}).json()
    assert (only_to["from"], only_to["to"]) == ("2026-01-30T00:00:00Z", "2026-02-01T00:00:00Z")


def test_a_default_window_narrows_to_hold_at_most_1000_fire_times(api_client, user):
    task = TaskFactory(owner=user, start_at=datetime(2026, 1, 1, tzinfo=UTC), interval=MINUTE)
    body = api_client.get(_url(task)).json()
    now, start, end = (datetime.fromisoformat(body[key]) for key in ("now", "from", "to"))
    # Two days hold 2880 fire times, one 1440, half a day 720.
    assert (start, end) == (now - timedelta(hours=6), now + timedelta(hours=6))
    assert len(body["items"]) == 720
    only_from = api_client.get(_url(task), {"from": "2026-02-01T00:00:00Z"}).json()
    assert (only_from["from"], only_from["to"]) == ("2026-02-01T00:00:00Z", "2026-02-01T12:00:00Z")
    dense = TaskFactory(owner=user, start_at=datetime(2026, 1, 1, tzinfo=UTC), interval=timedelta(milliseconds=100))
    body = api_client.get(_url(dense), {"to": "2026-02-01T00:00:00Z"}).json()
    assert 500 < len(body["items"]) <= 1000


@pytest.mark.parametrize(
    ("params", "errors"),
    [
        ({"from": "yesterday"}, {"from"}),
        ({"to": "2026-03-29T00:00:00"}, {"to"}),  # no offset: which 00:00?
        ({"from": "2026-03-29"}, {"from"}),
        ({"from": "9500-01-01T00:00:00Z"}, {"from"}),
        ({"from": "2026-03-29T00:00:00Z", "to": "2026-03-29T00:00:00Z"}, {"to"}),
        ({"from": "2026-03-29T00:00:00Z", "to": "2026-03-28T00:00:00Z"}, {"to"}),
        ({"from": "2026-01-01T00:00:00Z", "to": "2027-01-03T00:00:00Z"}, {"to"}),  # more than 366 days
        ({"from": "x", "to": "y"}, {"from", "to"}),
        ({"at": "2026-03-29T00:00:00Z"}, {"at"}),  # unknown parameter
    ],
)
def test_bad_parameters_are_400s_naming_each_field(api_client, user, params, errors):
    task = TaskFactory(owner=user, start_at=datetime(2026, 1, 1, tzinfo=UTC), interval=timedelta(hours=1))
    response = api_client.get(_url(task), params)
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["type"] == "validation_error"
    assert set(body["errors"]) == errors


def test_the_messages_say_what_is_wrong(api_client, user):
    task = TaskFactory(owner=user, start_at=datetime(2026, 1, 1, tzinfo=UTC), interval=timedelta(hours=1))
    naive = api_client.get(_url(task), {"to": "2026-03-29T00:00:00"}).json()["errors"]["to"]
    assert naive == ["Give the UTC offset, e.g. 2026-03-29T01:00:00Z or 2026-03-29T03:00:00+02:00."]
    backwards = {"from": "2026-03-29T00:00:00Z", "to": "2026-03-28T00:00:00Z"}
    assert api_client.get(_url(task), backwards).json()["errors"]["to"] == ["Must be after from."]
    wide = {"from": "2026-01-01T00:00:00Z", "to": "2027-01-03T00:00:00Z"}
    assert api_client.get(_url(task), wide).json()["errors"]["to"] == ["The window may span at most 366 days."]


def test_a_window_with_more_than_1000_fire_times_is_a_400_naming_a_to_that_fits(api_client, user):
    start = datetime(2026, 1, 1, tzinfo=UTC)
    task = TaskFactory(owner=user, start_at=start, interval=timedelta(seconds=1))
    response = api_client.get(_url(task), {"from": _iso(start), "to": _iso(start + timedelta(hours=1))})
    assert response.status_code == 400
    (message,) = response.json()["errors"]["to"]
    fits = start + timedelta(seconds=1000)
    assert "more than 1000 fire times" in message and fits.isoformat() in message
    assert len(_items(api_client, task, start, fits)) == 1000


def test_a_window_with_more_than_2000_executions_is_a_400(api_client, user):
    start = datetime(2026, 1, 1, tzinfo=UTC)
    task = TaskFactory(owner=user, start_at=start, interval=timedelta(days=1))
    rows = [transitions.NewExecution(task.pk, start + timedelta(seconds=k), 5) for k in range(2001)]
    transitions.executions_create(rows=rows, actor="test")
    response = api_client.get(_url(task), {"from": _iso(start), "to": _iso(start + timedelta(hours=1))})
    assert response.status_code == 400
    (message,) = response.json()["errors"]["to"]
    assert "more than 2000 executions" in message
    assert (start + timedelta(seconds=2000)).isoformat() in message
    assert len(_items(api_client, task, start, start + timedelta(seconds=2000))) == 2000


# --- access and cost -------------------------------------------------------------------------


def test_another_owners_task_and_a_deleted_task_are_404(api_client, other_client, staff_client, user):
    task = TaskFactory(owner=user, interval=timedelta(minutes=1))
    assert other_client.get(_url(task)).status_code == 404
    assert other_client.get(_url(task), {"from": "nonsense"}).status_code == 404  # 404 before the 400
    assert staff_client.get(_url(task)).status_code == 200
    task_delete(task=task, actor="user:alice")
    assert api_client.get(_url(task)).status_code == 404


def test_the_number_of_queries_does_not_grow_with_the_window(api_client, user, django_assert_max_num_queries):
    task, start, now = _outage(user, minutes=1200)
    task_trigger(task=task, actor="user:alice")
    api_client.patch(f"/api/v1/tasks/{task.pk}", {"priority": 8}, format="json")  # supersedes the future ones
    # Six: the user's team ids, the task, the user's access, the executions, the skipped
    # occurrences, and the task's versions (the schedule in force at each instant).
    with django_assert_max_num_queries(6):
        small = _items(api_client, task, now - 5 * MINUTE, now + 5 * MINUTE)
    with django_assert_max_num_queries(6):
        large = _items(api_client, task, start, start + 999 * MINUTE)
    with django_assert_max_num_queries(6):
        mixed = _items(api_client, task, now - 900 * MINUTE, now + 60 * MINUTE)
    assert len(small) > 10 and len(large) == 999 and len(mixed) > 960
    assert {i["state"] for i in mixed} >= {"skipped", "scheduled", "superseded", "upcoming"}
    done = task_create(
        owner=user, runner="noop", start_at=now - 3 * timedelta(hours=1), interval=timedelta(hours=1), max_runs=2
    )
    with django_assert_max_num_queries(6):  # the task's end comes with the same two queries
        ended = _items(api_client, done, now - timedelta(days=1), now + timedelta(days=1))
    # Two coalesced misses, then the two runs max_runs allows: the catch-up run and the current one.
    assert [i["state"] for i in ended] == ["skipped", "skipped", "scheduled", "scheduled"]


def test_after_a_schedule_edit_the_past_is_judged_by_the_schedule_in_force_then(api_client, user):
    """Issue 44 item 3: a cron changed from */2 to */3 marked 05:33 (never a fire time under */2)
    missing, and why?at=05:33 said "no reason was recorded". Each instant is judged by the
    schedule of the version in force at it."""
    now = timezone.now()
    start = now.replace(second=0, microsecond=0) - 30 * MINUTE
    task = task_create(owner=user, runner="noop", start_at=start, cron="*/2 * * * *", misfire_policy="skip")
    response = api_client.patch(f"/api/v1/tasks/{task.pk}", {"cron": "*/3 * * * *"}, format="json")
    assert response.status_code == 200, response.json()
    task.refresh_from_db()
    edited = task.versions.get(number=2).created_at
    items = _items(api_client, task, start, now + 10 * MINUTE)
    assert [i for i in items if i["state"] == "missing"] == []
    fire = [datetime.fromisoformat(i["scheduled_for"]) for i in items if i["fire_time"]]
    before, after = [w for w in fire if w < edited], [w for w in fire if w >= edited]
    evens = [w for w in (start + k * MINUTE for k in range(40)) if w < edited and w.minute % 2 == 0]
    # The */2 fire times before the edit were recorded as missed, but for the one due as it was
    # edited: made as a late run (within the misfire grace), then replaced by the edit. When that
    # instant is a */3 fire time too (a minute of six: one CI run in six), the edit made the
    # */3 run there: one instant listed twice, the run replaced and its replacement, one live run.
    due = max(evens)
    at_due = sorted(i["state"] for i in items if i["fire_time"] and datetime.fromisoformat(i["scheduled_for"]) == due)
    replanned = at_due == ["scheduled", "superseded"]
    assert at_due in (["skipped"], ["superseded"]) or (replanned and due.minute % 3 == 0), at_due
    assert before == (sorted([*evens, due]) if replanned else evens)
    assert len(after) >= 3 and all(w.minute % 3 == 0 for w in after)
    states = [
        i["state"] for i in items if i["fire_time"] and due != datetime.fromisoformat(i["scheduled_for"]) < edited
    ]
    assert set(states) == {"skipped"}, states  # shown as fire times, none missing
    odd = next(w for w in (start + k * MINUTE for k in range(1, 28)) if w.minute % 3 == 0 and w.minute % 2 == 1)
    why = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": _iso(odd)}).json()
    assert why["verdict"] == "not_a_fire_time", why
    assert "no reason was recorded" not in why["reason"]
    assert why["occurrence"] == _iso(odd - MINUTE)
    assert "in force then" in why["reason"] and "Skipped (missed)" in why["reason"]
    even = odd - MINUTE
    assert api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": _iso(even)}).json()["verdict"] == "skipped"
