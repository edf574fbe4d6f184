"""Execution operations users ask for: cancel, retry, materialise up to a time.

Status writes go through :mod:`executions.transitions`; this module adds the rules around them
(what may be cancelled or retried, what to tell the user) and stops external runs through their
runner, always after the database transaction has committed.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import transaction
from django.db.models import Q

from executions import traces, transitions
from executions.materialiser import materialise_task, task_schedule
from executions.models import ACTIVE_STATUSES, Execution, WorkflowRunHold
from executions.models import ExecutionStatus as S
from executions.notify import notify_due
from executions.runs import CancelReport, ExternalRun, stop_external_run
from tasks_app.audit import audit_record
from tasks_app.models import AuditAction, Task, TaskStatus
from tasks_app.quotas import quota_charge_executions
from tasks_app.schedules import walk_limit
from tms_core.clock import db_now
from tms_core.conf import tms_settings
from tms_core.errors import ConflictError, GoneError, InvalidInput


def audit_execution(
    execution: Execution, action: str, *, changes: dict, detail: str = "", object_type: str = "execution"
) -> None:
    """Record ``action`` on ``execution`` in the audit log, owned as its task is (``object_type``
    ``workflow_run``: the act was on the workflow run this execution is the root of)."""
    owner_id = Task.objects.filter(pk=execution.task_id).values_list("owner_id", flat=True).first()
    audit_record(
        action=action,
        object_type=object_type,
        object_id=execution.pk,
        owner=owner_id,
        task_id=execution.task_id,
        changes=changes,
        detail=detail,
    )


def execution_cancel_by_user(*, execution: Execution, actor: str, reason: str = "cancelled by user") -> CancelReport:
    """Cancel a SCHEDULED, PENDING or RUNNING execution; a RUNNING one's external run is stopped
    through its runner when the runner supports it (the report says what happened).

    Raises :class:`ConflictError` when the execution is already finished.
    """
    with transaction.atomic():
        outcome = transitions.execution_cancel(execution_id=execution.pk, actor=actor, reason=reason)
        if outcome.won:
            audit_execution(
                execution,
                AuditAction.CANCEL,
                changes={"status": {"from": outcome.from_status, "to": "CANCELLED"}},
                detail=reason,
            )
    if not outcome.won:
        if outcome.from_status is None:
            raise GoneError(f"Execution {execution.pk} no longer exists.")
        raise ConflictError(f"Execution {execution.pk} is {outcome.from_status} and can no longer be cancelled.")
    task = Task.objects.get(pk=execution.task_id)
    report = stop_external_run(execution, task, outcome)
    traces.ended(execution, task, status=S.CANCELLED, error=reason)
    return report


#: Passes of :func:`workflow_run_cancel_by_user` (a step that ended during a pass may have started
#: its followers: the next pass cancels them).
WORKFLOW_CANCEL_PASSES = 10


def workflow_run_cancel_by_user(
    *, execution: Execution, actor: str, reason: str = "workflow run cancelled by user"
) -> tuple[int, list[CancelReport]]:
    """Cancel every step still to run or running in the workflow run of ``execution`` (a step
    of it, or its root), each as :func:`execution_cancel_by_user` would; returns the workflow
    run's id and a report per step cancelled. A cancelled step starts nothing, so the workflow
    run stops there. While a step is active, the workflow run's hold is set to cancelled first
    (as ``POST /workflow-runs/{id}/cancel`` does), so that a step ending while this runs starts
    nothing either; one that started something before the hold is found by the next pass, until
    a pass finds nothing active. A workflow run that has ended keeps its state (no hold)."""
    workflow_run = execution.workflow_run or execution.pk
    # A root still running has no workflow_run yet: it is written when its end starts a follower.
    steps = Q(workflow_run=workflow_run) | Q(pk=workflow_run)
    if Execution.objects.filter(steps, status__in=ACTIVE_STATUSES).exists():
        with transaction.atomic():
            transitions.workflow_run_hold_set(
                workflow_run=workflow_run,
                hold=WorkflowRunHold.CANCELLED,
                sources=[WorkflowRunHold.ACTIVE, WorkflowRunHold.PAUSED],
                actor=actor,
                reason=reason,
            )
    reports: list[CancelReport] = []
    for _ in range(WORKFLOW_CANCEL_PASSES):
        active = list(Execution.objects.filter(steps, status__in=ACTIVE_STATUSES).order_by("id"))
        if not active:
            break
        for step in active:
            try:
                reports.append(execution_cancel_by_user(execution=step, actor=actor, reason=reason))
            except (ConflictError, GoneError):
                continue  # it ended meanwhile: what it started is found by the next pass
    return workflow_run, reports


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


def execution_retry_by_user(*, execution: Execution, actor: str) -> Execution:
    """Run a FAILED or CANCELLED execution again, as a new execution of the same task due now
    (``retry_of`` = the old one, attempt = its attempt + 1); the old execution stays as it was.

    Raises :class:`ConflictError` when it is not FAILED or CANCELLED, was already retried, or
    its task was deleted, and :class:`QuotaExceeded` when the hourly execution quota of the task's team is
    used up (the retry counts against it).
    """
    # The team of the task (the execution's copy of it follows the task when it moves).
    team_id = Task.objects.filter(pk=execution.task_id).values_list("team_id", flat=True).first()
    with transaction.atomic():
        if team_id is not None:
            quota_charge_executions(team_id=team_id, count=1)
        new_id = transitions.execution_retry(execution_id=execution.pk, actor=actor)
        if new_id is None:
            transaction.set_rollback(True)  # nothing created: nothing counted
        else:
            audit_execution(execution, AuditAction.RETRY, changes={"retry": new_id}, detail=f"execution {new_id}")
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
    :class:`ConflictError` for a paused task and :class:`InvalidInput` (on ``until``) when
    ``until`` is further ahead than ``TMS_MATERIALISE_MAX_AHEAD`` or would create more than
    ``TMS_MATERIALISE_MAX`` executions. The executions it creates count against the team's
    hourly quota of executions created on request (:class:`QuotaExceeded`, 429, when they do not
    fit: nothing is created).
    """
    conf = tms_settings()
    limit, max_ahead = conf.MATERIALISE_MAX, conf.MATERIALISE_MAX_AHEAD
    now = db_now()
    if (until - now).total_seconds() > max_ahead:
        raise InvalidInput.on("until", f"May be at most {max_ahead:g} seconds ahead.")
    if task.status == TaskStatus.PAUSED:
        raise ConflictError("The task is paused; resume it first.")
    if task.status != TaskStatus.ACTIVE or task.next_run_at is None or until < task.next_run_at:
        return []
    with walk_limit("until", "Fire times from the task's next run up to this time"):
        for count, when in enumerate(task_schedule(task).fire_times(since=task.next_run_at), start=1):
            if when > until:
                break
            if count > limit:
                raise InvalidInput.on(
                    "until", f"That would create more than {limit} executions; choose an earlier time."
                )
    with transaction.atomic():
        ids = materialise_task(task_id=task.pk, until=until)
        # Created on request, like run now and backfill: against the team's hourly quota (over
        # it, this transaction, executions included, is rolled back).
        quota_charge_executions(team_id=task.team_id, count=len(ids), field="until")
        if ids:
            audit_record(
                action=AuditAction.MATERIALISE,
                object_type="task",
                object_id=task.pk,
                owner=task.owner_id,
                task_id=task.pk,
                changes={"until": until.isoformat(), "created": len(ids)},
            )
    return ids
