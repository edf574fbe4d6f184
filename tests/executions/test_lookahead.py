"""The monitor's lookahead (issue 33): a run due within ``TMS_MONITOR_LOOKAHEAD`` is taken and
published before its due time, with its due time as the message's ETA, so that neither the
monitor's pass nor the broker's delivery comes after it. The worker holds the message and
claims the run on time: never before its due time, each run once.

Before it, a run was taken only once due, and a steady load's lateness was a monitor pass and a
delivery (p50 33-43 ms at 40 runs/s on a loaded 2-core machine; 4 ms with it: docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from executions.messages import eta_of, group_runs
from executions.models import Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from executions.monitor import Monitor
from executions.transitions import Dispatch
from tests.executions.test_dispatch_batches import ManyPublisher
from tests.executions.test_monitor import FlakyPublisher
from tests.factories import ExecutionFactory, TaskFactory
from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready
from tms_core.clock import db_now
from tms_core.conf import tms_settings

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RUNS = 12


def test_runs_are_taken_ahead_and_start_on_time_each_once(api_client):
    worker, monitor = start_worker(concurrency=2), start_monitor(TMS_MONITOR_LOOKAHEAD="0.8")
    with running(worker, monitor):
        wait_worker_ready(worker)
        first = timezone.now() + timedelta(seconds=3)
        for index in range(RUNS):
            due = first + timedelta(milliseconds=150 * index)
            response = api_client.post(
                "/api/v1/tasks", {"name": f"at-{index}", "runner": "noop", "start_at": due.isoformat()}, format="json"
            )
            assert response.status_code == 201, response.content
        wait_for(
            lambda: Execution.objects.filter(status=S.SUCCEEDED).count() == RUNS, timeout=60, what="every run SUCCEEDED"
        )
    executions = list(Execution.objects.order_by("due_at"))
    assert len(executions) == RUNS
    taken_ahead = 0
    for execution in executions:
        claims = ExecutionEvent.objects.filter(execution=execution, from_status=S.PENDING, to_status=S.RUNNING)
        assert claims.count() == 1 and execution.attempt == 1
        # Never before its due time: the ETA holds it (PostgreSQL's clock and the worker's are
        # this host's one clock).
        assert execution.started_at >= execution.due_at, (execution.started_at, execution.due_at)
        take = ExecutionEvent.objects.get(execution=execution, from_status=S.SCHEDULED, to_status=S.PENDING)
        taken_ahead += take.at < execution.due_at
    # Taken before due: all of them unless the machine stalled for most of the lookahead.
    assert taken_ahead >= 1


@pytest.mark.django_db
def test_a_pass_wakes_at_half_the_lookahead_and_takes_a_whole_lookahead_of_runs():
    """At a steady rate each pass took one run: the loop woke as soon as the next run was within
    the lookahead, so that run was the only one there (1,799 passes for 2,470 runs at 123 runs/s).
    It now wakes when the next run is due within half the lookahead and takes all those due within
    the whole: fewer, fuller passes, each run still published ahead of its time."""
    single, many = FlakyPublisher(), ManyPublisher()
    conf = dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.0, MONITOR_LOOKAHEAD=0.8)
    monitor = Monitor(conf=conf, publish=single, publish_many=many)
    task = TaskFactory(misfire_grace=timedelta(hours=1))
    now = db_now()
    first = ExecutionFactory(task=task, scheduled_for=now + timedelta(seconds=2.0))
    second = ExecutionFactory(task=task, scheduled_for=now + timedelta(seconds=2.3))

    sent, wait = monitor.dispatch_once(housekeeping=False)
    assert sent == 0
    # Due in 2.0 s (less the moments since): wake 0.4 s before it, not 0.8 s (a wait of 1.2 s).
    assert wait is not None and 1.3 < wait <= 1.6, wait
    time.sleep(wait)
    sent, _ = monitor.dispatch_once(housekeeping=False)
    # One pass takes both: the second is due within the lookahead of the wake-up (2.3 <= 1.6 + 0.8).
    assert sent == 2
    statuses = dict(Execution.objects.filter(pk__in=[first.pk, second.pk]).values_list("pk", "status"))
    assert statuses == {first.pk: S.PENDING, second.pk: S.PENDING}
    # Both ahead of their time.
    assert db_now() < Execution.objects.get(pk=first.pk).due_at


def _dispatch(number: int, due_in: float | None) -> Dispatch:
    due = None if due_in is None else timezone.now() + timedelta(seconds=due_in)
    return Dispatch(number, 1, 0, f"{number}-x", "run", due)


def test_a_message_waits_only_for_rows_due_at_its_own_instant():
    herd = timezone.now() + timedelta(seconds=5)
    taken = [
        _dispatch(1, -1.0),
        _dispatch(2, -0.5),
        Dispatch(3, 1, 0, "3-x", "run", herd),
        Dispatch(4, 1, 0, "4-x", "run", herd),
        _dispatch(5, 2.0),
    ]
    groups = group_runs(taken, most=16, spread=1)
    assert [[item.execution_id for item in group] for group in groups] == [[1, 2], [3, 4], [5]]
    assert eta_of(groups[0]) is None  # due already: at once
    assert eta_of(groups[1]) == herd
    assert eta_of([Dispatch(6, 1, 0, "6-x", "republish")]) is None


def test_runs_taken_ahead_within_the_window_share_a_message_due_at_the_latest():
    base = timezone.now() + timedelta(seconds=5)

    def ahead(number: int, ms: float, priority: int = 0) -> Dispatch:
        return Dispatch(number, 1, priority, f"{number}-x", "run", base + timedelta(milliseconds=ms))

    taken = [ahead(1, 0), ahead(2, 3), ahead(3, 5), ahead(4, 5.5), ahead(5, 7), _dispatch(6, -1.0), ahead(7, 8)]
    groups = group_runs(taken, most=16, spread=1, window=0.005)
    # 1-3 lie within 5 ms; 4 would stretch that group to 5.5 ms, so it starts one of its own;
    # a run already due (6) neither joins nor is joined by runs not yet due.
    assert [[item.execution_id for item in group] for group in groups] == [[1, 2, 3], [4, 5], [6], [7]]
    assert eta_of(groups[0]) == base + timedelta(milliseconds=5)  # never before any row's due time
    assert eta_of(groups[2]) is None
    # Without a window, only one instant shares a message (a herd's), as before.
    assert [len(group) for group in group_runs(taken, most=16, spread=1)] == [1] * 7
    # Another priority never shares a message.
    mixed = [ahead(1, 0), ahead(2, 1, priority=5)]
    assert [len(group) for group in group_runs(mixed, most=16, spread=1, window=0.005)] == [1, 1]
