"""Each recovery mechanism on real PostgreSQL and RabbitMQ with real worker processes."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from executions import transitions
from executions.models import TERMINAL_STATUSES, Execution
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tests.factories import UserFactory
from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready
from tms_project.celery import app
from tooling.harness.ledger import LedgerServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: Fast recovery settings for the processes these tests start.
FAST = {
    "TMS_HEARTBEAT_INTERVAL": "0.5",
    "TMS_WORKER_TIMEOUT": "3",
    "TMS_MONITOR_MAX_SLEEP": "0.3",
    "TMS_PENDING_REPUBLISH_AFTER": "2",
    "TMS_MAX_HANDBACKS": "1",
}
RESUMED = "resumed after the previous lease expired"


@pytest.fixture
def owner():
    return UserFactory()


@pytest.fixture
def ledger():
    server = LedgerServer(default_duration=1.0).start()
    yield server
    server.stop()


def _ledger_task(owner, ledger, duration: float, **options):
    config = {"url": ledger.url, "method": "POST", "json": {"duration": duration}, "async": True}
    return task_create(owner=owner, runner="http", config=config, **options)


def _only_execution(task) -> Execution:
    (execution,) = Execution.objects.filter(task=task)
    return execution


def _wait_held(task, timeout: float = 20) -> Execution:
    """Wait until a worker process holds the task's execution; return it."""
    return wait_for(
        lambda: Execution.objects.filter(task=task, status=S.RUNNING).exclude(lease_owner="").first(),
        timeout=timeout,
        what="a worker to hold the execution",
    )


def _terminal_events(execution: Execution) -> int:
    return execution.events.filter(to_status__in=TERMINAL_STATUSES).count()


def _details(execution: Execution) -> list[str]:
    return list(execution.events.values_list("detail", flat=True))


def test_sigkill_of_pool_process_mid_run_is_resumed_same_attempt(owner):
    worker, monitor = start_worker(concurrency=2, **FAST), start_monitor(**FAST)
    with running(worker, monitor):
        wait_worker_ready(worker)
        task = task_create(owner=owner, runner="sleep", config={"duration": "4s"})
        held = _wait_held(task)
        child_pid = int(held.lease_owner.rsplit(":", 1)[1])
        assert child_pid != worker.pid
        os.kill(child_pid, signal.SIGKILL)
        wait_for(lambda: _only_execution(task).status == S.SUCCEEDED, timeout=30, what="SUCCEEDED after the kill")
    execution = _only_execution(task)
    assert execution.attempt == 1
    assert _terminal_events(execution) == 1
    details = _details(execution)
    assert any(d.startswith(f"lease of {held.lease_owner} expired") for d in details)
    assert RESUMED in details
    assert execution.lease_owner == ""


def test_killed_worker_async_run_is_resumed_by_another_worker_without_relaunch(owner, ledger):
    first, second, monitor = start_worker("first", **FAST), start_worker("second", **FAST), start_monitor(**FAST)
    with running(first, second, monitor):
        wait_worker_ready(first)
        wait_worker_ready(second)
        task = _ledger_task(owner, ledger, duration=3.0)
        # Once the run is started and its id recorded, kill the worker that started it.
        wait_for(lambda: _only_execution(task).external_run_id, timeout=20, what="the external run id")
        execution = _only_execution(task)
        run_id = execution.external_run_id
        starter_pid = int(execution.events.get(to_status=S.RUNNING).actor.split(":")[1])
        starter, survivor = (first, second) if starter_pid == first.pid else (second, first)
        starter.signal_group(signal.SIGKILL)
        wait_for(lambda: _only_execution(task).status == S.SUCCEEDED, timeout=30, what="SUCCEEDED")
    execution = _only_execution(task)
    assert execution.external_run_id == run_id
    assert execution.attempt == 1
    assert f":{survivor.pid}:" in execution.events.get(to_status=S.SUCCEEDED).actor
    assert ledger.ledger.launches == {f"tms-{execution.pk}-1": 1}
    assert ledger.ledger.duplicate_launches() == 0
    assert _terminal_events(execution) == 1


def test_whole_worker_killed_while_holding_a_run_is_resumed_by_another(owner):
    doomed, monitor = start_worker("doomed", concurrency=1, **FAST), start_monitor(**FAST)
    with running(doomed, monitor):
        wait_worker_ready(doomed)
        task = task_create(owner=owner, runner="sleep", config={"duration": "3s"})
        held = _wait_held(task)
        assert held.lease_owner.startswith(f"{held.lease_owner.split(':')[0]}:{doomed.pid}:")
        killed_at = timezone.now()
        doomed.signal_group(signal.SIGKILL)
        rescuer = start_worker("rescuer", concurrency=1, **FAST)
        with running(rescuer):
            wait_for(lambda: _only_execution(task).status == S.SUCCEEDED, timeout=30, what="SUCCEEDED")
    execution = _only_execution(task)
    resumed = execution.events.get(detail=RESUMED)
    assert not resumed.actor.startswith(held.lease_owner)
    # Resumed within the lease timeout plus the monitor's sweep (and a little dispatch time).
    assert resumed.at - killed_at < timedelta(seconds=3 + 0.3 + 2)
    assert _terminal_events(execution) == 1


def test_paused_worker_coming_back_changes_nothing(owner):
    zombie, monitor = start_worker("zombie", concurrency=1, **FAST), start_monitor(**FAST)
    with running(zombie, monitor):
        wait_worker_ready(zombie)
        task = task_create(owner=owner, runner="sleep", config={"duration": "2s"})
        held = _wait_held(task)
        zombie.signal_group(signal.SIGSTOP)
        rescuer = start_worker("rescuer", concurrency=1, **FAST)
        with running(rescuer):
            wait_for(lambda: _only_execution(task).status == S.SUCCEEDED, timeout=30, what="SUCCEEDED by the rescuer")
            finished = _only_execution(task)
            zombie.signal_group(signal.SIGCONT)
            # The zombie's sleep ends and it tries to record its outcome: it must lose.
            wait_for(lambda: "lease lost" in zombie.log(), timeout=15, what="the zombie to notice it lost")
    execution = _only_execution(task)
    assert execution.status == S.SUCCEEDED
    assert execution.finished_at == finished.finished_at
    assert _terminal_events(execution) == 1
    succeeded_by = execution.events.get(to_status=S.SUCCEEDED).actor
    assert succeeded_by != held.lease_owner


def test_message_lost_after_pending_is_published_again(owner):
    task = task_create(owner=owner, runner="noop", config={}, start_at=timezone.now() + timedelta(seconds=30))
    execution = _only_execution(task)
    Execution.objects.filter(pk=execution.pk).update(due_at=timezone.now())
    with transaction.atomic():  # a monitor took it and crashed before publishing: no message
        (taken,) = transitions.executions_take_due(limit=10, actor="monitor:crashed")
    assert taken.execution_id == execution.pk
    worker, monitor = start_worker(**FAST), start_monitor(**FAST)
    with running(worker, monitor):
        wait_worker_ready(worker)
        wait_for(lambda: _only_execution(task).status == S.SUCCEEDED, timeout=30, what="SUCCEEDED")
    execution = _only_execution(task)
    republished = execution.events.filter(from_status=S.PENDING, to_status=S.PENDING)
    assert republished.count() == 1
    assert "published again" in republished.get().detail
    assert _terminal_events(execution) == 1


def test_message_for_missing_execution_is_acknowledged_and_dropped():
    worker = start_worker(concurrency=1, **FAST)
    with running(worker):
        wait_worker_ready(worker)
        app.send_task("tms.run_execution", args=(987654321, 1))
        wait_for(lambda: "987654321 attempt 1: lost" in worker.log(), timeout=20, what="the worker to drop the message")
        with app.connection_for_read() as conn:
            from django.conf import settings

            queue = settings.CELERY_TASK_QUEUES[0](conn.default_channel)
            _, messages, _ = queue.queue_declare(passive=True)
        assert messages == 0
    assert "987654321" in worker.log()


def test_work_that_crashes_its_worker_ends_failed_after_max_attempts(owner):
    worker, monitor = start_worker(concurrency=1, **FAST), start_monitor(**FAST)
    with running(worker, monitor):
        wait_worker_ready(worker)
        task = task_create(
            owner=owner, runner="crash", config={}, max_attempts=2, retry_backoff=timedelta(milliseconds=100)
        )
        wait_for(lambda: _only_execution(task).status == S.FAILED, timeout=90, what="FAILED after the crash loop")
        assert worker.alive
    execution = _only_execution(task)
    assert execution.attempt == 2
    assert "giving up on this attempt" in execution.error
    assert _terminal_events(execution) == 1
    # Two attempts, each started once and restarted once (MAX_HANDBACKS=1) before giving up.
    assert execution.events.filter(detail__startswith="lease of").count() == 4


def test_worker_that_cannot_heartbeat_for_its_timeout_exits():
    from django.conf import settings

    from tests.tcp_proxy import TcpProxy

    db = settings.DATABASES["default"]
    proxy = TcpProxy(int(db["PORT"] or 5432))
    url = f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}"
    worker = start_worker(concurrency=1, DATABASE_URL=url, **FAST)
    try:
        with running(worker):
            wait_worker_ready(worker)
            wait_for(lambda: "registered" in worker.log(), timeout=10, what="the worker to register")
            proxy.cut()  # the database is gone for this worker only
            cut_at = time.monotonic()
            wait_for(lambda: not worker.alive, timeout=30, what="the worker to exit")
            exited_after = time.monotonic() - cut_at
    finally:
        proxy.close()
    assert "could not heartbeat" in worker.log()
    # It waited for its timeout (3 s) before giving up, and did not linger long after it.
    assert 3 <= exited_after < 20
