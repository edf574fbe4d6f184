"""What a user may see and do in the back office.

Seeing follows the API's owner rule (their own rows; staff see all): every page reads tasks and
executions through these, so another user's ids answer 404. Acting follows the admin's rule
(:mod:`tms_core.roles`): a user acts on their own tasks and runs; on anyone else's only with the
model permission the admin's actions ask for (``tasks_app.change_task`` to edit, pause, resume,
run or backfill, ``tasks_app.delete_task`` to delete, ``executions.change_execution`` to cancel
or retry; superusers have them all). So read-only support staff see everything and change nothing:
the pages hide the buttons and refuse the POSTs with a 403.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from executions.models import Execution
from tasks_app.models import Task, TaskStatus
from tms_core.roles import may_act_for


def visible_tasks(user: Any) -> QuerySet[Task]:
    """Tasks ``user`` may see and act on (deleted ones are gone, as in the API)."""
    tasks = Task.objects.exclude(status=TaskStatus.DELETED)
    return tasks if user.is_staff else tasks.filter(owner=user)


def visible_executions(user: Any) -> QuerySet[Execution]:
    """Executions of tasks ``user`` owns (all for staff), deleted tasks' history included."""
    executions = Execution.objects.all()
    # owner_id is the task's owner, copied at creation: no join to the tasks (a task never changes owner).
    return executions if user.is_staff else executions.filter(owner_id=user.pk)


def task_or_404(user: Any, pk: Any) -> Task:
    return get_object_or_404(visible_tasks(user), pk=pk)


def execution_or_404(user: Any, pk: Any) -> Execution:
    return get_object_or_404(visible_executions(user).select_related("task"), pk=pk)


def may_change_task(user: Any, task: Task) -> bool:
    """Whether ``user`` may edit, pause, resume, run or backfill ``task``."""
    return may_act_for(user, task.owner_id, "tasks_app.change_task")


def may_delete_task(user: Any, task: Task) -> bool:
    return may_act_for(user, task.owner_id, "tasks_app.delete_task")


def may_change_execution(user: Any, execution: Execution) -> bool:
    """Whether ``user`` may cancel or retry ``execution``."""
    return may_act_for(user, execution.task.owner_id, "executions.change_execution")


def task_to_change(user: Any, pk: Any, *, delete: bool = False) -> Task:
    """The task ``user`` acts on: 404 if they may not see it, 403 if they may only look at it."""
    task = task_or_404(user, pk)
    if not (may_delete_task(user, task) if delete else may_change_task(user, task)):
        raise PermissionDenied("You may look at this task but not change it.")
    return task


def execution_to_change(user: Any, pk: Any) -> Execution:
    """The execution ``user`` acts on: 404 if they may not see it, 403 if they may only look at it."""
    execution = execution_or_404(user, pk)
    if not may_change_execution(user, execution):
        raise PermissionDenied("You may look at this execution but not change it.")
    return execution
