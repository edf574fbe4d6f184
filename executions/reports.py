"""What a job reports through its callback URL, applied by the web process.

The endpoint is :mod:`executions.callback_api`; tokens are made and checked by
:mod:`executions.callbacks`. An outcome is recorded exactly as a worker records one
(:func:`executions.runs.execution_record_outcome`), without a lease: the attempt number fences it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.utils import timezone

from executions import traces, transitions
from executions.callbacks import CallbackRefused, callback_token, callback_verify
from executions.models import Execution
from executions.runs import execution_record_outcome, load_execution
from runners.base import RunResult
from tasks_app.models import Task
from tms_core import tracing
from tms_core.logcontext import log_context

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportAnswer:
    #: ``recorded``, or ``ignored`` when the attempt had already ended.
    result: str
    #: A fresh token for the next reports (after an accepted heartbeat or progress report).
    token: str | None = None


def execution_report(
    *,
    execution_id: int,
    token: str,
    state: str,
    output: str = "",
    error: str = "",
    progress: str = "",
    retryable: bool = True,
) -> ReportAnswer:
    """Apply what a job POSTed to its callback URL: ``heartbeat``/``progress`` (recorded on the
    execution, and answered with a renewed token), or ``succeeded``/``failed`` (the attempt's
    outcome, retried per policy).

    The token is checked before the execution is looked up. Raises
    :class:`~executions.callbacks.CallbackRefused` for a bad, foreign, stale or expired token, and
    :class:`LookupError` if the execution the (valid) token names no longer exists.
    """
    claim = callback_verify(token=token, execution_id=execution_id)
    loaded = load_execution(execution_id)
    if loaded is None:
        raise LookupError(execution_id)
    execution, task = loaded
    if claim.attempt != execution.attempt:
        raise CallbackRefused(f"The token is for attempt {claim.attempt}; the execution is at {execution.attempt}.")
    with (
        log_context(execution_id=execution_id, attempt=execution.attempt, task_id=task.pk, tracing_id=task.tracing_id),
        tracing.run_span(
            "tms.execution.report",
            traces.trace_of(execution),
            {"tms.execution_id": execution_id, "tms.attempt": execution.attempt, "tms.report": state},
            join_current=True,
        ),
    ):
        return _apply_report(execution, task, claim.attempt, state, output, error, progress, retryable)


def _apply_report(
    execution: Execution,
    task: Task,
    attempt: int,
    state: str,
    output: str,
    error: str,
    progress: str,
    retryable: bool,
) -> ReportAnswer:
    execution_id = execution.pk
    if state in ("heartbeat", "progress"):
        won = transitions.execution_report_progress(
            execution_id=execution_id, attempt=attempt, progress=progress or state
        )
        if not won:
            return ReportAnswer("ignored")
        # Renewed for what is left of the attempt (within the token's maximum age).
        left = task.timeout
        if execution.started_at is not None:
            left = max(execution.started_at + task.timeout - timezone.now(), task.timeout * 0)
        return ReportAnswer("recorded", token=callback_token(execution_id=execution_id, attempt=attempt, timeout=left))
    if state == "succeeded":
        result = RunResult.succeeded(output)
    else:
        result = RunResult.failed(error or "the job reported failure", output=output, retryable=retryable)
    outcome = execution_record_outcome(execution=execution, task=task, worker_id=None, result=result)
    logger.info("execution %s attempt %s: the job reported %s (%s)", execution_id, attempt, state, outcome)
    return ReportAnswer("recorded" if outcome == "finished" else "ignored")
