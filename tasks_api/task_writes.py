"""What every service that changes a task shares: the lock on its row (a deleted task is gone:
:class:`~tms_core.errors.GoneError`) and its audit entry, with the snapshot of its audited fields
that a create and an update record."""

from __future__ import annotations

import uuid
from typing import Any

from tasks_app.audit import audit_record
from tasks_app.fields import AUDITED_COLUMNS
from tasks_app.models import Task, TaskStatus
from tms_core.errors import GoneError


def _snapshot(task: Task, config: Any) -> dict[str, Any]:
    """The audited fields of ``task``, with ``config`` (already masked) in place of its own."""
    values = {
        name: getattr(task, name) for name in AUDITED_COLUMNS if name not in ("config", "artifact", "calendar", "team")
    }
    calendar = task.calendar.name if task.calendar_id is not None and task.calendar is not None else None
    artifact = str(task.artifact_id) if task.artifact_id else None
    return {**values, "config": config, "artifact": artifact, "calendar": calendar, "team": task.team_id}


def _audit_task(task: Task, action: str, *, changes: dict[str, Any] | None = None, detail: str = "") -> None:
    """Record ``action`` on ``task`` in the audit log as the current context's actor (call it inside
    the change's transaction)."""
    audit_record(
        action=action,
        object_type="task",
        object_id=task.pk,
        owner=task.owner_id,
        task_id=task.pk,
        changes=changes,
        detail=detail,
    )


def _lock(task_id: uuid.UUID | str, *, no_key: bool = False) -> Task:
    """The task, its row locked FOR UPDATE (FOR NO KEY UPDATE with ``no_key``) until the caller's
    transaction ends; :class:`~tms_core.errors.GoneError` when it is deleted or no longer exists."""
    task = Task.objects.select_for_update(no_key=no_key).filter(pk=task_id).exclude(status=TaskStatus.DELETED).first()
    if task is None:
        raise GoneError("The task no longer exists.")
    return task
