"""SIGTERM stops the monitor and beat cleanly between passes: the real processes exit 0 within a
bound, and what they were doing is whole (every batch the monitor took was published, nothing
more; beat saved its schedule on the way out)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from amqp.exceptions import NotFound
from django.conf import settings
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from kombu import Connection

from executions import transitions
from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.periodic import register_periodic_tasks
from tests.factories import TaskFactory
from tests.processes import LOG_DIR, ROOT, ManagedProcess, process_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BATCH = 50
BACKLOG = 20_000


def _runs_in_queue() -> int:
    """Runs in the queued messages (a message of several runs counts each; it takes them all)."""
    runs = 0
    with Connection(settings.CELERY_BROKER_URL) as conn:
        channel = conn.default_channel
        while (message := channel.basic_get(settings.TMS_QUEUE, no_ack=True)) is not None:
            args = json.loads(message.body)[0]
            runs += len(args[0]) if message.headers["task"] == "tms.run_executions" else 1
    return runs


def _purge_queue() -> None:
    """Empty the suite's execution queue (a queue nobody declared yet holds nothing)."""
    with Connection(settings.CELERY_BROKER_URL) as conn, contextlib.suppress(NotFound):
        conn.default_channel.queue_purge(settings.TMS_QUEUE)


def _stop_and_time(proc: ManagedProcess, timeout: float) -> float:
    """SIGTERM ``proc`` (its main process only, as a container platform does); seconds until it exited."""
    sent = time.monotonic()
    proc.popen.send_signal(signal.SIGTERM)
    proc.popen.wait(timeout)
    return time.monotonic() - sent


def _monitor(name: str) -> ManagedProcess:
    argv = [sys.executable, "manage.py", "run_monitor", "--batch", str(BATCH)]
    # Unpaced (no fair share): with no worker to start runs, a paced monitor would publish only its
    # floor and then sleep; the backlog here must be published batch after batch.
    return ManagedProcess(name, argv, process_env(TMS_MONITOR_QUEUE_SECONDS="0"), LOG_DIR)


def test_sigterm_stops_the_monitor_between_batches_of_a_backlog_with_every_taken_batch_published():
    # The queue is the suite's: an earlier test's worker stopped while it held a prefetched
    # message gives it back to the queue (seen: a requeued run of test_graceful_shutdown, counted
    # here as a 251st run). Only what this monitor publishes is counted.
    _purge_queue()
    task = TaskFactory()
    now = timezone.now()
    transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, now - timedelta(seconds=1, milliseconds=i), 5) for i in range(BACKLOG)],
        actor="test",  # type: ignore[arg-type]
    )
    monitor = _monitor("monitor-stop-busy")
    try:
        wait_for(
            lambda: Execution.objects.filter(status=S.PENDING).count() >= 4 * BATCH,
            timeout=60,
            interval=0.02,
            what="the monitor to be publishing the backlog",
        )
        took = _stop_and_time(monitor, timeout=30)
        code = monitor.popen.returncode
        log = monitor.log()
        pending = Execution.objects.filter(status=S.PENDING).count()
        scheduled = Execution.objects.filter(status=S.SCHEDULED).count()
        published = _runs_in_queue()
    finally:
        monitor.stop()
        _purge_queue()
    print(f"monitor stopped {took:.2f}s after SIGTERM, mid-backlog: {pending} published, {scheduled} left")
    assert code == 0, log[-3000:]
    assert "stopped; monitor stats" in log and "Traceback" not in log
    # It stopped in the middle of the backlog, after a whole batch: the rest is due for another monitor.
    assert scheduled > 0 and pending + scheduled == BACKLOG
    assert pending % BATCH == 0
    # Every execution it marked PENDING was published (publisher confirms), and nothing else.
    assert published == pending
    # Bound: the batch in hand (the suite's MONITOR_MAX_SLEEP is 0.5 s).
    assert took < 10


def test_sigterm_stops_a_sleeping_monitor_at_once():
    monitor = _monitor("monitor-stop-idle")
    try:
        wait_for(lambda: "started (batch" in monitor.log(), timeout=30, what="the monitor to start")
        time.sleep(1.0)  # a few empty passes: it is waiting for a NOTIFY or its next pass
        took = _stop_and_time(monitor, timeout=30)
    finally:
        monitor.stop()
    print(f"idle monitor stopped {took:.2f}s after SIGTERM")
    assert monitor.popen.returncode == 0
    assert "stopped; monitor stats" in monitor.log()
    assert took < 5  # MONITOR_MAX_SLEEP (0.5 s here) at most, plus start-up of nothing


def test_sigterm_stops_beat_between_ticks_and_it_saves_its_schedule():
    """Beat as the docker role and `make run` start it (the entrypoint's command), with the level
    from TMS_LOG_LEVEL alone (no -l): DEBUG shows its "Waking up" lines."""
    register_periodic_tasks()
    PeriodicTask.objects.update(last_run_at=None)
    beat = ManagedProcess(
        "beat-stop",
        ["sh", str(ROOT / "docker" / "entrypoint.sh"), "beat"],
        process_env(
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            TMS_LOG_LEVEL="DEBUG",
            TMS_LOG_HOUSEKEEPING="true",
        ),
        LOG_DIR,
    )
    try:
        wait_for(
            lambda: "Sending due task tms: materialise upcoming executions" in beat.log(),
            timeout=60,
            what="beat to send the materialiser job",
        )
        # "Waking up in 1.00 second." or, with sub-second jobs (the notification dispatch), "now".
        wait_for(lambda: "beat: Waking up" in beat.log(), timeout=30, what="beat to sleep between ticks")
        took = _stop_and_time(beat, timeout=30)
    finally:
        beat.stop()
    log = beat.log()
    print(f"beat stopped {took:.2f}s after SIGTERM")
    assert beat.popen.returncode == 0, log[-3000:]
    assert "beat: Shutting down" in log
    assert "Traceback" not in log and "beat raised exception" not in log
    # Bound: a tick in progress finishes, then at most one sleep (beat's max interval, 5 s).
    assert took < 8
    # The schedule was saved on the way out: the jobs it sent carry their last run time.
    job = PeriodicTask.objects.get(name="tms: materialise upcoming executions")
    assert job.last_run_at is not None and job.total_run_count >= 1
