"""What users do to a workflow run as a whole (issue 48): pause, resume, cancel, retry from its
failed steps; and the cancel of a run past its root task's ``workflow_timeout`` (beat's job).
The API's ``/api/v1/workflow-runs/{id}/...`` and the back office's buttons come here.

Each is an operator's act in the root task's team (:func:`tasks_app.teams.require`), audited on
the root execution. The writes are :mod:`executions.transitions`' (the hold, under the workflow
run's lock: :mod:`executions.transitions.hold`); the cancel of the steps is the one every cancel
uses (:func:`executions.services.workflow_run_cancel_by_user`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import BigIntegerField, DateTimeField, Exists, ExpressionWrapper, F, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce, Now

from executions import transitions
from executions.models import ACTIVE_STATUSES, Execution, WorkflowRunControl, WorkflowRunHold
from executions.notify import notify_due
from executions.runs import CancelReport
from executions.services import audit_execution, workflow_run_cancel_by_user
from executions.workflow_selectors import RunState, failed_steps, workflow_runs_annotated
from tasks_app.models import AuditAction, Task, TaskStatus, TeamRole
from tasks_app.quotas import quota_charge_executions
from tasks_app.run_config import input_check
from tasks_app.run_input import check_input
from tasks_app.teams import require
from tms_core.clock import db_now
from tms_core.durations import format_duration
from tms_core.errors import ConflictError

#: What a refusal names. A root given to these services is annotated with its ``state``
#: (:func:`executions.workflow_selectors.workflow_runs_annotated`).
WHAT = "this workflow run"


def _require(user: Any, root: Execution) -> None:
    require(user, root.team_id, TeamRole.OPERATOR, "executions.change_execution", what=WHAT)


#: A workflow run's audit entry: on its root execution, as the workflow run.
_audit = partial(audit_execution, object_type="workflow_run")


def _who(user: Any, actor: str) -> str:
    """Who acted, as a hold's reason names them: the username, else the actor."""
    return str(getattr(user, "username", "") or actor)


def workflow_run_pause(*, user: Any, root: Execution, actor: str) -> None:
    """Pause the workflow run of ``root`` (annotated with its ``state``): its steps' ends start
    nothing more until it is resumed; the running steps finish. :class:`ConflictError` (409)
    unless it is running."""
    _require(user, root)
    if root.state != RunState.RUNNING:  # type: ignore[attr-defined]
        raise ConflictError(f"Workflow run {root.pk} is {root.state}: only a running one is paused.")  # type: ignore[attr-defined]
    with transaction.atomic():
        if not transitions.workflow_run_hold_set(
            workflow_run=root.pk,
            hold=WorkflowRunHold.PAUSED,
            sources=[WorkflowRunHold.ACTIVE],
            actor=actor,
            reason=f"paused by {_who(user, actor)}",
        ):
            raise ConflictError(f"Workflow run {root.pk} is paused or cancelled already.")
        _audit(
            root, AuditAction.PAUSE, changes={"hold": {"from": "active", "to": "paused"}}, detail="workflow run paused"
        )


def workflow_run_resume(*, user: Any, root: Execution, actor: str) -> list[int]:
    """Resume the paused workflow run of ``root``: the steps whose upstreams ended while it was
    paused are created now, once (their ids). :class:`ConflictError` (409) unless it is paused."""
    _require(user, root)
    with transaction.atomic():
        created = transitions.workflow_run_resume(
            workflow_run=root.pk, actor=actor, reason=f"resumed by {_who(user, actor)}"
        )
        if created is None:
            raise ConflictError(f"Workflow run {root.pk} is not paused.")
        _audit(
            root,
            AuditAction.RESUME,
            changes={"hold": {"from": "paused", "to": "active"}, "started": created},
            detail=f"workflow run resumed; {len(created)} step(s) started",
        )
    if created:
        notify_due()
    return created


def workflow_run_cancel(*, user: Any, root: Execution, actor: str) -> list[CancelReport]:
    """Cancel the workflow run of ``root``: no step starts any more (its hold, set first), and its
    scheduled and running steps are cancelled as ``cancel`` would each (a report per step).
    :class:`ConflictError` (409) when it was cancelled already or has ended."""
    _require(user, root)
    if root.state not in (RunState.RUNNING, RunState.PAUSED):  # type: ignore[attr-defined]
        raise ConflictError(f"Workflow run {root.pk} is {root.state}: it has ended.")  # type: ignore[attr-defined]
    reports = _cancel_run(
        root,
        actor=actor,
        hold_reason=f"cancelled by {_who(user, actor)}",
        audit_detail="workflow run cancelled",
        steps_reason=f"workflow run cancelled by {actor}",
    )
    if reports is None:
        raise ConflictError(f"Workflow run {root.pk} was cancelled already.")
    return reports


def _cancel_run(
    root: Execution, *, actor: str, hold_reason: str, audit_detail: str, steps_reason: str
) -> list[CancelReport] | None:
    """Cancel the workflow run of ``root``, a person's or the timeout's: its hold set to cancelled
    (from active or paused) and audited in one transaction, so no step starts any more; then each
    active step cancelled as a user's cancel would (a report per step). None when its hold was
    cancelled already."""
    with transaction.atomic():
        if not transitions.workflow_run_hold_set(
            workflow_run=root.pk,
            hold=WorkflowRunHold.CANCELLED,
            sources=[WorkflowRunHold.ACTIVE, WorkflowRunHold.PAUSED],
            actor=actor,
            reason=hold_reason,
        ):
            return None
        _audit(root, AuditAction.CANCEL, changes={"hold": {"to": "cancelled"}}, detail=audit_detail)
    _, reports = workflow_run_cancel_by_user(execution=root, actor=actor, reason=steps_reason)
    return reports


@dataclass(frozen=True)
class RetryReport:
    """A workflow run's retry: the failed steps retried and their new runs, in order."""

    retried: list[int]
    created: list[int]


def workflow_run_retry(
    *, user: Any, root: Execution, actor: str, run_input: dict[str, Any] | None = None
) -> RetryReport:
    """Retry the failed workflow run of ``root`` from its failed step(s): each runs again in the
    same workflow run (``retry_of`` it, the same upstream), with ``run_input`` as its input when
    given (checked against each step's task: 400 on ``input``), else the one it had; when a retry
    ends, what follows it runs, and the steps that succeeded are not run again. An operator's act
    (``input`` is not config). :class:`ConflictError` (409) unless the run failed; the retries
    count against the team's hourly quota of runs on request."""
    _require(user, root)
    if run_input is not None:
        check_input(run_input, None)
    if root.state != RunState.FAILED:  # type: ignore[attr-defined]
        raise ConflictError(f"Workflow run {root.pk} is {root.state}: only a failed one is retried.")  # type: ignore[attr-defined]
    failed = failed_steps(root)
    tasks = Task.objects.in_bulk({step.task_id for step in failed})
    if run_input is not None:
        for step in failed:
            input_check(task=tasks[step.task_id], run_input=run_input)
    with transaction.atomic():
        quota_charge_executions(team_id=root.team_id, count=len(failed))
        created = transitions.workflow_run_retry(
            workflow_run=root.pk, execution_ids=[step.pk for step in failed], actor=actor, run_input=run_input
        )
        if not all(created):
            raise ConflictError(f"A failed step of workflow run {root.pk} was retried meanwhile, or its task deleted.")
        new_ids = [int(pk) for pk in created if pk is not None]
        changes: dict[str, Any] = {"retried": [step.pk for step in failed], "created": new_ids}
        if run_input is not None:
            changes["input"] = "replaced"
        _audit(root, AuditAction.RETRY, changes=changes, detail=f"workflow run retried from {len(new_ids)} step(s)")
    notify_due()
    return RetryReport(retried=[step.pk for step in failed], created=new_ids)


#: Who cancels a workflow run past its root task's ``workflow_timeout``, and retries a failed one.
TIMEOUT_ACTOR = "system"


def workflow_runs_time_out(*, limit: int = 100) -> list[int]:
    """Cancel the workflow runs that have gone on longer than their root task's
    ``workflow_timeout`` (from the root run's start), at most ``limit`` a call: each as a user's
    cancel would (no step starts any more; its scheduled and running steps cancelled), by
    ``system``, with the reason on the run ("timed out after 1h ...") and on each step's event,
    and an audit entry. Beat's ``tms.workflow_timeouts`` calls it every minute; returns the ids.

    Bounded by the tasks with a timeout, not by the tables: their ids first (a partial index; none,
    the usual case, and nothing more is read), then those tasks' started roots (the index led by
    ``task``), each kept while it or one of its steps (the index on ``workflow_run``) is active.
    The first version asked for "it or a step" in one ``OR`` and joined the tasks: on a million
    tasks with stale statistics it scanned the executions once per root, for minutes, holding
    beat's worker (the cost curve, docs/benchmarks.md)."""
    timed = list(
        Task.objects.filter(workflow_timeout__isnull=False)
        .exclude(status=TaskStatus.DELETED)
        .values_list("pk", flat=True)
    )
    if not timed:
        return []
    steps = Execution.objects.filter(workflow_run=OuterRef("pk"), status__in=ACTIVE_STATUSES)
    cancelled = WorkflowRunControl.objects.filter(workflow_run=OuterRef("pk"), hold=WorkflowRunHold.CANCELLED)
    deadline = ExpressionWrapper(F("started_at") + F("task__workflow_timeout"), output_field=DateTimeField())
    roots = list(
        Execution.objects.filter(task_id__in=timed, started_at__isnull=False)
        .filter(Q(workflow_run__isnull=True) | Q(workflow_run=F("pk")))
        .annotate(deadline=deadline)
        .filter(deadline__lt=Now())
        .filter(Q(status__in=ACTIVE_STATUSES) | Exists(steps))
        .exclude(Exists(cancelled))
        .select_related("task")
        .order_by("id")[:limit]
    )
    done = []
    for root in roots:
        timeout = format_duration(root.task.workflow_timeout) if root.task.workflow_timeout else ""
        reason = f"timed out after {timeout} (workflow_timeout of {root.task})"
        reports = _cancel_run(
            root,
            actor=TIMEOUT_ACTOR,
            hold_reason=reason,
            audit_detail=f"workflow run {reason}",
            steps_reason=f"workflow run {reason}",
        )
        if reports is not None:  # None: cancelled meanwhile
            done.append(root.pk)
    return done


#: How far back :func:`workflow_runs_retry_failed` looks for a workflow run's last end.
RETRY_WINDOW = timedelta(minutes=10)


def workflow_runs_retry_failed(*, limit: int = 100) -> list[int]:
    """Retry the failed workflow runs whose root task asks for it (``workflow_retries``) from
    their failed steps, as :func:`workflow_run_retry` does, by ``system``: each at most that many
    times (counted on the run, under its lock: two passes at once retry it once), never a paused or
    cancelled one. Beat's ``tms.workflow_retries`` calls it every minute; it looks at the runs
    that ended within :data:`RETRY_WINDOW` (a run has failed once its last step has ended), so a
    run that failed while beat was stopped for longer is left to a retry by hand. Returns the
    workflow runs retried."""
    since = db_now() - RETRY_WINDOW
    run = Coalesce("workflow_run", "pk", output_field=BigIntegerField())
    recent = Execution.objects.filter(finished_at__gte=since).annotate(run=run).values("run")
    retries = WorkflowRunControl.objects.filter(workflow_run=OuterRef("pk")).values("retries")[:1]
    roots = list(
        workflow_runs_annotated(Execution.objects.filter(task__workflow_retries__gt=0, pk__in=recent))
        .filter(**{"state": RunState.FAILED})  # an annotation (the plugin knows only columns)
        .annotate(retried=Coalesce(Subquery(retries), Value(0)))
        .filter(retried__lt=F("task__workflow_retries"))
        .select_related("task")
        .order_by("id")[:limit]
    )
    done = []
    for root in roots:
        failed = failed_steps(root)
        if not failed:
            continue
        with transaction.atomic():
            count = transitions.workflow_run_retry_bump(workflow_run=root.pk, below=root.task.workflow_retries)
            if count is None:
                continue
            created = transitions.workflow_run_retry(
                workflow_run=root.pk, execution_ids=[step.pk for step in failed], actor=TIMEOUT_ACTOR
            )
            if not all(created):  # retried meanwhile (by hand, or another pass): nothing counted
                transaction.set_rollback(True)
                continue
            _audit(
                root,
                AuditAction.RETRY,
                changes={"retried": [step.pk for step in failed], "created": created, "retry": count},
                detail=f"workflow run retried automatically ({count} of {root.task.workflow_retries})",
            )
        done.append(root.pk)
    if done:
        notify_due()
    return done
