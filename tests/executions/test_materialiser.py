"""The materialiser catches up on a cursor far in the past without walking every missed occurrence."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from executions.materialiser import catch_up_since, materialise_task
from executions.models import Execution
from tasks_app.models import MisfirePolicy
from tasks_app.schedules import Schedule
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


def test_a_sub_second_interval_started_decades_ago_materialises_at_once():
    start = datetime(2000, 1, 1, tzinfo=UTC)
    task = TaskFactory(
        start_at=start, next_run_at=start, interval=timedelta(milliseconds=100), misfire_policy=MisfirePolicy.RUN_ALL
    )
    started = time.monotonic()
    created = materialise_task(task_id=task.pk, until=timezone.now() + timedelta(seconds=1))
    assert time.monotonic() - started < 5  # walking 8e9 occurrences one by one would take hours
    # The latest 100 misses, then every occurrence of the last minute (the misfire grace) and the next second.
    assert 100 + 590 < len(created) < 100 + 630


@pytest.mark.parametrize(("policy", "missed"), [("skip", 0), ("run_once", 1), ("run_all", 100)])
def test_misfire_policy_after_decades_keeps_the_latest_misses(policy, missed):
    start = datetime(2000, 1, 1, tzinfo=UTC)
    task = TaskFactory(start_at=start, next_run_at=start, interval=timedelta(hours=1), misfire_policy=policy)
    created = materialise_task(task_id=task.pk, until=timezone.now() + timedelta(seconds=1))
    # Plus the occurrence of the last minute, if one fell into it.
    assert len(created) in (missed, missed + 1)
    times = list(Execution.objects.filter(task=task).order_by("scheduled_for").values_list("scheduled_for", flat=True))
    assert all(later - earlier == timedelta(hours=1) for earlier, later in itertools.pairwise(times))
    if times:
        assert timezone.now() - times[-1] < timedelta(hours=1, minutes=2)


def test_catch_up_since_keeps_the_latest_missed_occurrences():
    schedule = Schedule(start_at=datetime(2020, 1, 1, tzinfo=UTC), interval=timedelta(minutes=1))
    before = datetime(2024, 1, 1, tzinfo=UTC)
    since = catch_up_since(schedule, schedule.start_at, missed_before=before, keep=3)
    walked = []
    for when in schedule.fire_times(since=since):
        if when >= before:
            break
        walked.append(when)
    assert walked[-3:] == [before - timedelta(minutes=m) for m in (3, 2, 1)]
    assert len(walked) < 10
    assert catch_up_since(schedule, schedule.start_at, missed_before=before, keep=0) == before
    recent = before + timedelta(hours=1)
    assert catch_up_since(schedule, recent, missed_before=before, keep=5) == recent


def test_catch_up_since_for_a_one_shot_keeps_its_cursor():
    start = datetime(2001, 1, 1, tzinfo=UTC)
    schedule = Schedule(start_at=start)
    assert catch_up_since(schedule, start, missed_before=datetime(2024, 1, 1, tzinfo=UTC), keep=1) == start
    assert MisfirePolicy.RUN_ONCE == "run_once"


@pytest.mark.parametrize(("policy", "runs", "reason"), [("skip", 0, "missed"), ("run_once", 1, "coalesced")])
def test_dropped_misses_are_recorded_with_their_reason(policy, runs, reason):
    from executions.models import SkippedOccurrence

    now = timezone.now()
    start = now - timedelta(minutes=10, seconds=30)
    task = TaskFactory(start_at=start, next_run_at=start, interval=timedelta(minutes=1), misfire_policy=policy)
    materialise_task(task_id=task.pk, until=now)
    created = Execution.objects.filter(task=task)
    # Occurrences 10..2 minutes ago are misses; the one of the last minute (the grace) runs.
    missed = [start + timedelta(minutes=k) for k in range(10)]
    assert created.filter(scheduled_for__lt=now - timedelta(seconds=60)).count() == runs
    skipped = SkippedOccurrence.objects.filter(task=task).order_by("scheduled_for")
    assert [s.scheduled_for for s in skipped] == missed[: len(missed) - runs]
    assert {s.reason for s in skipped} == {reason}
    materialise_task(task_id=task.pk, until=now)  # again: nothing new
    assert SkippedOccurrence.objects.filter(task=task).count() == len(missed) - runs


def test_a_long_outage_records_the_latest_misses_and_one_summary_row():
    from executions.materialiser import RECORD_LIMIT
    from executions.models import SkippedOccurrence

    start = datetime(2020, 1, 1, tzinfo=UTC)
    task = TaskFactory(start_at=start, next_run_at=start, interval=timedelta(seconds=1), misfire_policy="skip")
    materialise_task(task_id=task.pk, until=timezone.now())
    rows = SkippedOccurrence.objects.filter(task=task)
    assert rows.count() == RECORD_LIMIT + 1
    summary = rows.get(scheduled_for=start)
    assert "summary:" in summary.detail
    count = int(summary.detail.split("summary: ")[1].split(" ")[0])
    # Every second since 2020 is accounted for: listed ones, the summary's count, the grace minute.
    listed_and_summarised = count + RECORD_LIMIT
    total = (timezone.now() - start).total_seconds()
    assert total - 120 < listed_and_summarised < total


def test_misses_after_a_pause_are_recorded_as_paused():
    from executions.models import SkippedOccurrence

    now = timezone.now()
    start = now - timedelta(minutes=5, seconds=30)
    task = TaskFactory(
        start_at=start,
        next_run_at=start,
        interval=timedelta(minutes=1),
        misfire_policy="skip",
        paused_at=start + timedelta(minutes=2, seconds=1),
    )
    materialise_task(task_id=task.pk, until=now)
    reasons = dict(SkippedOccurrence.objects.filter(task=task).values_list("scheduled_for", "reason"))
    assert [reasons[start + timedelta(minutes=k)] for k in range(5)] == ["missed"] * 3 + ["paused"] * 2
    task.refresh_from_db()
    assert task.paused_at is None


@pytest.mark.parametrize(("policy", "runs_now"), [("skip", 0), ("run_once", 1), ("run_all", 3)])
def test_max_runs_with_a_start_long_past_runs_the_latest_misses_and_records_the_rest(policy, runs_now):
    """max_runs bounds the catch-up: the latest missed fire times run (at most the runs left),
    every earlier one is recorded, and the task completes when its runs are used up."""
    from executions.models import SkippedOccurrence
    from tasks_app.models import Task, TaskStatus

    now = timezone.now()
    start = now - timedelta(hours=50, minutes=30)
    task = TaskFactory(
        start_at=start, next_run_at=start, interval=timedelta(hours=1), misfire_policy=policy, max_runs=3
    )
    materialise_task(task_id=task.pk, until=now + timedelta(minutes=1))
    fire_times = [start + timedelta(hours=k) for k in range(51)]  # the last one is 30 minutes ago
    runs = list(Execution.objects.filter(task=task).order_by("scheduled_for").values_list("scheduled_for", flat=True))
    assert runs == fire_times[len(fire_times) - runs_now :] if runs_now else runs == []
    skipped = set(SkippedOccurrence.objects.filter(task=task).values_list("scheduled_for", flat=True))
    assert skipped == set(fire_times) - set(runs)  # every fire time is accounted for
    task = Task.objects.get(pk=task.pk)
    assert task.runs_materialised == runs_now
    assert (task.status == TaskStatus.COMPLETED) == (runs_now == 3)
    assert (task.next_run_at is None) == (runs_now == 3)


@pytest.mark.parametrize("missed", [1, 60, 99, 100, 150])
def test_run_all_runs_every_miss_up_to_its_limit(missed):
    """Regression: with between half and all of catch_up_limit missed, only some of them ran."""
    now = timezone.now()
    start = now - timedelta(minutes=missed, seconds=30)
    task = TaskFactory(start_at=start, next_run_at=start, interval=timedelta(minutes=1), misfire_policy="run_all")
    materialise_task(task_id=task.pk, until=now)
    late = Execution.objects.filter(task=task, scheduled_for__lt=now - timedelta(seconds=60))
    assert late.count() == min(missed, 100)
