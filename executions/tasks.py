"""Celery tasks: thin wrappers that take ids and call one service each."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import Task, shared_task
from celery.signals import (
    celeryd_init,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
)
from django.db import connections, transaction

from executions import heartbeat, materialiser, retention, rollup, transitions, worker_services, workflow_control
from executions.messages import group_runs, send, send_many
from executions.notify import notify_due
from executions.worker_identity import lease_owner, set_node_id
from runners.registry import all_runners
from tms_core import logcontext, metrics, tracing
from tms_core.conf import tms_settings

logger = logging.getLogger(__name__)

#: Database outages are retried by republishing with backoff; the row stays the source of truth.
_DB_RETRY: dict[str, Any] = {
    "autoretry_for": worker_services.RETRIED_DB_ERRORS,
    "retry_backoff": True,
    "retry_backoff_max": 30,
    "max_retries": None,
}


@worker_init.connect
def _prepare_worker(sender: Any, **kwargs: Any) -> None:
    set_node_id()
    # Workers get through a dropped database connection by retrying (autoretry_for below, and
    # executions.runs.persist), so they skip Django's per-task health-check query.
    for conn in connections.all():
        conn.settings_dict["CONN_HEALTH_CHECKS"] = False
    # Before the pool forks: its processes share the runners' SDKs instead of each importing them
    # at its first run (the other processes never import them).
    for runner in all_runners().values():
        runner.preload()


@worker_process_init.connect
def _leave_the_worker_process_group(**kwargs: Any) -> None:
    """A prefork pool process leaves its worker's process group, so that a stop sent to the group
    reaches the worker's main process alone, which then stops its pool in order.

    A terminal's Ctrl-C, ``make run``'s process manager (honcho) and ``kill -TERM -<pgid>`` signal
    the whole group. A pool process that died of that signal while it held its pool's shared queue
    lock (an idle process of the embedded broker's pool waits for work holding it) left the main
    process blocked for ever at exit, in billiard's pool finaliser (issue 34); and a busy one lost
    its run halfway instead of finishing it within the shutdown grace or being handed back
    (``heartbeat.worker_hand_back``). The main process still stops its pool processes itself:
    billiard signals each by pid, and the hand-back kills by pid.
    """
    with contextlib.suppress(OSError):  # not permitted (a session leader): stay where it is
        os.setpgid(0, 0)


#: Seconds a worker may take to exit once Celery has stopped it (its pool included) before the
#: exit watchdog ends the process.
EXIT_WATCHDOG = 10.0

#: Set in a process started by ``celery worker`` (not in a worker embedded in another program,
#: whose exit is not the worker's to bound).
_worker_command: list[bool] = []


@celeryd_init.connect
def _started_by_the_worker_command(**kwargs: Any) -> None:
    _worker_command.append(True)


@worker_shutdown.connect
def _bound_the_exit(**kwargs: Any) -> None:
    """Once Celery has stopped the worker, its process ends within :data:`EXIT_WATCHDOG` seconds.

    Only the interpreter's exit is left by then: its runs have ended or been handed back and its
    pool is stopped. A finaliser that blocks there (billiard's pool finaliser waited for ever on a
    queue lock a dead pool process held: issue 34) would keep a process that consumes nothing
    alive for good, and a service manager waiting on it; this thread ends it instead.
    """
    if not _worker_command:
        return

    def watch() -> None:
        time.sleep(EXIT_WATCHDOG)
        logger.critical("worker still exiting %.0fs after it stopped; ending the process", EXIT_WATCHDOG)
        logging.shutdown()
        os._exit(70)  # EX_SOFTWARE: the stop itself completed, the interpreter's exit did not

    threading.Thread(target=watch, name="tms-exit-watchdog", daemon=True).start()


@worker_process_shutdown.connect
def _forget_process_metrics(pid: int | None = None, **kwargs: Any) -> None:
    """A prefork child exits: drop its live-gauge files from the multiprocess metrics folder
    (its counters and histograms stay in the totals; see tms_core/metrics.py), and export the
    spans it still holds (tracing on)."""
    metrics.mark_process_dead(pid or os.getpid())
    tracing.flush()


@task_prerun.connect
def drop_unusable_connections(**kwargs: Any) -> None:
    """Start every task on a usable database connection, as Django does per request.

    With ``CELERY_DB_REUSE_MAX`` Celery keeps a pool process's connection across tasks and never
    checks it, so after a PostgreSQL restart each retry of a task met the same dead connection
    ("connection already closed") until its backoff reached tens of seconds. A connection whose
    last use raised a database error is pinged once here and replaced if dead; a healthy one
    costs nothing (health checks stay off).
    """
    for conn in connections.all(initialized_only=True):
        conn.close_if_unusable_or_obsolete()


#: Celery task names whose first two arguments are (execution id, attempt).
EXECUTION_TASKS = frozenset({"tms.run_execution", "tms.poll_execution"})


@task_prerun.connect
def bind_execution_ids(sender: Any = None, task_id: str | None = None, args: Any = (), **kwargs: Any) -> None:
    """Every line logged while a pool process handles an execution's message carries its ids
    (the task's id and tracing id are added once the row is loaded: executions.worker_services)."""
    if getattr(sender, "name", None) in EXECUTION_TASKS and len(args) >= 2:
        sender.request.tms_log_token = logcontext.bind(
            execution_id=args[0], attempt=args[1], worker_id=lease_owner(), celery_task_id=task_id
        )


@task_postrun.connect
def unbind_execution_ids(sender: Any = None, **kwargs: Any) -> None:
    token = getattr(getattr(sender, "request", None), "tms_log_token", None)
    if token is not None:
        logcontext.unbind(token)
        sender.request.tms_log_token = None


def _note_redelivery(task: Task, execution_id: int) -> None:
    if (task.request.delivery_info or {}).get("redelivered"):
        logger.info("redelivered message %s for execution %s", task.request.id, execution_id)


def publish_steps(taken: list[transitions.Dispatch]) -> None:
    """Publish the workflow steps this process's ending writes took (``transitions.publishing_steps``),
    grouped as the monitor groups a herd: the steps a chunk's ends created go out together. A
    group the broker refuses goes back to SCHEDULED for the monitor (woken at once)."""
    for group in group_runs(taken, most=tms_settings().DISPATCH_BATCH, spread=1):
        try:
            if len(group) == 1:
                send(run_execution, group[0], None)
            else:
                send_many(run_executions, group, None)
        except Exception as exc:  # noqa: BLE001 - any broker error: the monitor publishes them instead
            logger.warning("could not publish %d workflow step(s) (%s); the monitor will", len(group), exc)
            try:
                with transaction.atomic():
                    transitions.executions_untake(
                        dispatches=group, actor=transitions.WORKFLOW_ACTOR, reason=f"could not be published: {exc}"
                    )
                    notify_due()
            except Exception:
                logger.warning("could not give %d workflow step(s) back either", len(group), exc_info=True)


def _hand_on(priority: int | None) -> Callable[[list[tuple[int, int]]], bool]:
    """A message's ``hand_on``: its runs not claimed within its budget go in a message of their own."""

    def hand_on(rest: list[tuple[int, int]]) -> bool:
        try:
            run_executions.apply_async(args=(rest,), priority=priority, retry=False)
        except Exception as exc:  # noqa: BLE001 - any broker error: this process runs them itself
            logger.warning("could not hand %d run(s) on (%s); running them here", len(rest), exc)
            return False
        return True

    return hand_on


@shared_task(name="tms.run_execution", bind=True, ignore_result=True, **_DB_RETRY)
def run_execution(self: Task, execution_id: int, attempt: int) -> str:
    _note_redelivery(self, execution_id)
    # The steps its end creates run next in this process, as a message of several runs would.
    steps: list[transitions.Dispatch] = []
    try:
        with transitions.publishing_steps(steps.extend):
            word = worker_services.execution_run(execution_id=execution_id, attempt=attempt, worker_id=lease_owner())
            if steps:
                priority = (self.request.delivery_info or {}).get("priority")
                worker_services.executions_run_batch(
                    items=[], worker_id=lease_owner(), hand_on=_hand_on(priority), more=steps
                )
    finally:
        if steps:  # its end committed, then an error: they go out as messages
            publish_steps(steps)
    return word


@shared_task(name="tms.run_executions", bind=True, ignore_result=True, **_DB_RETRY)
def run_executions(self: Task, items: list[list[int]]) -> dict[str, int]:
    """Several runs in one message (the monitor groups a herd: executions.monitor)."""
    if (self.request.delivery_info or {}).get("redelivered"):
        logger.info("redelivered message %s for %d executions", self.request.id, len(items))
    priority = (self.request.delivery_info or {}).get("priority")
    # The steps its runs' ends create are handled next in this process, within its budget.
    steps: list[transitions.Dispatch] = []
    with (
        logcontext.log_context(worker_id=lease_owner(), celery_task_id=self.request.id),
        transitions.publishing_steps(steps.extend),
    ):
        return dict(
            worker_services.executions_run_batch(
                items=items, worker_id=lease_owner(), hand_on=_hand_on(priority), more=steps
            )
        )


@shared_task(name="tms.poll_execution", bind=True, ignore_result=True, **_DB_RETRY)
def poll_execution(self: Task, execution_id: int, attempt: int) -> str:
    _note_redelivery(self, execution_id)
    with transitions.publishing_steps(publish_steps):
        return worker_services.execution_resume(execution_id=execution_id, attempt=attempt, worker_id=lease_owner())


# Housekeeping (every beat system job) sends no task events: Flower lists executions' tasks and
# notification deliveries, not a materialise and a liveness sweep every 5 seconds and a rollup
# fold every minute (an execution's own outcome is its row, not its Celery task's).
@shared_task(name="tms.materialise", ignore_result=True, send_events=False)
def materialise() -> int:
    return materialiser.materialise_due()


@shared_task(name="tms.liveness", ignore_result=True, send_events=False)
def liveness() -> list[str]:
    return heartbeat.workers_mark_dead(timeout=tms_settings().WORKER_TIMEOUT)


@shared_task(name="tms.rollup_prune", ignore_result=True, send_events=False)
def rollup_prune() -> tuple[int, int]:
    return rollup.rollup_prune()


@shared_task(name="tms.rollup_compact", ignore_result=True, send_events=False)
def rollup_compact() -> int:
    return rollup.rollup_compact()


@shared_task(name="tms.workflow_timeouts", ignore_result=True, send_events=False)
def workflow_timeouts() -> list[int]:
    """Cancel the workflow runs past their root task's ``workflow_timeout``."""
    return workflow_control.workflow_runs_time_out()


@shared_task(name="tms.workflow_retries", ignore_result=True, send_events=False)
def workflow_retries() -> list[int]:
    """Retry the failed workflow runs whose root task asks for it (``workflow_retries``)."""
    return workflow_control.workflow_runs_retry_failed()


@shared_task(name="tms.prune", ignore_result=True, send_events=False)
def prune() -> int:
    """Beat's retention run; stops after half its interval, the next run goes on."""
    report = retention.retention_prune(max_seconds=tms_settings().RETENTION_INTERVAL / 2)
    return report.executions
