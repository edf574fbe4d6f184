"""Per-task ``max_concurrency`` on the running system: several real worker processes, a monitor,
PostgreSQL and RabbitMQ. The cap is checked twice: sampled continuously while the runs go, and
from the event log afterwards (the largest overlap of the runs' start-finish intervals)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from executions.models import ACTIVE_STATUSES, Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tests.factories import UserFactory
from tests.processes import running, start_monitor, start_worker, wait_worker_ready
from tms_core.clock import db_now

FAST = {"TMS_HEARTBEAT_INTERVAL": "0.5", "TMS_WORKER_TIMEOUT": "5", "TMS_MONITOR_MAX_SLEEP": "0.2"}
RUNS = 10


def _max_overlap(intervals: list[tuple[object, object]]) -> int:
    """The most intervals open at one instant (an end at the same instant as a start closes first)."""
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals], key=lambda p: p)
    best = current = 0
    for _, step in points:
        current += step
        best = max(best, current)
    return best


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_cap_of_two_never_has_three_running_with_three_workers():
    workers = [start_worker(f"worker-{n}", concurrency=2, **FAST) for n in range(3)]
    monitor = start_monitor(**FAST)
    with running(*workers, monitor):
        for worker in workers:
            wait_worker_ready(worker)
        now = db_now()
        # Ten runs of 0.6 s due within 0.5 s: six worker slots, a cap of two.
        task = task_create(
            owner=UserFactory(),
            runner="sleep",
            config={"duration": "600ms"},
            start_at=now,
            interval=timedelta(milliseconds=50),
            max_runs=RUNS,
            max_concurrency=2,
        )
        rows = Execution.objects.filter(task=task)
        most, samples = 0, 0
        deadline = time.monotonic() + 60
        while rows.count() < RUNS or rows.filter(status__in=ACTIVE_STATUSES).exists():
            assert time.monotonic() < deadline, list(rows.values_list("status", "waiting"))
            most = max(most, rows.filter(status=S.RUNNING).count())
            samples += 1
            time.sleep(0.02)
    assert set(rows.values_list("status", flat=True)) == {S.SUCCEEDED}
    assert most <= 2 and samples > 50, (most, samples)
    events = ExecutionEvent.objects.filter(execution__task=task)
    starts = dict(events.filter(to_status=S.RUNNING, from_status=S.PENDING).values_list("execution_id", "at"))
    ends = dict(events.filter(to_status=S.SUCCEEDED).values_list("execution_id", "at"))
    assert len(starts) == len(ends) == RUNS  # each run started once
    assert _max_overlap([(starts[i], ends[i]) for i in starts]) == 2  # the cap held and was used
    waits = events.filter(from_status=S.PENDING, to_status=S.SCHEDULED, detail__startswith="waiting: max_concurrency 2")
    assert waits.exists()
    # Waiters are released by the end of a run, not by polling: a handful of waits per run.
    assert waits.count() <= 3 * RUNS, waits.count()
    # Everything that waited started in due order once it was its turn. Runs of one length end
    # in pairs, and the two slots a pair frees are claimed by two workers at once: which of the
    # two next waiters is stamped first is that race (as for the first two, which found free
    # slots). So each run starts at its place in due order or next to it, never further off.
    order = [i for i, _ in sorted(starts.items(), key=lambda item: item[1])]
    due_order = list(rows.order_by("scheduled_for").values_list("id", flat=True))
    assert sorted(order) == sorted(due_order)
    assert all(abs(order.index(run) - place) <= 1 for place, run in enumerate(due_order)), (order, due_order)
    assert not rows.exclude(waiting="").exists()  # nothing still says it waits


@pytest.mark.django_db
@pytest.mark.parametrize("value", [0, -1, "two"])
def test_a_cap_below_one_is_a_400_on_the_field(api_client, value):
    response = api_client.post(
        "/api/v1/tasks", {"runner": "noop", "interval": "1m", "max_concurrency": value}, format="json"
    )
    assert response.status_code == 400
    assert "max_concurrency" in response.data["errors"], response.data
