"""Moving a task to another team (:func:`task_move`) with its executions and its dashboard hours,
refused while something of its old team (calendar, limits, artifact, after links, notification
rules) keeps it there."""

from __future__ import annotations

from collections.abc import Collection

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from executions.models import Execution, TaskRollup
from tasks_api.task_writes import _audit_task, _lock
from tasks_app.models import Artifact, AuditAction, Calendar, Task, TaskDependency, TaskStatus, Team, TeamRole
from tasks_app.quotas import quota_check_tasks
from tasks_app.teams import require
from tms_core.errors import InvalidInput


def _move_refusals(task: Task, team: Team, replacing: Collection[str]) -> dict[str, list[str]]:
    """What keeps ``task`` in its team: a calendar or named limits of its team (a task uses its
    own team's only; global limits go anywhere) that the same request does not replace
    (``replacing``: the fields it changes too), an artifact of its team (never replaced: a task's
    artifact is fixed at creation), notification rules of its team made for this task (they
    would speak through the old team's channel about another team's task), and ``after`` links
    to or from tasks of its team (a workflow runs within one team: links never cross teams)."""
    errors: dict[str, list[str]] = {}
    if "calendar" not in replacing and task.calendar_id is not None:
        calendar = Calendar.objects.filter(pk=task.calendar_id).values_list("name", "team_id").first()
        if calendar is not None and calendar[1] != team.pk:
            errors["calendar"] = [
                f"The task uses calendar {calendar[0]!r} of its current team: give a calendar of the new team "
                "(or null) in the same request."
            ]
    if "limits" not in replacing and task.has_limits:
        names = sorted(task.limits.exclude(team__isnull=True).exclude(team_id=team.pk).values_list("name", flat=True))
        if names:
            errors["limits"] = [
                f"The task uses limits of its current team ({', '.join(map(repr, names))}): give limits of the new "
                "team (or global ones, or []) in the same request."
            ]
    if task.artifact_id is not None and not Artifact.objects.filter(pk=task.artifact_id, team_id=team.pk).exists():
        # A task's artifact is set when it is created and never changed.
        errors["artifact"] = [
            "The task runs an artifact of its current team, and a task's artifact does not change: upload the "
            "artifact to the new team and create the task there."
        ]
    # A workflow runs within one team: the tasks it follows and the tasks that follow it move
    # with it or not at all (its own ``after`` may be replaced in the same request).
    if "after" not in replacing and task.has_after:
        upstreams = TaskDependency.objects.filter(task_id=task.pk).exclude(upstream__team_id=team.pk)
        if upstreams.exists():
            errors["after"] = [
                "The task follows tasks of its current team: give an after of the new team's tasks (or []) "
                "in the same request."
            ]
    followers = sorted(
        str(pk)
        for pk in TaskDependency.objects.filter(upstream_id=task.pk)
        .exclude(task__status=TaskStatus.DELETED)
        .exclude(task__team_id=team.pk)
        .values_list("task_id", flat=True)[:10]
    )
    if followers:
        errors.setdefault("team", []).append(
            f"Tasks of the current team follow this task ({', '.join(followers)}): change their after first."
        )
    # The rules' app sits above this one: read through the relation it declares on tasks.
    rules = list(task.notification_rules.exclude(team_id=team.pk).values_list("pk", flat=True)[:10])
    if rules:
        errors.setdefault("team", []).append(
            f"Notification rules of the current team are set for this task (ids {', '.join(map(str, rules))}): "
            "delete them first (and make new ones in the new team)."
        )
    return errors


def task_move(*, task: Task, team: Team, user: User, replacing: Collection[str] = ()) -> Task:
    """Move ``task`` (its executions, past and future, and its hours of the dashboard's tasks
    failing most) to ``team``: ``user`` needs the editor role in both teams (PermissionDenied
    otherwise). Audited as an update of ``team``. A task not deleted counts against ``team``'s
    task quota from then on: :class:`InvalidInput` when the team holds as many as its quota
    allows.

    A task uses only its own team's calendars, limits and artifacts: a move is refused (400 on the
    field) while the task uses ones of its old team that ``replacing`` (the fields the same
    request changes, applied after the move) does not replace, runs an artifact of its old team,
    or has notification rules of the old team set for it (:func:`_move_refusals`).

    The task's row is locked FOR UPDATE, which waits for (and then blocks) every insert of one of
    its executions (they lock it FOR KEY SHARE and copy its team): no run is left in the old team.
    """
    require(user, task.team_id, TeamRole.EDITOR, "tasks_app.change_task")
    require(user, team.pk, TeamRole.EDITOR, "tasks_app.change_task", what="that team's tasks")
    with transaction.atomic():
        task = _lock(task.pk)
        if task.team_id == team.pk:
            return task
        refusals = _move_refusals(task, team, replacing)
        if refusals:
            raise InvalidInput(refusals)
        if task.status != TaskStatus.DELETED:
            quota_check_tasks(team_id=team.pk, adding=1)
        before = Team.objects.filter(pk=task.team_id).values_list("slug", flat=True).first()
        Task.objects.filter(pk=task.pk).update(team=team, updated_at=timezone.now())
        Execution.objects.filter(task_id=task.pk).update(team_id=team.pk)
        # Its hours of the dashboard's "failing most" go with it, as its runs do; the per-minute
        # figures (by team and runner, not by task) keep counting its past runs in the old team.
        TaskRollup.objects.filter(task_id=task.pk).update(team_id=team.pk)
        task.team = team
        _audit_task(task, AuditAction.UPDATE, changes={"team": {"from": before, "to": team.slug}}, detail="moved")
    return task
