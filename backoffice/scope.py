"""What a user may see and do in the back office: the API's team rule (:mod:`tasks_app.teams`).

Seeing: the tasks and executions of the teams a user is a member of (staff see all); every page
reads tasks and executions through these, so another team's ids answer 404. Acting: by the
user's role in the object's team (operator: run now, pause, resume, cancel, retry, backfill;
editor: edit, trigger URL, delete), or anywhere with the model permission the admin's actions ask
for (``tasks_app.change_task``, ``tasks_app.delete_task``, ``executions.change_execution``;
superusers have them all). So read-only support staff see everything and change nothing: the
pages hide the buttons and refuse the POSTs with a 403.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from executions.models import Execution
from tasks_app import teams
from tasks_app.models import Task, TeamRole


def visible_tasks(user: Any) -> QuerySet[Task]:
    """Tasks ``user`` may see and act on (deleted ones are gone, as in the API)."""
    return teams.visible_tasks(user)


def visible_executions(user: Any) -> QuerySet[Execution]:
    """Executions of ``user``'s teams' tasks (all for staff), deleted tasks' history included."""
    # team_id is the task's team, copied at creation (and moved with the task): no join to the tasks.
    return teams.scope_to_teams(Execution.objects.all(), user)


def task_or_404(user: Any, pk: Any) -> Task:
    return get_object_or_404(visible_tasks(user), pk=pk)


def execution_or_404(user: Any, pk: Any) -> Execution:
    return get_object_or_404(visible_executions(user).select_related("task"), pk=pk)


def may_change_execution(user: Any, execution: Execution) -> bool:
    """Whether ``user`` may cancel or retry ``execution`` (operator)."""
    return teams.may(user, execution.team_id, TeamRole.OPERATOR, "executions.change_execution")


def task_abilities(user: Any, task: Task) -> dict[str, bool]:
    """What the task page offers ``user``, from one read of their role: ``can_operate`` (pause,
    resume, run, backfill: operator), ``can_change`` (edit, trigger URL: editor), ``can_delete``
    (editor); or the model permission, as :func:`tasks_app.teams.may`."""
    # Read with the task when the page asked for it (teams.with_role): no query of its own.
    held = task.caller_role if hasattr(task, "caller_role") else teams.role_in(user, task.team_id)
    operate, edit = teams.includes(held, TeamRole.OPERATOR), teams.includes(held, TeamRole.EDITOR)
    return {
        "can_operate": operate or user.has_perm("tasks_app.change_task"),
        "can_change": edit or user.has_perm("tasks_app.change_task"),
        "can_delete": edit or user.has_perm("tasks_app.delete_task"),
    }


def task_to_change(user: Any, pk: Any, *, delete: bool = False, role: str = TeamRole.EDITOR) -> Task:
    """The task ``user`` acts on: 404 if they may not see it, 403 if their role is below ``role``
    (editor unless said: operators call :func:`task_to_operate`)."""
    task = task_or_404(user, pk)
    permission = "tasks_app.delete_task" if delete else "tasks_app.change_task"
    teams.require(user, task.team_id, role, permission)
    return task


def task_to_operate(user: Any, pk: Any) -> Task:
    """The task ``user`` pauses, resumes, runs or backfills: 404 / 403 as :func:`task_to_change`."""
    return task_to_change(user, pk, role=TeamRole.OPERATOR)


def execution_to_change(user: Any, pk: Any) -> Execution:
    """The execution ``user`` cancels or retries: 404 if they may not see it, 403 if they are less
    than an operator in its team."""
    execution = execution_or_404(user, pk)
    teams.require(user, execution.team_id, TeamRole.OPERATOR, "executions.change_execution", what="this execution")
    return execution
