"""Preview, "why did it not run at T?" and backfill through the API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from executions.materialiser import materialise_task
from executions.models import Execution, SkippedOccurrence
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tests.factories import ExecutionFactory

pytestmark = pytest.mark.django_db


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def test_schedule_preview_applies_the_dst_rule(api_client):
    body = {
        "start_at": "2026-03-27T00:00:00Z",
        "cron": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "count": 3,
    }
    response = api_client.post("/api/v1/schedules/preview", body, format="json")
    assert response.status_code == 200, response.json()
    times = response.json()["fire_times"]
    assert [t["utc"] for t in times] == ["2026-03-27T01:30:00Z", "2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z"]
    assert times[2]["local"] == "2026-03-29T03:00:00+02:00"


def test_schedule_preview_rejects_bad_input_per_field(api_client):
    response = api_client.post(
        "/api/v1/schedules/preview", {"cron": "61 * * * *", "timezone": "Mars/Olympus", "count": 5000}, format="json"
    )
    assert response.status_code == 400
    fields = response.json()["errors"] if "errors" in response.json() else response.json()
    text = str(fields)
    assert "cron" in text and "timezone" in text and "count" in text


def test_schedule_preview_stops_at_max_runs_and_end_at(api_client):
    body = {"start_at": "2026-01-01T00:00:00Z", "interval": "1h", "max_runs": 2, "count": 10}
    times = api_client.post("/api/v1/schedules/preview", body, format="json").json()["fire_times"]
    assert [t["utc"] for t in times] == ["2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"]


def test_task_preview_lists_the_next_fire_times(api_client, user):
    task = task_create(owner=user, runner="noop", start_at=datetime(2026, 1, 1, tzinfo=UTC), cron="0 9 * * MON")
    response = api_client.get(f"/api/v1/tasks/{task.pk}/preview", {"count": 2, "after": "2026-01-01T00:00:00Z"})
    assert response.status_code == 200
    assert [t["utc"] for t in response.json()["fire_times"]] == ["2026-01-05T09:00:00Z", "2026-01-12T09:00:00Z"]


def test_why_answers_ran_skipped_and_not_a_fire_time(api_client, user):
    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(minutes=10, seconds=30)
    task = task_create(owner=user, runner="noop", start_at=start, interval=timedelta(minutes=1), misfire_policy="skip")
    assert SkippedOccurrence.objects.filter(task=task, reason="missed").count() == 10
    grace = Execution.objects.filter(task=task, scheduled_for__lte=now).get()
    Execution.objects.filter(pk=grace.pk).update(status=S.SUCCEEDED)

    ran = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": _iso(grace.scheduled_for)}).json()
    assert (ran["verdict"], ran["execution"]["id"]) == ("ran", grace.pk)

    missed = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": _iso(start)}).json()
    assert missed["verdict"] == "skipped"
    assert missed["skipped"]["reason"] == "missed"
    assert "missed by more than its misfire grace of 60s" in missed["reason"]

    between = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": _iso(start + timedelta(seconds=20))}).json()
    assert between["verdict"] == "not_a_fire_time"
    assert between["occurrence"] == _iso(start)

    before = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": _iso(start - timedelta(days=1))}).json()
    assert (before["verdict"], before["occurrence"]) == ("before_start", None)
    assert len(before["next_fire_times"]) == 5


def test_why_says_paused_for_a_fire_time_during_a_pause(api_client, user):
    task = task_create(owner=user, runner="noop", interval=timedelta(seconds=1))
    api_client.post(f"/api/v1/tasks/{task.pk}/pause")
    later = timezone.now() + timedelta(minutes=5)
    task.refresh_from_db()
    # Cursor moved back to the earliest superseded occurrence: a fire time beyond it is "paused".
    at = next(iter(task.next_run_at + timedelta(seconds=k) for k in range(300, 301)))
    answer = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": _iso(at)}).json()
    assert answer["verdict"] in ("paused", "upcoming")
    assert later > at - timedelta(seconds=10)


def test_why_and_preview_of_another_owners_task_are_404(other_client, user):
    task = task_create(owner=user, runner="noop", interval=timedelta(minutes=1))
    assert other_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": "2026-01-01T00:00:00Z"}).status_code == 404
    assert other_client.get(f"/api/v1/tasks/{task.pk}/preview").status_code == 404
    body = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T00:10:00Z"}
    assert other_client.post(f"/api/v1/tasks/{task.pk}/backfill", body, format="json").status_code == 404


def test_why_requires_a_valid_at(api_client, user):
    task = task_create(owner=user, runner="noop", interval=timedelta(minutes=1))
    assert api_client.get(f"/api/v1/tasks/{task.pk}/why").status_code == 400
    assert api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": "yesterday"}).status_code == 400


def test_backfill_creates_the_missing_fire_times_due_now_once(api_client, user):
    start = datetime(2025, 1, 1, tzinfo=UTC)
    task = task_create(owner=user, runner="noop", start_at=start, interval=timedelta(hours=1), misfire_policy="skip")
    body = {"start": _iso(start), "end": _iso(start + timedelta(hours=4))}
    first = api_client.post(f"/api/v1/tasks/{task.pk}/backfill", body, format="json")
    assert first.status_code == 201, first.json()
    assert (len(first.json()["execution_ids"]), first.json()["existing"]) == (5, 0)
    created = Execution.objects.filter(pk__in=first.json()["execution_ids"])
    assert all(e.due_at > timezone.now() - timedelta(minutes=1) for e in created)
    again = api_client.post(f"/api/v1/tasks/{task.pk}/backfill", body, format="json").json()
    assert (again["execution_ids"], again["existing"]) == ([], 5)


def test_a_backfill_of_a_range_with_no_fire_times_says_so(api_client, user):
    """Issue 44 item 12: a range with no fire time answered 201 with nothing but a silent 0."""
    start = datetime(2025, 1, 1, tzinfo=UTC)
    task = task_create(
        owner=user, runner="noop", start_at=start, cron="0 9 * * *", timezone="Europe/Berlin", misfire_policy="skip"
    )
    body = {"start": "2025-01-01T10:00:00.123456Z", "end": "2025-01-01T20:00:00Z"}
    response = api_client.post(f"/api/v1/tasks/{task.pk}/backfill", body, format="json")
    assert response.status_code == 201, response.json()
    answer = response.json()
    assert (answer["execution_ids"], answer["existing"], answer["fire_times"]) == ([], 0, 0)
    # In the task's zone, to the second.
    assert answer["detail"] == (
        "No fire times between 2025-01-01 11:00:00 CET and 2025-01-01 21:00:00 CET: nothing to backfill."
    )
    full = {"start": "2025-01-01T00:00:00Z", "end": "2025-01-02T20:00:00Z"}
    answer = api_client.post(f"/api/v1/tasks/{task.pk}/backfill", full, format="json").json()
    assert (len(answer["execution_ids"]), answer["fire_times"]) == (2, 2)
    assert answer["detail"].startswith("2 fire time(s) between 2025-01-01 01:00:00 CET and 2025-01-02 21:00:00 CET: ")


def test_backfill_refuses_a_future_end_and_too_wide_a_range(api_client, user):
    task = task_create(
        owner=user, runner="noop", start_at=datetime(2025, 1, 1, tzinfo=UTC), interval=timedelta(seconds=1)
    )
    future = {"start": "2025-01-01T00:00:00Z", "end": _iso(timezone.now() + timedelta(hours=1))}
    assert api_client.post(f"/api/v1/tasks/{task.pk}/backfill", future, format="json").status_code == 400
    wide = {"start": "2025-01-01T00:00:00Z", "end": "2025-01-02T00:00:00Z"}
    response = api_client.post(f"/api/v1/tasks/{task.pk}/backfill", wide, format="json")
    assert response.status_code == 400
    assert "more than 500 fire times (TMS_BACKFILL_MAX)" in str(response.json())
    assert not Execution.objects.filter(task=task, scheduled_for__lt=datetime(2025, 1, 2, tzinfo=UTC)).exists()


def test_exclusive_flag_follows_the_overlap_policy(api_client, user):
    task = task_create(owner=user, runner="noop", interval=timedelta(seconds=10), overlap_policy="skip")
    assert Execution.objects.filter(task=task).exists()
    assert all(Execution.objects.filter(task=task).values_list("exclusive", flat=True))
    api_client.patch(f"/api/v1/tasks/{task.pk}", {"overlap_policy": "allow"}, format="json")
    assert not any(Execution.objects.filter(task=task, status=S.SCHEDULED).values_list("exclusive", flat=True))
    materialise_task(task_id=task.pk)


def test_misfire_grace_and_catch_up_limit_default_from_settings_and_can_be_set(api_client):
    body = {"runner": "noop", "interval": "1h"}
    default = api_client.post("/api/v1/tasks", body, format="json").json()
    assert (default["misfire_grace"], default["catch_up_limit"]) == (60.0, 100)
    custom = api_client.post(
        "/api/v1/tasks",
        {**body, "misfire_grace": "5m", "catch_up_limit": 7, "misfire_policy": "run_all"},
        format="json",
    )
    assert custom.status_code == 201, custom.json()
    assert (custom.json()["misfire_grace"], custom.json()["catch_up_limit"]) == (300.0, 7)
    changed = api_client.patch(f"/api/v1/tasks/{custom.json()['id']}", {"catch_up_limit": 3}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["catch_up_limit"] == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [("misfire_grace", "0.5s"), ("misfire_grace", "31d"), ("catch_up_limit", 0), ("catch_up_limit", 1001)],
)
def test_out_of_range_misfire_settings_are_400_per_field(api_client, field, value):
    from tasks_app.models import Task

    response = api_client.post("/api/v1/tasks", {"runner": "noop", "interval": "1h", field: value}, format="json")
    assert response.status_code == 400
    assert list(response.json()["errors"]) == [field]
    assert not Task.objects.exists()


def test_a_run_all_backlog_runs_the_latest_catch_up_limit_fire_times(user):
    start = datetime(2025, 1, 1, tzinfo=UTC)
    task = task_create(
        owner=user,
        runner="noop",
        start_at=start,
        interval=timedelta(hours=1),
        misfire_policy="run_all",
        catch_up_limit=4,
    )
    missed = Execution.objects.filter(task=task, scheduled_for__lt=timezone.now() - timedelta(minutes=1))
    assert missed.count() == 4
    times = sorted(missed.values_list("scheduled_for", flat=True))
    assert times[-1] - times[0] == timedelta(hours=3)
    coalesced = SkippedOccurrence.objects.filter(task=task, reason="coalesced")
    assert coalesced.filter(scheduled_for__gte=times[0]).count() == 0
    assert "beyond its bound of 4 catch-up runs" in coalesced.first().detail


def test_why_says_skipped_for_a_fire_time_superseded_at_a_pause_and_skipped_at_the_resume(api_client, user):
    # The pause superseded the execution; the resume, past its time, recorded it as skipped.
    when = datetime(2025, 6, 1, 12, tzinfo=UTC)
    task = task_create(owner=user, runner="noop", start_at=when, interval=timedelta(hours=1), misfire_policy="skip")
    Execution.objects.filter(task=task).delete()
    SkippedOccurrence.objects.filter(task=task).delete()
    superseded = ExecutionFactory(task=task, scheduled_for=when, status=S.CANCELLED, superseded=True)
    SkippedOccurrence.objects.create(task=task, scheduled_for=when, reason="paused", detail="the task was paused")
    answer = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": _iso(when)}).json()
    assert (answer["verdict"], answer["skipped"]["reason"]) == ("skipped", "paused")
    assert answer["execution"]["id"] == superseded.pk


def test_why_after_the_last_of_max_runs_is_after_end(api_client, user):
    start = timezone.now().replace(microsecond=0) - timedelta(hours=2)
    task = task_create(
        owner=user, runner="noop", start_at=start, interval=timedelta(hours=1), max_runs=3, misfire_policy="run_all"
    )
    task.refresh_from_db()
    assert task.status == "COMPLETED"
    answer = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": _iso(start + timedelta(hours=5))}).json()
    assert answer["verdict"] == "after_end"
    assert f"max_runs (3) with the occurrence at {start + timedelta(hours=2):%Y-%m-%d %H:%M:%S} UTC" in answer["reason"]
    assert answer["next_fire_times"] == []
    last = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": _iso(start + timedelta(hours=2))}).json()
    assert last["verdict"] == "upcoming"  # created, due now; no worker runs it here


def test_backfilled_runs_are_not_misfires_nor_expired_however_long_they_wait(api_client, user):
    """A backfill asks for past fire times on purpose: neither run_once's coalescing nor max_age
    may drop them, even when the queue makes them wait past the misfire grace."""
    from executions.transitions import misfire_decision

    start = datetime(2025, 1, 1, tzinfo=UTC)
    task = task_create(
        owner=user,
        runner="noop",
        start_at=start,
        interval=timedelta(hours=1),
        misfire_policy="run_once",
        misfire_grace=timedelta(seconds=1),
        max_age=timedelta(minutes=5),
    )
    body = {"start": _iso(start), "end": _iso(start + timedelta(hours=2))}
    ids = api_client.post(f"/api/v1/tasks/{task.pk}/backfill", body, format="json").json()["execution_ids"]
    assert len(ids) == 3
    # A slow queue: each backfilled run has waited ten minutes since it was due.
    Execution.objects.filter(pk__in=ids).update(due_at=timezone.now() - timedelta(minutes=10))
    assert [misfire_decision(execution_id=pk) for pk in ids] == [None, None, None]
    assert set(Execution.objects.filter(pk__in=ids).values_list("origin", flat=True)) == {"backfill"}
    # They still count as occurrences of the schedule (timeline, max_runs).
    timeline = api_client.get(
        f"/api/v1/tasks/{task.pk}/occurrences", {"from": _iso(start), "to": _iso(start + timedelta(hours=3))}
    )
    assert timeline.status_code == 200, timeline.json()
