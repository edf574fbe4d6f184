"""What a user may see in the back office: the API's owner rule (their own rows; staff see all).

Every page reads tasks and executions through these, so another user's ids answer 404.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from executions.models import Execution
from tasks_app.models import Task, TaskStatus


def visible_tasks(user: Any) -> QuerySet[Task]:
    """Tasks ``user`` may see and act on (deleted ones are gone, as in the API)."""
    tasks = Task.objects.exclude(status=TaskStatus.DELETED)
    return tasks if user.is_staff else tasks.filter(owner=user)


def visible_executions(user: Any) -> QuerySet[Execution]:
    """Executions of tasks ``user`` owns (all for staff), deleted tasks' history included."""
    executions = Execution.objects.all()
    return executions if user.is_staff else executions.filter(task__owner=user)


def task_or_404(user: Any, pk: Any) -> Task:
    return get_object_or_404(visible_tasks(user), pk=pk)


def execution_or_404(user: Any, pk: Any) -> Execution:
    return get_object_or_404(visible_executions(user).select_related("task"), pk=pk)
