"""What a job reports through its callback URL, applied by the web process.

The endpoint is :mod:`executions.callback_api`; tokens are made and checked by
:mod:`executions.callbacks`. An outcome is recorded exactly as a worker records one
(:func:`executions.runs.execution_record_outcome`), without a lease: the attempt number fences it.
"""

from __future__ import annotations

import logging

from executions import transitions
from executions.callbacks import GRACE, CallbackRefused, callback_verify
from executions.runs import execution_record_outcome, load_execution
from runners.base import RunResult
from tms_core.logcontext import log_context

logger = logging.getLogger(__name__)


def execution_report(
    *,
    execution_id: int,
    token: str,
    state: str,
    output: str = "",
    error: str = "",
    progress: str = "",
    retryable: bool = True,
) -> str:
    """Apply what a job POSTed to its callback URL: ``heartbeat``/``progress`` (recorded on the
    execution), or ``succeeded``/``failed`` (the attempt's outcome, retried per policy).

    Raises :class:`~executions.callbacks.CallbackRefused` for a bad, foreign, stale or expired
    token, and :class:`LookupError` if the execution does not exist. Returns ``recorded``, or
    ``ignored`` when the attempt has already ended.
    """
    loaded = load_execution(execution_id)
    if loaded is None:
        raise LookupError(execution_id)
    execution, task = loaded
    with log_context(execution_id=execution_id, attempt=execution.attempt, task_id=task.pk, tracing_id=task.tracing_id):
        return _apply_report(execution, task, token, state, output, error, progress, retryable)


def _apply_report(execution, task, token, state, output, error, progress, retryable) -> str:
    execution_id = execution.pk
    claim = callback_verify(token=token, execution_id=execution_id, max_age=task.timeout + GRACE)
    if claim.attempt != execution.attempt:
        raise CallbackRefused(f"The token is for attempt {claim.attempt}; the execution is at {execution.attempt}.")
    if state in ("heartbeat", "progress"):
        won = transitions.execution_report_progress(
            execution_id=execution_id, attempt=claim.attempt, progress=progress or state
        )
        return "recorded" if won else "ignored"
    if state == "succeeded":
        result = RunResult.succeeded(output)
    else:
        result = RunResult.failed(error or "the job reported failure", output=output, retryable=retryable)
    outcome = execution_record_outcome(execution=execution, task=task, worker_id=None, result=result)
    logger.info("execution %s attempt %s: the job reported %s (%s)", execution_id, claim.attempt, state, outcome)
    return "recorded" if outcome == "finished" else "ignored"
