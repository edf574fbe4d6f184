"""SIGTERM to a worker (Celery's warm shutdown): short runs finish on it; a long run's pool
process is stopped after TMS_SHUTDOWN_GRACE and its lease handed back at once, so another worker
resumes the same attempt (one launch: the subprocess runner adopts its run) without waiting for
the lease to expire. Real worker, monitor, PostgreSQL and RabbitMQ processes."""

from __future__ import annotations

import json
import signal
import statistics
import time
from pathlib import Path

import pytest
from django.conf import settings

from executions.models import Execution
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tests.factories import UserFactory
from tests.processes import LOG_DIR, running, start_monitor, start_worker, wait_for, wait_worker_ready

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

GRACE = 1.5
# Leases far longer than the test: a resume can only come from the hand-back, not from expiry.
ENV = {
    "TMS_HEARTBEAT_INTERVAL": "0.5",
    "TMS_WORKER_TIMEOUT": "60",
    "TMS_MONITOR_MAX_SLEEP": "0.3",
    "TMS_SHUTDOWN_GRACE": str(GRACE),
    # The subprocess runner waits for its command inside the worker: a run that holds a pool process.
    "TMS_SUBPROCESS_INLINE_WAIT": "60",
}


def _only(task) -> Execution:
    (execution,) = Execution.objects.filter(task=task)
    return execution


def _launches(execution: Execution) -> int:
    folder = Path(settings.TMS_RUNNERS["subprocess"]["OPTIONS"]["work_dir"]) / f"tms-{execution.pk}-1"
    return len((folder / "launches").read_text().splitlines())


def _running_on(task, worker) -> bool:
    execution = _only(task)
    return execution.status == S.RUNNING and execution.lease_owner.split(":")[1:2] == [str(worker.pid)]


def test_short_run_finishes_on_the_stopping_worker():
    owner = UserFactory()
    worker = start_worker("short", concurrency=1, **{**ENV, "TMS_SHUTDOWN_GRACE": "5"})
    with running(worker, start_monitor(**ENV)):
        wait_worker_ready(worker)
        task = task_create(owner=owner, runner="subprocess", config={"command": ["sleep", "1.5"]})
        wait_for(lambda: _running_on(task, worker), timeout=20, what="the run to start")
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.popen.wait(15) == 0
    execution = _only(task)
    assert execution.status == S.SUCCEEDED and execution.attempt == 1
    assert not execution.events.filter(detail__contains="handed back").exists()
    assert execution.events.get(to_status=S.SUCCEEDED).actor.split(":")[1] == str(worker.pid)


def _one_round(owner) -> float:
    workers = [start_worker(f"sigterm-{name}", concurrency=1, **ENV) for name in ("a", "b")]
    with running(*workers, start_monitor(**ENV)):
        for worker in workers:
            wait_worker_ready(worker)
        # Both workers are up before the run exists: whichever takes it is stopped (A, with one pool
        # process, takes nothing more meanwhile) and the other (B) resumes it. The run need only
        # outlast the grace and a monitor pass, not a worker's start: 10 s.
        task = task_create(owner=owner, runner="subprocess", config={"command": ["sleep", "10"]})
        a = wait_for(
            lambda: next((worker for worker in workers if _running_on(task, worker)), None),
            timeout=20,
            what="the run to start",
        )
        b = next(worker for worker in workers if worker is not a)
        sent = time.time()
        a.popen.send_signal(signal.SIGTERM)
        wait_for(lambda: _running_on(task, b), timeout=20, what="B to resume the run")
        resumed = _only(task).events.get(detail="resumed after the previous lease expired")
        assert a.popen.wait(10) == 0, a.log()[-3000:]
        wait_for(lambda: _only(task).status == S.SUCCEEDED, timeout=45, what="SUCCEEDED on B")
    execution = _only(task)
    assert execution.attempt == 1 and execution.handbacks == 1
    assert _launches(execution) == 1
    assert execution.events.get(to_status=S.SUCCEEDED).actor.split(":")[1] == str(b.pid)
    assert resumed.actor.split(":")[1] == str(b.pid)
    assert "handing back" in a.log()
    return resumed.at.timestamp() - sent


def test_sigterm_hands_a_long_run_to_another_worker_with_one_launch():
    owner = UserFactory()
    delays = [_one_round(owner) for _ in range(3)]
    report = {"grace": GRACE, "resume_after_sigterm": [round(d, 3) for d in delays]}
    report |= {"p50": round(statistics.median(delays), 3), "max": round(max(delays), 3)}
    (LOG_DIR / "sigterm-resume.json").write_text(json.dumps(report))
    print("SIGTERM resume times:", report)
    # The grace, then one monitor pass (0.3 s here) and a claim; far below the 60 s lease.
    assert all(GRACE <= d < GRACE + 5 for d in delays), report
