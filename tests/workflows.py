"""Helpers of the workflow tests: ``after`` entries, and ending a run through the real transitions
(taken, claimed, succeeded or failed for good) so that its followers are created."""

from __future__ import annotations

from typing import Any

from executions import transitions
from executions.models import Execution
from executions.models import ExecutionStatus as S

WORKER = "w1"


def after(*entries: tuple[Any, str]) -> list[dict[str, str]]:
    return [{"task": str(task.pk), "on": on} for task, on in entries]


def end(execution_id: int, *, ok: bool = True, output: str = "") -> None:
    """End the run ``execution_id`` (attempt 1) as a worker would: SUCCEEDED, or FAILED for good."""
    Execution.objects.filter(pk=execution_id).update(status=S.PENDING)
    assert transitions.execution_claim_loaded(
        execution_id=execution_id, attempt=1, worker_id=WORKER, lease_seconds=60, checked=True
    )
    if ok:
        assert transitions.execution_succeed(
            execution_id=execution_id, attempt=1, worker_id=WORKER, output=output, max_chars=1000
        )
    else:
        transitions.execution_fail(
            execution_id=execution_id, attempt=1, worker_id=WORKER, error="boom", output="", retry_in=None,
            max_chars=1000,
        )  # fmt: skip
