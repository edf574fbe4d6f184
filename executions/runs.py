"""An execution's external run, as every process that handles one sees it.

The worker starts and polls runs (:mod:`executions.worker_services`), the web process records
what a job reports through its callback URL (:mod:`executions.reports`) and stops the runs of
cancelled executions (:mod:`executions.services`). What they share lives here, below all three:
the spec a runner is given, recording an attempt's outcome, and stopping a run after a cancel.
"""

from __future__ import annotations

import copy
import enum
import logging
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial, wraps
from typing import Any, TypeVar, cast

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from executions import limits, traces, transitions
from executions.backoff import exponential_backoff
from executions.callbacks import callback_token, callback_url
from executions.event_waits import event_lookup_for
from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.notify import notify_due
from runners.base import RunHandle, RunResult, RunSpec, RunState
from runners.registry import UnknownRunner, get_runner
from tasks_app.artifacts import artifact_local_path
from tasks_app.models import Task
from tasks_app.run_config import config_for_run
from tasks_app.run_input import input_schema_problem
from tasks_app.secrets import config_open, redact, secret_values
from tms_core import tracing
from tms_core.conf import tms_settings

logger = logging.getLogger(__name__)

T = TypeVar("T")


def describe_error(exc: BaseException, *, limit: int | None = None) -> str:
    """One line naming an exception and its message (``limit`` bounds its length)."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text if limit is None else text[:limit]


def load_execution(execution_id: int) -> tuple[Execution, Task] | None:
    """The execution with its task (and the task's artifact) in one query; None if it is gone.
    The task's config is the run's (:func:`task_for_run`)."""
    execution = Execution.objects.select_related("task", "task__artifact").filter(pk=execution_id).first()
    if execution is None:
        return None
    return execution, task_for_run(execution, execution.task)


def task_for_run(execution: Execution, task: Task) -> Task:
    """``task`` as this run sees it: with the run's own config (a replay's override, stored
    sealed like a task's) in place of the task's, so that what reads ``task.config`` for the run
    (the secrets redacted from its output and logs, a named limit's host) reads the run's. A copy
    in memory, never saved; the task itself when the run has no config of its own."""
    if execution.config_override is None:
        return task
    seen = copy.copy(task)
    seen.config = execution.config_override
    return seen


def run_config(execution: Execution, task: Task, *, starting: bool = False) -> Any:
    """The config (plain: secrets decrypted) the runner gets for this run: the task's, or the
    run's own (a replay's), with the task's ``input_fills`` set from the run's ``input``; when
    those send the run elsewhere, without the config's secrets (:func:`config_for_run`)."""
    stored = execution.config_override if execution.config_override is not None else task.config
    config, dropped = config_for_run(
        runner=task.runner,
        config=config_open(stored),
        secret_fields=task.secret_fields or [],
        run_input=execution.input,
        fills=task.input_fills,
    )
    if dropped and starting:
        logger.warning(
            "execution %s: its input sends the run elsewhere (input_fills), so the config's secrets %s are "
            "left out of it",
            execution.pk,
            ", ".join(dropped),
        )
    return config


def run_spec(
    execution: Execution,
    task: Task,
    *,
    starting: bool = False,
    resend: bool = False,
    handed_on: tuple[str, str] = ("", ""),
) -> RunSpec:
    """What the runner needs for this attempt. ``starting`` also fetches the task's artifact (a
    verified local copy); polls and cancels find the run without it. ``resend``: a lost worker
    may have launched this attempt already (see :attr:`RunSpec.resend`). ``handed_on``: the
    W3C traceparent and tracestate the external run is given (tms_core.tracing.handed_on)."""
    if starting and task.input_schema is not None and execution.input is not None:
        # A trigger's input was checked when it was given; a workflow step's (an upstream's
        # output) is first seen here, and the schema may have changed since.
        problem = input_schema_problem(execution.input, task.input_schema)
        if problem:
            raise ValueError(f"The run's input does not satisfy the task's input_schema: {problem}")
    artifact_path = artifact_local_path(task.artifact) if starting and task.artifact is not None else None
    return RunSpec(
        execution_id=execution.pk,
        attempt=execution.attempt,
        task_id=str(task.pk),
        # Secrets are decrypted here, in the worker's memory, for the runner alone.
        config=get_runner(task.runner).validate_config(run_config(execution, task, starting=starting)),
        timeout=task.timeout.total_seconds(),
        callback_url=callback_url(execution_id=execution.pk),
        token_minter=partial(
            callback_token, execution_id=execution.pk, attempt=execution.attempt, timeout=task.timeout
        ),
        artifact_path=artifact_path,
        artifact_sha256=task.artifact.sha256 if artifact_path and task.artifact is not None else None,
        tracing_id=task.tracing_id,
        traceparent=handed_on[0],
        tracestate=handed_on[1],
        resend=resend,
        input=execution.input,
        event_lookup=event_lookup_for(execution),
    )


def persist(write: Callable[[], T], *, doing: str = "recording an outcome") -> T:
    """Run a final write, retrying through a database outage for up to half a lease.

    A run's outcome is recorded or the message is not acknowledged: if the database stays away
    longer the error propagates, the lease runs out and another worker resumes the attempt.
    ``doing`` names the write in the log.
    """
    deadline = time.monotonic() + tms_settings().WORKER_TIMEOUT / 2
    delay = 0.2
    while True:
        try:
            return write()
        except (OperationalError, InterfaceError):
            if time.monotonic() + delay > deadline:
                raise
            logger.warning("database unavailable while %s; retrying in %.1fs", doing, delay)
            connection.close()
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def redacted(task: Task, result: RunResult) -> RunResult:
    """``result`` with the task's secrets masked in its output and error: an error or output
    quoting one (a URL's key in a connection error, a header echoed back) is stored, in the
    execution and its events, with the secret masked."""
    values = secret_values(task.runner, task.config, task.secret_fields or [])
    if values:
        return replace(result, output=redact(result.output, values), error=redact(result.error, values))
    return result


_Recorder = TypeVar("_Recorder", bound=Callable[..., str])


def _traced_outcome(record: _Recorder) -> _Recorder:
    """``record`` (an outcome's writer) inside a ``tms.execution.outcome`` span when tracing is
    on, the run's end traced once its status is final; called as it is when tracing is off, so
    the writer is written once for both ways."""

    @wraps(record)
    def traced(*, execution: Execution, task: Task, result: RunResult, **rest: Any) -> str:
        if not tracing.ON:
            return record(execution=execution, task=task, result=result, **rest)
        attributes = {
            "tms.execution_id": execution.pk,
            "tms.attempt": execution.attempt,
            "tms.result": result.state.value,
        }
        with tracing.run_span("tms.execution.outcome", traces.trace_of(execution), attributes) as span:
            word = record(execution=execution, task=task, result=result, **rest)
            status = getattr(execution, "_traced_status", "")
            span.set_attribute("tms.recorded", word)
            if status:
                span.set_attribute("tms.status", status)
        if status in (S.SUCCEEDED, S.FAILED):
            traces.ended(execution, task, status=status, error=result.error if status == S.FAILED else "")
        return word

    return cast(_Recorder, traced)


@_traced_outcome
def execution_record_outcome(
    *,
    execution: Execution,
    task: Task,
    worker_id: str | None,
    result: RunResult,
    external_run_id: str | None = None,
    actor: str | None = None,
) -> str:
    """Record a finished attempt: SUCCEEDED, a retry per the task's policy, or FAILED.

    ``worker_id=None`` records what the job itself reported through its callback URL, or, with
    ``actor``, a person's decision (an approval step's).
    Returns ``finished``, or ``lost`` when the write lost (another worker, a cancel, or an
    outcome already recorded).
    """
    conf = tms_settings()
    result = redacted(task, result)
    common: dict[str, Any] = {
        "execution_id": execution.pk,
        "attempt": execution.attempt,
        "worker_id": worker_id,
        "max_chars": conf.OUTPUT_MAX_CHARS,
        "external_run_id": external_run_id,
        "actor": actor,
    }
    new_status: str | None = None
    if result.state is RunState.SUCCEEDED:
        won = persist(lambda: transitions.execution_succeed(output=result.output, **common))
    else:
        retry_in = None
        if result.retryable and execution.attempt < task.max_attempts:
            retry_in = exponential_backoff(
                attempt=execution.attempt,
                base=task.retry_backoff.total_seconds(),
                cap=task.retry_backoff_max.total_seconds(),
                jitter=task.retry_jitter,
            )
        new_status = persist(
            lambda: transitions.execution_fail(error=result.error, output=result.output, retry_in=retry_in, **common)
        )
        won = new_status is not None
        if won and retry_in is not None and retry_in < conf.MONITOR_MAX_SLEEP:
            notify_due()
    if not won:
        logger.warning("execution %s attempt %s: outcome not recorded, lease lost", execution.pk, execution.attempt)
        return "lost"
    if tracing.ON:
        execution._traced_status = S.SUCCEEDED if result.state is RunState.SUCCEEDED else new_status  # type: ignore[attr-defined]
    if execution.exclusive and task.max_concurrency is not None:
        # A slot is free: the next run waiting for it is due now (not at its next re-check).
        try:
            if transitions.executions_release_waiting(task_id=task.pk):
                notify_due()
        except DatabaseError:  # the waiters' re-check (WAIT_RECHECK_SECONDS) releases them instead
            logger.warning("execution %s: could not release the next waiting run", execution.pk, exc_info=True)
    if task.has_limits:
        # Its limit slots are free now: the runs waiting for them are due now.
        try:
            with transaction.atomic():  # one commit: the slots freed and their waiters due
                released = transitions.executions_release_limit_waiters(
                    free=limits.limits_release(execution_id=execution.pk)
                )
            if released:
                notify_due()
        except DatabaseError:  # the slots lapse with the lease; the waiters' re-check finds them
            logger.warning("execution %s: could not release its limit slots", execution.pk, exc_info=True)
    return "finished"


# --- stopping the external run of a cancelled execution ---------------------------------------


class ExternalRun(enum.StrEnum):
    """What cancelling did to an execution's external run."""

    NONE = "none"  #: it had not started: there is no external run
    STOPPED = "stopped"  #: the runner stopped the external run
    UNSUPPORTED = "unsupported"  #: the runner cannot stop runs: it may go on, its result is discarded
    DISCARDED = "discarded"  #: no external run recorded yet: the worker's result is discarded
    FAILED = "failed"  #: the runner was asked to stop the run and failed: it may go on


#: Outcomes after which something may still be running outside the platform.
MAY_STILL_RUN = frozenset({ExternalRun.UNSUPPORTED, ExternalRun.DISCARDED, ExternalRun.FAILED})


@dataclass(frozen=True)
class CancelReport:
    """What cancelling one execution did."""

    execution_id: int
    task_id: uuid.UUID
    #: The status it was cancelled from (its current status if it was not cancelled).
    from_status: str
    status: str
    external_run: ExternalRun
    detail: str = ""

    @property
    def may_still_run(self) -> bool:
        return self.external_run in MAY_STILL_RUN


def stop_external_run(execution: Execution, task: Task, outcome: transitions.CancelOutcome) -> CancelReport:
    """After a won cancel has committed: stop the external run of a formerly RUNNING execution,
    if it has one, through its runner. Never raises for a runner's failure: the report says it."""

    def report(external: ExternalRun, detail: str = "") -> CancelReport:
        return CancelReport(execution.pk, task.pk, outcome.from_status or "", S.CANCELLED, external, detail)

    if outcome.from_status != S.RUNNING:
        return report(ExternalRun.NONE)
    if not outcome.external_run_id:
        return report(
            ExternalRun.DISCARDED,
            "No external run was recorded yet: the worker's writes now fail, an asynchronous run it starts "
            "is cancelled by the worker, and the result of an inline run is discarded.",
        )
    try:
        runner = get_runner(task.runner)
    except UnknownRunner:
        return report(ExternalRun.FAILED, f"Runner {task.runner!r} is no longer configured; the run may go on.")
    if not runner.supports_cancel:
        return report(
            ExternalRun.UNSUPPORTED,
            f"Runner {task.runner!r} cannot stop external runs: run {outcome.external_run_id!r} may go on, "
            "and its result is discarded.",
        )
    execution.attempt = outcome.attempt or execution.attempt
    try:
        spec = run_spec(execution, task)
        runner.cancel(spec, RunHandle(outcome.external_run_id, dict(outcome.run_handle or {})))
    except Exception as exc:  # noqa: BLE001 - any runner failure is reported, never a 500
        logger.warning("stopping run %s of execution %s failed: %s", outcome.external_run_id, execution.pk, exc)
        detail = f"The runner could not stop run {outcome.external_run_id!r}: {describe_error(exc, limit=500)}"
        return report(ExternalRun.FAILED, detail)
    return report(ExternalRun.STOPPED, f"External run {outcome.external_run_id!r} stopped.")
