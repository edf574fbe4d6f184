"""Approval steps (issue 48): the runs waiting for a person's decision, and the decision.

A run of a task on an ``approval`` runner (:mod:`runners.approval`) is RUNNING, with no worker
holding it, until someone decides or its timeout passes. :func:`approval_decide` ends it the way a
job's report through its callback URL does (:func:`executions.runs.execution_record_outcome`, a
conditional transition fenced by the attempt), and in the same transaction records who decided,
when and why (:class:`~executions.models.Approval`) and an audit entry. Of two people deciding at
once exactly one wins; the other gets a 409. The API's ``approve``/``reject`` actions and the back
office's buttons both come here.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from executions.models import Approval, ApprovalDecision, Execution, ExecutionStatus
from executions.runs import execution_record_outcome, load_execution, run_config
from runners.approval import approval_output, approvers_of
from runners.base import RunResult
from runners.registry import UnknownRunner, all_runners, get_runner
from tasks_app.audit import audit_record
from tasks_app.models import AuditAction, TeamRole
from tasks_app.teams import require, scope_to_teams
from tms_core.auth import actor_for
from tms_core.clock import db_now
from tms_core.errors import ConflictError, GoneError, RoleRequired

#: The longest comment a decision keeps.
MAX_COMMENT = 2000
WHAT = "this approval"


def approval_aliases() -> list[str]:
    """The configured runner aliases whose runs wait for a person's decision."""
    return sorted(alias for alias, runner in all_runners().items() if getattr(runner, "waits_for_approval", False))


def approvals_pending(user: Any) -> QuerySet[Execution]:
    """The runs waiting for a decision in ``user``'s teams (every team's for staff), oldest first,
    with their task (one query)."""
    queryset = (
        Execution.objects.filter(status=ExecutionStatus.RUNNING, task__runner__in=approval_aliases())
        .exclude(external_run_id="")
        .select_related("task")
        .order_by("started_at", "id")
    )
    return scope_to_teams(queryset, user)


def is_waiting(execution: Execution, runner_alias: str) -> bool:
    """Whether ``execution`` (of a task on ``runner_alias``) waits for a decision now."""
    return (
        execution.status == ExecutionStatus.RUNNING
        and bool(execution.external_run_id)
        and runner_alias in approval_aliases()
    )


def may_decide(user: Any, execution: Execution, config: Any) -> bool:
    """Whether ``user`` may approve or reject ``execution`` (whose runner config is ``config``)."""
    try:
        _require_approver(user, execution, config)
    except RoleRequired:
        return False
    return True


def _require_approver(user: Any, execution: Execution, config: Any) -> None:
    """The operator role in the run's team, and the config's ``approvers``: a role at least that,
    or a list of usernames that names ``user`` (superusers decide for anyone)."""
    require(user, execution.team_id, TeamRole.OPERATOR, "executions.change_execution", what=WHAT)
    approvers = approvers_of(config if isinstance(config, dict) else {})
    if isinstance(approvers, str):
        require(user, execution.team_id, approvers, "executions.change_execution", what=WHAT)
    elif user.username not in approvers and not user.is_superuser:
        raise RoleRequired(
            f"Only {', '.join(approvers)} may decide on this approval.", role=TeamRole.OPERATOR, held=None
        )


def approval_decide(*, user: Any, execution_id: int, approve: bool, comment: str = "") -> Approval:
    """Approve (the run SUCCEEDED, its output ``{approved: true, by, at, comment, input}``) or reject
    (FAILED, not retried) the run ``execution_id`` waits on. :class:`~tms_core.errors.RoleRequired`
    (403) for want of the role; :class:`ConflictError` (409) when it does not wait for a decision
    (any more: another decision won)."""
    loaded = load_execution(execution_id)
    if loaded is None:
        raise GoneError(f"Execution {execution_id} no longer exists.")
    execution, task = loaded
    try:
        runner = get_runner(task.runner)
    except UnknownRunner:
        raise ConflictError(f"Execution {execution_id} does not wait for an approval.") from None
    if not getattr(runner, "waits_for_approval", False):
        raise ConflictError(f"Execution {execution_id} does not wait for an approval: its task runs on {task.runner}.")
    config = runner.validate_config(run_config(execution, task))
    _require_approver(user, execution, config)
    if not is_waiting(execution, task.runner):
        done = Approval.objects.filter(execution_id=execution.pk, attempt=execution.attempt).first()
        if done is not None:
            raise ConflictError(
                f"Execution {execution_id} was decided already: {done.decision} by {done.decided_by_name}."
            )
        raise ConflictError(f"Execution {execution_id} is {execution.status}: it does not wait for a decision.")
    comment = (comment or "")[:MAX_COMMENT]
    now = db_now()
    decision = ApprovalDecision.APPROVED if approve else ApprovalDecision.REJECTED
    output = approval_output(
        approved=approve, by=user.username, at=now.isoformat(), comment=comment, run_input=execution.input
    )
    if approve:
        result = RunResult.succeeded(output)
    else:
        why = f"approval rejected by {user.username}" + (f": {comment}" if comment else "")
        result = RunResult.failed(why, output=output, retryable=False)
    with transaction.atomic():
        word = execution_record_outcome(
            execution=execution, task=task, worker_id=None, result=result, actor=actor_for(user)
        )
        if word != "finished":
            raise ConflictError(f"Execution {execution_id} was decided already, or no longer waits for a decision.")
        approval = Approval.objects.create(
            execution_id=execution.pk,
            attempt=execution.attempt,
            task_id=task.pk,
            requested_at=execution.started_at,
            decision=decision,
            decided_by=user,
            decided_by_name=user.username,
            decided_at=now,
            comment=comment,
        )
        to = ExecutionStatus.SUCCEEDED if approve else ExecutionStatus.FAILED
        audit_record(
            action=AuditAction.APPROVE if approve else AuditAction.REJECT,
            object_type="execution",
            object_id=execution.pk,
            owner=task.owner_id,
            task_id=task.pk,
            changes={"status": {"from": ExecutionStatus.RUNNING, "to": to}, "comment": comment},
            detail=f"{decision} by {user.username}" + (f": {comment}" if comment else ""),
        )
    return approval
