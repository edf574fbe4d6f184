"""Issue 15, finding 10: a live worker marked DEAD comes back ALIVE when its heartbeat resumes.

The worker is a real process, paused with SIGSTOP (its heartbeats stop while it lives on) for
longer than TMS_WORKER_TIMEOUT; the liveness sweep then marks it DEAD and hands its leases back.
When it is continued, its next heartbeat brings its row back ALIVE and its log says so.
"""

from __future__ import annotations

import signal
import time

import pytest

from executions.heartbeat import workers_mark_dead
from executions.models import Worker, WorkerStatus
from tests.processes import running, start_worker, wait_for, wait_worker_ready

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = {"TMS_HEARTBEAT_INTERVAL": "0.5", "TMS_WORKER_TIMEOUT": "3"}


def _row(proc) -> Worker:
    return Worker.objects.get(pid=proc.pid)


def test_a_worker_marked_dead_while_paused_comes_back_alive(staff_client):
    with running(start_worker("revived", concurrency=1, **FAST)) as (worker,):
        wait_worker_ready(worker)
        row = wait_for(lambda: Worker.objects.filter(pid=worker.pid, status=WorkerStatus.ALIVE).first(), timeout=20)
        worker.signal_group(signal.SIGSTOP)  # heartbeats stop; the process lives on
        try:
            time.sleep(4)
            assert workers_mark_dead(timeout=3) == [row.id]
            assert _row(worker).status == WorkerStatus.DEAD
        finally:
            worker.signal_group(signal.SIGCONT)
        wait_for(lambda: _row(worker).status == WorkerStatus.ALIVE, timeout=10, what="the row to come back ALIVE")
        listed = {w["id"]: w for w in staff_client.get("/api/v1/workers").json()["results"]}
        assert listed[row.id]["status"] == "ALIVE"
        assert worker.alive
    assert "was marked DEAD (its heartbeat was silent); its heartbeat resumed: ALIVE again" in worker.log()


def test_a_worker_whose_row_was_removed_while_paused_registers_again():
    with running(start_worker("reregistered", concurrency=1, **FAST)) as (worker,):
        wait_worker_ready(worker)
        row = wait_for(lambda: Worker.objects.filter(pid=worker.pid).first(), timeout=20)
        worker.signal_group(signal.SIGSTOP)
        try:
            Worker.objects.filter(pk=row.pk).delete()
        finally:
            worker.signal_group(signal.SIGCONT)
        revived = wait_for(
            lambda: Worker.objects.filter(pk=row.pk, status=WorkerStatus.ALIVE).first(),
            timeout=10,
            what="the row to be registered again",
        )
        assert (revived.pid, revived.hostname) == (row.pid, row.hostname)
    assert "had no row any more; its heartbeat registered it again" in worker.log()
