"""Execution operations users ask for: cancel, retry, materialise up to a time.

Status writes go through :mod:`executions.transitions`; this module adds the rules around them
(what may be cancelled or retried, what to tell the user) and stops external runs through their
runner, always after the database transaction has committed.
"""

from __future__ import annotations

import enum
import logging
import traceback
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from rest_framework.exceptions import ValidationError

from executions import transitions
from executions.materialiser import materialise_task, task_schedule
from executions.models import ACTIVE_STATUSES, Execution
from executions.models import ExecutionStatus as S
from executions.notify import notify_due
from executions.worker_services import run_spec
from runners.base import RunHandle
from runners.registry import UnknownRunner, get_runner
from tasks_app.models import Task, TaskStatus
from tms_core.clock import db_now
from tms_core.errors import ConflictError, GoneError
from tms_project.api.conf import api_settings

logger = logging.getLogger(__name__)


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


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[:500]


def stop_external_run(execution: Execution, task: Task, outcome: transitions.CancelOutcome) -> CancelReport:
    """After a won cancel: stop the external run of a formerly RUNNING execution, if it has one."""

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
        detail = f"The runner could not stop run {outcome.external_run_id!r}: {_describe(exc)}"
        return report(ExternalRun.FAILED, detail)
    return report(ExternalRun.STOPPED, f"External run {outcome.external_run_id!r} stopped.")


def execution_cancel(*, execution: Execution, actor: str, reason: str = "cancelled by user") -> CancelReport:
    """Cancel a SCHEDULED, PENDING or RUNNING execution; a RUNNING one's external run is stopped
    through its runner when the runner supports it (the report says what happened).

    Raises :class:`ConflictError` when the execution is already finished.
    """
    outcome = transitions.execution_cancel(execution_id=execution.pk, actor=actor, reason=reason)
    if not outcome.won:
        if outcome.from_status is None:
            raise GoneError(f"Execution {execution.pk} no longer exists.")
        raise ConflictError(f"Execution {execution.pk} is {outcome.from_status} and can no longer be cancelled.")
    task = Task.objects.get(pk=execution.task_id)
    return stop_external_run(execution, task, outcome)


def executions_cancel_active(
    *, task: Task, actor: str, reason: str
) -> list[tuple[Execution, transitions.CancelOutcome]]:
    """Cancel every active execution of ``task``. Call inside the caller's transaction, then
    :func:`stop_external_runs` after it commits."""
    executions = list(Execution.objects.filter(task=task, status__in=ACTIVE_STATUSES).order_by("scheduled_for", "id"))
    return [
        (execution, transitions.execution_cancel(execution_id=execution.pk, actor=actor, reason=reason))
        for execution in executions
    ]


def stop_external_runs(
    *, task: Task, cancelled: Iterable[tuple[Execution, transitions.CancelOutcome]]
) -> list[CancelReport]:
    """Report on cancels made by :func:`executions_cancel_active`, stopping external runs (after commit)."""
    reports = []
    for execution, outcome in cancelled:
        if outcome.won:
            reports.append(stop_external_run(execution, task, outcome))
        else:  # it finished (or was cancelled) meanwhile
            status = outcome.from_status or ""
            reports.append(CancelReport(execution.pk, task.pk, status, status, ExternalRun.NONE, "Already finished."))
    return reports


def execution_retry(*, execution: Execution, actor: str) -> Execution:
    """Run a FAILED or CANCELLED execution again, as a new execution of the same task due now
    (``retry_of`` = the old one, attempt = its attempt + 1); the old execution stays as it was.

    Raises :class:`ConflictError` when it is not FAILED or CANCELLED, was already retried, or
    its task was deleted.
    """
    new_id = transitions.execution_retry(execution_id=execution.pk, actor=actor)
    if new_id is None:
        current = Execution.objects.select_related("task").filter(pk=execution.pk).first()
        if current is None:
            raise GoneError(f"Execution {execution.pk} no longer exists.")
        if current.status not in transitions.RETRYABLE_STATUSES:
            raise ConflictError(
                f"Only FAILED or CANCELLED executions can be retried; execution {current.pk} is {current.status}."
            )
        if current.task.status == TaskStatus.DELETED:
            raise ConflictError(f"The task of execution {current.pk} was deleted.")
        retry = Execution.objects.filter(retry_of=current).values_list("pk", flat=True).first()
        if retry is not None:
            raise ConflictError(f"Execution {current.pk} was already retried as execution {retry}.")
        raise ConflictError(f"Execution {current.pk} could not be retried; try again.")  # pragma: no cover
    notify_due()
    return Execution.objects.get(pk=new_id)


def executions_materialise(*, task: Task, until: datetime) -> list[int]:
    """Create ``task``'s upcoming executions up to ``until`` now (the original design's
    ``create_task_executions(task_id, until)``) and return the ids of those created.

    Idempotent: occurrences that already exist are not created again. Raises
    :class:`ConflictError` for a paused task and a ValidationError when ``until`` is too far
    ahead or would create more than ``TMS_API_MATERIALISE_MAX`` executions.
    """
    conf = api_settings()
    limit, max_ahead = conf.MATERIALISE_MAX, conf.MATERIALISE_MAX_AHEAD
    now = db_now()
    if (until - now).total_seconds() > max_ahead:
        raise ValidationError({"until": [f"May be at most {max_ahead:g} seconds ahead."]})
    if task.status == TaskStatus.PAUSED:
        raise ConflictError("The task is paused; resume it first.")
    if task.status != TaskStatus.ACTIVE or task.next_run_at is None or until < task.next_run_at:
        return []
    for count, when in enumerate(task_schedule(task).fire_times(since=task.next_run_at), start=1):
        if when > until:
            break
        if count > limit:
            raise ValidationError(
                {"until": [f"That would create more than {limit} executions; choose an earlier time."]}
            )
    return materialise_task(task_id=task.pk, until=until)
