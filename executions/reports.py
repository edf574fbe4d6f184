"""What a job reports through its callback URL, applied by the web process.

The endpoint is :mod:`executions.callback_api`; tokens are made and checked by
:mod:`executions.callbacks`. An outcome is recorded exactly as a worker records one
(:func:`executions.runs.execution_record_outcome`), without a lease: the attempt number fences it.
"""

from __future__ import annotations

from executions import transitions
from executions.callbacks import GRACE, CallbackRefused, callback_verify
from executions.runs import execution_record_outcome, load_execution
from runners.base import RunResult


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
    return "recorded" if outcome == "finished" else "ignored"
