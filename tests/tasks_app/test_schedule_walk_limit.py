"""Issue 15, finding 4: sparse cron expressions must not exhaust the CPU.

``0 0 29 2 *`` fires once every four years, and walking a cron schedule costs time per year
walked: 1000 fire times from 1970 took 6.4 s of CPU (10.8 s with ``max_runs`` and a zone).
A walk now reaches at most ``MAX_WALK_YEARS`` past where it starts; asking for more is a 400
naming the field that asked for it, answered within a bounded amount of CPU.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from itertools import islice

import pytest
from django.utils import timezone

from executions.materialiser import materialise_task
from executions.models import Execution, SkippedOccurrence
from tasks_api.backfill import task_backfill
from tasks_api.creation import task_create
from tasks_app.schedules import MAX_WALK, MAX_WALK_YEARS, Schedule, WalkTooLong
from tests.factories import TaskFactory
from tms_core.errors import InvalidInput

LEAP_DAY = "0 0 29 2 *"
#: CPU seconds one request may take at most here (measured: about 0.15 s; 6.4 s before the bound).
CPU_BUDGET = 1.5


def _cpu(call):
    started = time.process_time()
    result = call()
    return result, time.process_time() - started


def test_a_cron_walk_stops_max_walk_years_past_its_start():
    schedule = Schedule(start_at=datetime(1970, 1, 1, tzinfo=UTC), cron=LEAP_DAY)
    assert MAX_WALK_YEARS == 100
    # 1972 ... 2068: the 25 leap days within 100 years of the start are there to take.
    assert [when.year for when in islice(schedule.fire_times(), 25)] == list(range(1972, 2069, 4))
    with pytest.raises(WalkTooLong) as raised:
        list(islice(schedule.fire_times(), 26))  # 2072 is more than 100 years after 1970
    assert raised.value.since == datetime(1970, 1, 1, tzinfo=UTC)
    # The bound counts from where the walk starts, not from the schedule's start.
    later = datetime(2500, 1, 1, tzinfo=UTC)
    assert len(list(islice(schedule.fire_times(since=later), 24))) == 24


def test_a_walk_ending_before_the_bound_is_not_cut():
    schedule = Schedule(
        start_at=datetime(1970, 1, 1, tzinfo=UTC), cron=LEAP_DAY, end_at=datetime(2050, 1, 1, tzinfo=UTC)
    )
    assert len(list(schedule.fire_times())) == 20


def test_interval_schedules_are_not_bounded_by_years():
    schedule = Schedule(start_at=datetime(1970, 1, 1, tzinfo=UTC), interval=timedelta(days=3650))
    times, cpu = _cpu(lambda: list(islice(schedule.fire_times(), 700)))
    assert len(times) == 700 and cpu < 0.5


@pytest.mark.django_db
@pytest.mark.parametrize(
    "extra",
    [{}, {"max_runs": 1000, "timezone": "Europe/Berlin"}],
    ids=["utc", "max_runs-and-zone"],
)
def test_the_schedule_preview_of_a_sparse_cron_is_a_400_on_count_within_a_cpu_budget(api_client, extra):
    body = {"cron": LEAP_DAY, "start_at": "1970-01-01T00:00:00Z", "count": 1000, **extra}
    response, cpu = _cpu(lambda: api_client.post("/api/v1/schedules/preview", body, format="json"))
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert list(errors) == ["count"]
    assert "more than 100 years past 1970-01-01" in errors["count"][0]
    assert cpu < CPU_BUDGET, f"{cpu:.2f} s of CPU"


@pytest.mark.django_db
def test_a_sparse_cron_preview_within_the_bound_answers(api_client):
    body = {"cron": LEAP_DAY, "start_at": "1970-01-01T00:00:00Z", "count": 25, "max_runs": 1000}
    response, cpu = _cpu(lambda: api_client.post("/api/v1/schedules/preview", body, format="json"))
    assert response.status_code == 200, response.json()
    assert [t["utc"][:4] for t in response.json()["fire_times"]] == [str(y) for y in range(1972, 2069, 4)]
    assert cpu < CPU_BUDGET
    body["max_runs"] = 3
    times = api_client.post("/api/v1/schedules/preview", body, format="json").json()["fire_times"]
    assert [t["utc"][:4] for t in times] == ["1972", "1976", "1980"]


def _sparse_task(user, **fields):
    return task_create(
        owner=user,
        runner="noop",
        start_at=datetime(2026, 1, 1, tzinfo=UTC),
        cron=LEAP_DAY,
        timezone="Europe/Berlin",
        max_runs=1000,
        **fields,
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("preview", {"count": 1000}, "count"),
        ("preview", {"count": 5, "after": "2800-01-01T00:00:00Z"}, "after"),
        ("why", {"at": "2800-02-29T00:00:00+01:00"}, "at"),
        ("occurrences", {"from": "2800-01-01T00:00:00Z", "to": "2800-12-31T00:00:00Z"}, "from"),
    ],
)
def test_task_reads_that_walk_too_far_are_a_400_naming_the_field(api_client, user, path, params, field):
    task = _sparse_task(user)
    response, cpu = _cpu(lambda: api_client.get(f"/api/v1/tasks/{task.pk}/{path}", params))
    assert response.status_code == 400, response.json()
    assert list(response.json()["errors"]) == [field]
    assert f"more than {MAX_WALK_YEARS} years past" in response.json()["errors"][field][0]
    assert cpu < CPU_BUDGET, f"{cpu:.2f} s of CPU"


@pytest.mark.django_db
def test_task_reads_within_the_bound_still_answer(api_client, user):
    task = _sparse_task(user)
    preview = api_client.get(f"/api/v1/tasks/{task.pk}/preview", {"count": 5})
    assert preview.status_code == 200
    assert [t["utc"][:4] for t in preview.json()["fire_times"]] == ["2028", "2032", "2036", "2040", "2044"]
    why = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": "2100-01-01T00:00:00Z"})
    assert why.status_code == 200 and why.json()["verdict"] == "not_a_fire_time"


@pytest.mark.django_db
def test_a_backfill_range_walked_too_far_is_invalid_input_on_end(user):
    """The API bounds ``start`` to 1970 and later; the service holds for any caller."""
    task = TaskFactory(owner=user, start_at=datetime(1800, 1, 1, tzinfo=UTC), cron=LEAP_DAY)
    with pytest.raises(InvalidInput) as raised:
        task_backfill(task=task, start=task.start_at, end=datetime(2020, 1, 1, tzinfo=UTC), actor="test")
    assert list(raised.value.errors) == ["end"]
    assert not Execution.objects.filter(task=task).exists()


@pytest.mark.django_db
def test_the_materialiser_catches_up_a_cursor_older_than_the_walk_bound(user):
    """A cron cursor centuries old (a row not made through the API) does not break a pass: only
    the last 59 years are walked (the walk bound, 100 years, less the 41 a cron expression may go
    without a fire time), the earlier fire times are summarised as "more"."""
    now = timezone.now()
    start = datetime(1800, 1, 1, tzinfo=UTC)
    task = TaskFactory(owner=user, start_at=start, next_run_at=datetime(1804, 2, 29, tzinfo=UTC), cron=LEAP_DAY)
    _, cpu = _cpu(lambda: materialise_task(task_id=task.pk, until=now + timedelta(minutes=5)))
    task.refresh_from_db()
    assert task.next_run_at == datetime(2028, 2, 29, tzinfo=UTC)
    # Misfire policy run_once: the latest missed fire time runs, the others are skipped.
    runs = Execution.objects.filter(task=task).values_list("scheduled_for", flat=True)
    assert list(runs) == [datetime(2024, 2, 29, tzinfo=UTC)]
    skipped = list(SkippedOccurrence.objects.filter(task=task).order_by("scheduled_for"))
    assert skipped[0].scheduled_for == datetime(1804, 2, 29, tzinfo=UTC)
    assert "summary: more occurrences" in skipped[0].detail
    # Listed one by one: the leap days of the 59 years walked, from the first after the cursor
    # moved to until - 100 years + 41 years (1968 in 2026), to 2020.
    cursor = now + timedelta(minutes=5) - MAX_WALK + timedelta(days=366 * 41)
    leap_days = (datetime(y, 2, 29, tzinfo=UTC) for y in range(cursor.year, cursor.year + 8) if y % 4 == 0)
    first = min(day.year for day in leap_days if day >= cursor)
    assert [row.scheduled_for.year for row in skipped[1:]] == list(range(first, 2021, 4))
    assert cpu < CPU_BUDGET
