"""A task's lifecycle: pause, resume and (soft) delete, each with what it does to the task's
waiting and running executions."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db import transaction

from executions import transitions
from executions.materialiser import materialise_task, task_schedule
from executions.models import Execution, ExecutionStatus
from executions.runs import CancelReport
from executions.services import executions_cancel_active, stop_external_runs
from tasks_api.replan import _set_cursor, _supersede
from tasks_api.task_writes import _audit_task, _lock
from tasks_app.models import AuditAction, Task, TaskStatus
from tms_core.clock import db_now


def task_pause(*, task: Task, actor: str) -> Task:
    """Pause a task: no new executions are materialised, and its SCHEDULED executions (not yet
    published) are cancelled. Never-started occurrences are superseded and the cursor moves back
    to the earliest of them, so :func:`task_resume` materialises them again (or, if their time has
    passed by then, applies the misfire policy). Executions already published or running go on.
    Pausing a paused task changes nothing.
    """
    with transaction.atomic():
        task = _lock(task.pk)
        if task.status == TaskStatus.PAUSED:
            return task
        previous = task.status
        scheduled = frozenset({ExecutionStatus.SCHEDULED})
        superseded = _supersede(task, only_from=scheduled, actor=actor, reason="paused")
        # Retries and triggered runs waiting in SCHEDULED are cancelled too (not superseded).
        for pk in Execution.objects.filter(task=task, status=ExecutionStatus.SCHEDULED).values_list("pk", flat=True):
            transitions.execution_cancel(execution_id=pk, actor=actor, reason="paused", only_from=scheduled)
        if superseded:
            cursor = min([*superseded, *([task.next_run_at] if task.next_run_at else [])])
            _set_cursor(task, cursor, task_schedule(task))
        task.status = TaskStatus.PAUSED
        # Occurrences missed from now until the resume are recorded as "paused".
        task.paused_at = db_now()
        task.save()
        _audit_task(task, AuditAction.PAUSE, changes={"status": {"from": previous, "to": TaskStatus.PAUSED}})
    task.refresh_from_db()
    return task


def task_resume(*, task: Task, actor: str) -> Task:
    """Resume a paused task: it becomes ACTIVE and is materialised at once from its cursor; the
    materialiser applies the task's misfire policy to occurrences whose time passed while it was
    paused (skip them, run the latest once, or run them all). A COMPLETED task that follows
    others (left so before :func:`~tasks_app.models.status_for_cursor` kept such tasks active)
    becomes ACTIVE too. Resuming any other task changes nothing.
    """
    with transaction.atomic():
        task = _lock(task.pk)
        previous = task.status
        if previous != TaskStatus.PAUSED and not (previous == TaskStatus.COMPLETED and task.has_after):
            return task
        task.status = TaskStatus.ACTIVE
        task.save(update_fields=["status", "updated_at"])
        _audit_task(task, AuditAction.RESUME, changes={"status": {"from": previous, "to": TaskStatus.ACTIVE}})
        materialise_task(task_id=task.pk)
    task.refresh_from_db()
    return task


@dataclass(frozen=True)
class TaskDeleteReport:
    task_id: uuid.UUID
    executions: list[CancelReport]

    @property
    def may_still_run(self) -> bool:
        """Whether an external run may still be going (its runner could not stop it)."""
        return any(report.may_still_run for report in self.executions)


def task_delete(*, task: Task, actor: str) -> TaskDeleteReport:
    """Delete a task (softly: its history stays): no further runs; its SCHEDULED and PENDING
    executions are cancelled, and RUNNING ones are cancelled and their external runs stopped
    through the runner where it supports it. The report says what happened to each.
    """
    with transaction.atomic():
        task = _lock(task.pk)
        previous = task.status
        task.status = TaskStatus.DELETED
        task.next_run_at = None
        task.save(update_fields=["status", "next_run_at", "updated_at"])
        cancelled = executions_cancel_active(task=task, actor=actor, reason="task deleted")
        _audit_task(
            task,
            AuditAction.DELETE,
            changes={"status": {"from": previous, "to": TaskStatus.DELETED}},
            detail=f"{sum(1 for _, outcome in cancelled if outcome.won)} active execution(s) cancelled",
        )
    # External runs are stopped after the commit: a slow runner never holds row locks.
    return TaskDeleteReport(task.pk, stop_external_runs(task=task, cancelled=cancelled))
