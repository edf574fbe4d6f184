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
