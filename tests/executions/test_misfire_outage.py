"""The misfire example of docs/scheduling.md on the running system: an every-minute task, misfire grace 60 s,
after an outage of each process in turn (beat, monitor, workers, the broker).

The outage is made short by putting it in the past: the executions are created as they stood
when the outage began (materialised ahead of time, SCHEDULED, or PENDING with their messages in
the queue when the workers were down), due 190, 130, 70 and 10 seconds ago; then the processes
that were down start. Fire times more than the grace late (-190, -130, -70) are the missed ones:
``run_once`` runs the latest (-70) and records the others ``coalesced``, ``skip`` runs none and
records them ``missed``, ``run_all`` runs the latest ``catch_up_limit``. -10 is on time and runs.
Every claim is counted from the event log: no execution starts twice.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from executions.models import ACTIVE_STATUSES, Execution, ExecutionEvent, SkippedOccurrence
from executions.models import ExecutionStatus as S
from executions.tasks import run_execution
from tests.factories import ExecutionFactory, TaskFactory, UserFactory
from tests.processes import run_command, running, start_monitor, start_worker, wait_for, wait_worker_ready
from tests.tcp_proxy import TcpProxy
from tms_core.clock import db_now

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = {"TMS_HEARTBEAT_INTERVAL": "0.5", "TMS_WORKER_TIMEOUT": "5", "TMS_MONITOR_MAX_SLEEP": "0.2"}
#: Seconds before "now" of the fire times that exist when the processes come back.
OFFSETS = (190, 130, 70, 10)
MISSED = (190, 130, 70)


def _task(policy: str, *, materialised: bool, catch_up_limit: int = 100, max_age: timedelta | None = None):
    now = db_now()
    start = now - timedelta(seconds=OFFSETS[0])
    task = TaskFactory(
        owner=UserFactory(),
        interval=timedelta(minutes=1),
        start_at=start,
        next_run_at=start + timedelta(minutes=4) if materialised else start,
        runs_materialised=4 if materialised else 0,
        misfire_policy=policy,
        misfire_grace=timedelta(seconds=60),
        catch_up_limit=catch_up_limit,
        max_age=max_age,
    )
    return task, {offset: start + timedelta(seconds=OFFSETS[0] - offset) for offset in OFFSETS}


def _create(task, times, **state) -> None:
    for when in times.values():
        fields = dict(state)
        if state.get("status") == S.PENDING:
            fields |= {"enqueued_at": when, "message_id": f"outage-{task.pk}-{when.timestamp()}"}
        ExecutionFactory(task=task, scheduled_for=when, **fields)


def _publish_pending(task) -> None:
    """The messages the monitor sent before the workers went down, still in the queue."""
    for execution in Execution.objects.filter(task=task, status=S.PENDING):
        run_execution.apply_async(args=(execution.pk, execution.attempt), task_id=execution.message_id)


def _settled(task, times) -> bool:
    """The on-time fire time's execution exists and no execution of a listed fire time is active."""
    rows = Execution.objects.filter(task=task, scheduled_for__in=list(times.values()))
    return rows.filter(scheduled_for=times[10]).exists() and not rows.filter(status__in=ACTIVE_STATUSES).exists()


def _outcome(task, times) -> tuple[dict[int, str], dict[int, str]]:
    """(status of each fire time's execution, skip reason of each recorded fire time), by offset."""
    by_time = {when: offset for offset, when in times.items()}
    rows = Execution.objects.filter(task=task, scheduled_for__in=list(by_time))
    statuses = {by_time[e.scheduled_for]: e.status for e in rows}
    reasons = {
        by_time[s.scheduled_for]: s.reason
        for s in SkippedOccurrence.objects.filter(task=task)
        if s.scheduled_for in by_time
    }
    return statuses, reasons


def _claims(task, times) -> dict[int, int]:
    """How many times each execution of the listed fire times was claimed (PENDING → RUNNING)."""
    claims: dict[int, int] = {}
    for execution_id in ExecutionEvent.objects.filter(
        execution__task=task,
        execution__scheduled_for__in=list(times.values()),
        from_status=S.PENDING,
        to_status=S.RUNNING,
    ).values_list("execution_id", flat=True):
        claims[execution_id] = claims.get(execution_id, 0) + 1
    return claims


def _come_back(task, times, outage: str) -> None:
    """Start what was down and wait until every fire time's execution is settled."""
    if outage == "workers":
        # Only the workers were down: the monitor had published every row on time.
        worker = start_worker(concurrency=2, **FAST)
        with running(worker):
            wait_for(lambda: _settled(task, times), timeout=60, what="the runs to settle")
        return
    proxy = TcpProxy(5672)
    broker = {}
    if outage == "broker":
        from django.conf import settings

        broker = {"CELERY_BROKER_URL": settings.CELERY_BROKER_URL.replace(":5672", f":{proxy.port}")}
        proxy.cut()
    try:
        worker, monitor = start_worker(concurrency=2, **FAST, **broker), start_monitor(**FAST, **broker)
        with running(worker, monitor):
            if outage == "broker":
                # Nothing can be dispatched while the broker is away: the rows stay SCHEDULED.
                wait_for(lambda: "monitor pass failed" in monitor.log(), timeout=30, what="the monitor to miss it")
                assert set(Execution.objects.filter(task=task).values_list("status", flat=True)) == {S.SCHEDULED}
                proxy.restore()
            wait_worker_ready(worker)
            if outage == "beat":
                # Beat was down: nothing was materialised. Its first pass after the restart.
                result = run_command("materialise")
                assert result.returncode == 0, result.stderr
            wait_for(lambda: _settled(task, times), timeout=60, what="the runs to settle")
    finally:
        proxy.close()


@pytest.mark.parametrize("outage", ["beat", "monitor", "workers", "broker"])
def test_run_once_runs_the_latest_missed_fire_time_once_after_each_outage(outage):
    task, times = _task("run_once", materialised=outage != "beat")
    if outage == "workers":
        _create(task, times, status=S.PENDING)
        _publish_pending(task)
    elif outage != "beat":
        _create(task, times)
    _come_back(task, times, outage)
    statuses, reasons = _outcome(task, times)
    # Beat was down: the materialiser never created the coalesced ones.
    dropped = {} if outage == "beat" else {190: S.CANCELLED, 130: S.CANCELLED}
    assert statuses == dropped | {70: S.SUCCEEDED, 10: S.SUCCEEDED}
    assert reasons == {190: "coalesced", 130: "coalesced"}, [
        (s.scheduled_for, s.detail, s.execution_id) for s in SkippedOccurrence.objects.filter(task=task)
    ] + [(k, v) for k, v in times.items()]
    assert sorted(_claims(task, times).values()) == [1, 1]  # two runs, each started once
    skipped = SkippedOccurrence.objects.filter(task=task).values_list("detail", flat=True)
    assert all("run_once" in detail for detail in skipped), list(skipped)


@pytest.mark.parametrize("outage", ["monitor", "workers"])
def test_skip_runs_no_missed_fire_time_after_an_outage(outage):
    task, times = _task("skip", materialised=True)
    _create(task, times, **({"status": S.PENDING} if outage == "workers" else {}))
    if outage == "workers":
        _publish_pending(task)
    _come_back(task, times, outage)
    statuses, reasons = _outcome(task, times)
    assert statuses == {190: S.CANCELLED, 130: S.CANCELLED, 70: S.CANCELLED, 10: S.SUCCEEDED}
    assert reasons == dict.fromkeys(MISSED, "missed")
    assert sorted(_claims(task, times).values()) == [1]
    cancelled = Execution.objects.filter(task=task, status=S.CANCELLED)
    assert all(e.started_at is None and "misfire grace of 60s" in e.error for e in cancelled)


@pytest.mark.parametrize("outage", ["monitor", "workers"])
def test_run_all_runs_the_missed_fire_times_up_to_its_bound_after_an_outage(outage):
    task, times = _task("run_all", materialised=True, catch_up_limit=2)
    _create(task, times, **({"status": S.PENDING} if outage == "workers" else {}))
    if outage == "workers":
        _publish_pending(task)
    _come_back(task, times, outage)
    statuses, reasons = _outcome(task, times)
    assert statuses == {190: S.CANCELLED, 130: S.SUCCEEDED, 70: S.SUCCEEDED, 10: S.SUCCEEDED}
    assert reasons == {190: "coalesced"}
    assert sorted(_claims(task, times).values()) == [1, 1, 1]


def test_runs_older_than_max_age_are_skipped_as_expired_instead_of_running_late():
    # run_all would catch every missed run up; max_age 100 s says the two oldest are too old.
    task, times = _task("run_all", materialised=True, max_age=timedelta(seconds=100))
    _create(task, times)
    _come_back(task, times, "monitor")
    statuses, reasons = _outcome(task, times)
    assert statuses == {190: S.CANCELLED, 130: S.CANCELLED, 70: S.SUCCEEDED, 10: S.SUCCEEDED}
    assert reasons == {190: "expired", 130: "expired"}
    details = SkippedOccurrence.objects.filter(task=task).values_list("detail", flat=True)
    assert all("past its max_age of 100s" in detail for detail in details), list(details)
    assert sorted(_claims(task, times).values()) == [1, 1]
