"""The materialiser's fast path for on-time recurring tasks (shared cron walks, interval grid
arithmetic, columns instead of row objects) gives each task exactly what the per-task planner
gives it, whatever else its schedule shares with the herd around it."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from executions.materialiser import DueTask, _Batch, _on_time_window, materialise_due, plan_task
from executions.models import Execution, SkippedOccurrence
from tasks_app.models import MisfirePolicy, OverlapPolicy, Task, TaskStatus
from tests.factories import TaskFactory

CRONS = ("* * * * *", "*/5 * * * *", "0 * * * *", "30 2 * * *", "0 0 29 2 *")
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kathmandu", "Australia/Lord_Howe")


def _random_task(rng: random.Random, now: datetime) -> DueTask:
    """A recurring task with a random schedule, cursor and policies: many share a cron
    expression and cursor, and differ in zone, jitter, start, end, max_runs, pause or misfire."""
    cron = rng.choice(CRONS) if rng.random() < 0.6 else ""
    interval = None if cron else timedelta(seconds=rng.choice((1, 7, 60, 90, 3600, 86400 * 3)))
    start_at = (
        now
        - timedelta(seconds=rng.choice((0, 30, 3600, 86400 * 400)))
        + timedelta(milliseconds=rng.choice((0, 0, 123)))
    )
    # Herds share a cursor; others are late by up to a day or early.
    cursor = rng.choice((now, now, now - timedelta(seconds=rng.randint(1, 86400)), now + timedelta(seconds=200)))
    max_runs = rng.choice((None, None, None, 1, 3, 50))
    return DueTask(
        pk=str(uuid.UUID(int=rng.getrandbits(128))) if rng.random() < 0.5 else uuid.UUID(int=rng.getrandbits(128)),
        start_at=start_at,
        interval=interval,
        cron=cron,
        timezone=rng.choice(ZONES) if cron else "UTC",
        # Valid schedules only (the API refuses an end before the start).
        end_at=rng.choice((None, None, max(start_at, now + timedelta(seconds=rng.randint(-600, 600))))),
        dst_gap=rng.choice(("", "", "skip")) if cron else "",
        dst_fold=rng.choice(("", "", "second", "both")) if cron else "",
        max_runs=max_runs,
        jitter=rng.choice((timedelta(0), timedelta(0), timedelta(seconds=30))),
        misfire_policy=rng.choice(list(MisfirePolicy)),
        misfire_grace=timedelta(seconds=rng.choice((60, 3600))),
        catch_up_limit=rng.choice((1, 5, 100)),
        overlap_policy=rng.choice(list(OverlapPolicy)),
        max_concurrency=rng.choice((None, None, 2)),
        has_limits=rng.random() < 0.1,
        priority=rng.randint(0, 9),
        next_run_at=max(cursor, start_at) if rng.random() < 0.9 else cursor,
        runs_materialised=0 if max_runs is None else rng.randint(0, max_runs),
        paused_at=rng.choice((None, now - timedelta(seconds=500))),
        owner_id=rng.randint(1, 5),
        team_id=rng.randint(1, 5),
    )


def _columns(batch: _Batch) -> tuple[list[str], ...]:
    return (
        batch.task_ids,
        batch.times,
        batch.dues,
        batch.priorities,
        batch.exclusive,
        batch.owners,
        batch.cursor_ids,
        batch.cursor_times,
        batch.cursor_runs,
        batch.cursor_status,
    )


@pytest.mark.parametrize("seed", range(5))
def test_the_fast_path_plans_every_task_as_the_per_task_planner_does(seed):
    rng = random.Random(seed)
    now = datetime(2026, 3, 29, 0, 58, 17, 250000, tzinfo=UTC)  # a DST change in Berlin within the hour
    until = now + timedelta(seconds=300)
    tasks = [_random_task(rng, now) for _ in range(600)]
    fast, slow = _Batch(), _Batch()
    took_fast_path = 0
    for task in tasks:
        slow.add_plan(task, plan_task(task, now=now, until=until))
        window = _on_time_window(task, now=now, until=until)
        if window is None:
            fast.add_plan(task, plan_task(task, now=now, until=until))
        else:
            took_fast_path += 1
            times, nxt = window
            fast.add(task, times, nxt, task.runs_materialised + len(times))
    assert took_fast_path > 100  # the comparison covers the fast path, not only the fallback
    assert _columns(fast) == _columns(slow)
    assert [(s.task_id, s.scheduled_for, s.reason) for s in fast.skipped] == [
        (s.task_id, s.scheduled_for, s.reason) for s in slow.skipped
    ]


@pytest.mark.django_db
def test_a_pass_gives_each_task_of_a_herd_exactly_its_own_occurrences(settings):
    settings.TMS = {**settings.TMS, "MATERIALISE_HORIZON": 300.0, "MATERIALISE_BATCH": 7, "MATERIALISE_THREADS": 1}
    with connection.cursor() as cursor:
        cursor.execute("SELECT date_trunc('minute', now()) - interval '1 minute'")
        minute = cursor.fetchone()[0]
    base = {"cron": "* * * * *", "interval": None, "start_at": minute, "next_run_at": minute}
    variants = [
        {},
        {"timezone": "Asia/Kathmandu"},
        {"timezone": "America/New_York", "jitter": timedelta(seconds=20)},
        {"jitter": timedelta(seconds=20)},
        {"start_at": minute + timedelta(minutes=3), "next_run_at": minute + timedelta(minutes=3)},
        {"end_at": minute + timedelta(minutes=2)},
        {"max_runs": 2},
        {"max_runs": 3, "runs_materialised": 2},
        {"misfire_policy": MisfirePolicy.SKIP, "misfire_grace": timedelta(seconds=30)},
        {"misfire_policy": MisfirePolicy.RUN_ALL, "next_run_at": minute - timedelta(minutes=10)},
        {"overlap_policy": OverlapPolicy.SKIP, "priority": 9},
        {"status": TaskStatus.PAUSED, "paused_at": minute},
    ]
    tasks = [TaskFactory(**{**base, **variant}) for variant in variants for _ in range(3)]
    # What the per-task path plans for each, from the rows as the pass will read them.
    now = timezone.now()
    expected = {}
    for task in Task.objects.filter(pk__in=[t.pk for t in tasks]):
        plan = plan_task(task, now=now, until=now + timedelta(seconds=300))
        expected[task.pk] = [(r.scheduled_for, r.due_at or r.scheduled_for, r.exclusive) for r in plan.rows]
    materialise_due()
    for task in tasks:
        got = list(
            Execution.objects.filter(task=task)
            .order_by("scheduled_for")
            .values_list("scheduled_for", "due_at", "exclusive")
        )
        if task.status == TaskStatus.PAUSED:
            assert got == []
            continue
        # The pass's own clock is a moment later: an occurrence may have entered the horizon since.
        assert got[: len(expected[task.pk])] == expected[task.pk], task.name
        assert len(got) - len(expected[task.pk]) <= 1
    assert all(len(times) == len(set(times)) for times in expected.values())
    # A second pass creates nothing it made before: at most the one minute that may have entered
    # the horizon since, per task.
    assert materialise_due() <= len(tasks)
    assert SkippedOccurrence.objects.filter(task__in=tasks).count() >= 3  # the skip variant dropped its miss
