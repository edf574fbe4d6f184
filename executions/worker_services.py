"""What a worker does with an execution: claim it, drive its runner, record the outcome.

Every write goes through :mod:`executions.transitions` and is fenced by the attempt number and
this process's lease; a write that loses means another worker (or a cancel) took over, and this
worker stops working on the execution at once.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from executions import transitions
from executions.backoff import exponential_backoff
from executions.clock import db_now
from executions.conf import tms_settings
from executions.models import Execution
from executions.notify import notify_due
from runners.base import BaseRunner, RunHandle, RunnerError, RunResult, RunSpec, RunState
from runners.registry import UnknownRunner, get_runner
from tasks_app.models import Task

logger = logging.getLogger(__name__)

#: Polling of asynchronous runs: first delay, growth factor and cap, in seconds.
POLL_BASE, POLL_FACTOR, POLL_CAP = 1.0, 2.0, 60.0

T = TypeVar("T")


@contextmanager
def keep_lease(*, execution_id: int, attempt: int, worker_id: str) -> Iterator[threading.Event]:
    """Extend this process's lease on an execution every heartbeat while the block runs.

    The lease lives exactly as long as the work: when this process dies (SIGKILL, OOM) or is
    paused (SIGSTOP), nobody extends it, it expires, and the monitor hands the execution to
    another worker. The yielded event is set if an extension lost (another worker took over).
    Short runs never touch the database from here: the first extension is one interval away.
    """
    conf = tms_settings()
    stop, lost = threading.Event(), threading.Event()

    def extend() -> None:
        try:
            while not stop.wait(conf.HEARTBEAT_INTERVAL):
                try:
                    if not transitions.execution_extend_lease(
                        execution_id=execution_id,
                        attempt=attempt,
                        worker_id=worker_id,
                        lease_seconds=conf.WORKER_TIMEOUT,
                    ):
                        lost.set()
                        logger.warning("execution %s: lease lost to another worker", execution_id)
                        return
                except DatabaseError as exc:
                    logger.warning("execution %s: lease extension failed (%s)", execution_id, exc)
                    connection.close()
        finally:
            connection.close()

    thread = threading.Thread(target=extend, name=f"tms-lease-{execution_id}", daemon=True)
    thread.start()
    try:
        yield lost
    finally:
        stop.set()
        thread.join(timeout=10)


def _persist(write: Callable[[], T]) -> T:
    """Run a final write, retrying through a database outage for up to half a lease.

    A run's outcome is recorded or the message is not acknowledged: if the database stays away
    longer the error propagates, the lease runs out and another worker resumes the attempt.
    """
    deadline = time.monotonic() + tms_settings().WORKER_TIMEOUT / 2
    delay = 0.2
    while True:
        try:
            return write()
        except (OperationalError, InterfaceError):
            if time.monotonic() + delay > deadline:
                raise
            logger.warning("database unavailable while recording an outcome; retrying in %.1fs", delay)
            connection.close()
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def run_spec(execution: Execution, task: Task) -> RunSpec:
    return RunSpec(
        execution_id=execution.pk,
        attempt=execution.attempt,
        task_id=str(task.pk),
        config=get_runner(task.runner).validate_config(task.config),
        timeout=task.timeout.total_seconds(),
        tracing_id=task.tracing_id,
    )


def _load(execution_id: int) -> tuple[Execution, Task] | None:
    execution = Execution.objects.select_related("task").filter(pk=execution_id).first()
    if execution is None:
        return None
    return execution, execution.task


def execution_run(*, execution_id: int, attempt: int, worker_id: str) -> str:
    """Handle a ``run_execution`` message: claim, start the runner, record what it returns.

    Returns a short word for logs and tests: ``lost`` (the claim lost), ``finished`` or ``polling``.
    """
    conf = tms_settings()
    if not transitions.execution_claim(
        execution_id=execution_id, attempt=attempt, worker_id=worker_id, lease_seconds=conf.WORKER_TIMEOUT
    ):
        logger.info("execution %s attempt %s: claim lost (already taken, cancelled or gone)", execution_id, attempt)
        return "lost"
    loaded = _load(execution_id)
    if loaded is None:  # deleted between claim and load
        return "lost"
    execution, task = loaded
    with keep_lease(execution_id=execution_id, attempt=attempt, worker_id=worker_id):
        return _start(execution, task, worker_id)


def execution_resume(*, execution_id: int, attempt: int, worker_id: str) -> str:
    """Handle a ``poll_execution`` message: lease the RUNNING execution, then poll its external
    run, or, if its worker died before a run id was recorded, start it again with the same
    idempotency key (the runner adopts an existing run instead of launching a second one)."""
    conf = tms_settings()
    if not transitions.execution_acquire(
        execution_id=execution_id, attempt=attempt, worker_id=worker_id, lease_seconds=conf.WORKER_TIMEOUT
    ):
        return "lost"
    loaded = _load(execution_id)
    if loaded is None:
        return "lost"
    execution, task = loaded
    with keep_lease(execution_id=execution_id, attempt=attempt, worker_id=worker_id):
        return _resume(execution, task, worker_id)


def _resume(execution: Execution, task: Task, worker_id: str) -> str:
    if not execution.external_run_id:
        # Its worker died before a run id was recorded. Start again with the same idempotency
        # key (the runner adopts a run it already launched), unless this keeps happening.
        if execution.handbacks > tms_settings().MAX_HANDBACKS:
            error = f"worker lost {execution.handbacks} times before the run started; giving up on this attempt"
            return _finish(execution, task, worker_id, RunResult.failed(error))
        return _start(execution, task, worker_id)
    try:
        runner = get_runner(task.runner)
        spec = run_spec(execution, task)
        handle = RunHandle(execution.external_run_id, execution.run_handle)
    except (UnknownRunner, Exception) as exc:  # noqa: BLE001 - bad config must end the attempt, not loop
        return _finish(execution, task, worker_id, RunResult.failed(_describe(exc), retryable=False))
    result = _call(runner.poll, spec, handle)
    if result.state is RunState.RUNNING:
        elapsed = (db_now() - execution.started_at) if execution.started_at else timedelta(0)
        if elapsed > task.timeout:
            _call(runner.cancel, spec, handle)
            result = RunResult.failed(f"timed out after {task.timeout.total_seconds():g}s; external run cancelled")
        else:
            delay = exponential_backoff(attempt=execution.poll_count, base=POLL_BASE, factor=POLL_FACTOR, cap=POLL_CAP)
            _persist(
                lambda: transitions.execution_release(
                    execution_id=execution.pk, attempt=execution.attempt, worker_id=worker_id, poll_in=delay
                )
            )
            return "polling"
    return _finish(execution, task, worker_id, result, external_run_id=handle.external_run_id)


def _start(execution: Execution, task: Task, worker_id: str) -> str:
    try:
        runner: BaseRunner = get_runner(task.runner)
        spec = run_spec(execution, task)
    except (UnknownRunner, Exception) as exc:  # noqa: BLE001
        return _finish(execution, task, worker_id, RunResult.failed(_describe(exc), retryable=False))
    try:
        handle = runner.start(spec)
    except RunnerError as exc:
        return _finish(execution, task, worker_id, RunResult.failed(str(exc), retryable=exc.retryable))
    except Exception as exc:
        logger.exception("runner %s crashed starting execution %s", task.runner, execution.pk)
        return _finish(execution, task, worker_id, RunResult.failed(_describe(exc)))
    if handle.result is not None:
        return _finish(execution, task, worker_id, handle.result, external_run_id=handle.external_run_id)
    # Asynchronous run: store its id before anything waits on it, then let the monitor poll it.
    recorded = _persist(
        lambda: transitions.execution_record_run(
            execution_id=execution.pk,
            attempt=execution.attempt,
            worker_id=worker_id,
            external_run_id=handle.external_run_id,
            run_handle=handle.data,
            poll_in=POLL_BASE,
        )
    )
    if not recorded:
        logger.warning("execution %s: lease lost before the run id was recorded; cancelling run", execution.pk)
        _call(runner.cancel, spec, handle)
        return "lost"
    return "polling"


def _finish(
    execution: Execution, task: Task, worker_id: str, result: RunResult, *, external_run_id: str | None = None
) -> str:
    conf = tms_settings()
    common = {
        "execution_id": execution.pk,
        "attempt": execution.attempt,
        "worker_id": worker_id,
        "max_chars": conf.OUTPUT_MAX_CHARS,
        "external_run_id": external_run_id,
    }
    if result.state is RunState.SUCCEEDED:
        won = _persist(lambda: transitions.execution_succeed(output=result.output, **common))
    else:
        retry_in = None
        if result.retryable and execution.attempt < task.max_attempts:
            retry_in = exponential_backoff(
                attempt=execution.attempt,
                base=task.retry_backoff.total_seconds(),
                cap=task.retry_backoff_max.total_seconds(),
                jitter=task.retry_jitter,
            )
        won = _persist(
            lambda: transitions.execution_fail(error=result.error, output=result.output, retry_in=retry_in, **common)
        )
        if won and retry_in is not None and retry_in < conf.MONITOR_MAX_SLEEP:
            notify_due()
    if not won:
        logger.warning("execution %s attempt %s: outcome not recorded, lease lost", execution.pk, execution.attempt)
        return "lost"
    return "finished"


def _call(method, *args) -> RunResult:  # type: ignore[no-untyped-def]
    try:
        result = method(*args)
    except RunnerError as exc:
        return RunResult.failed(str(exc), retryable=exc.retryable)
    except Exception as exc:
        logger.exception("runner call %s failed", getattr(method, "__qualname__", method))
        return RunResult.failed(_describe(exc))
    return result if isinstance(result, RunResult) else RunResult.running()


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()
