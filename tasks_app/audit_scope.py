"""Whose audit entries a user reads: the history follows the team, not the person who made the object.

An entry written with :func:`tasks_app.audit.audit_record` names the object's ``owner`` (its
creator) and, for anything about a task, its ``task_id``. Reading by ``owner`` let a creator who
left the team (or whose task moved to another team) keep reading the task's later changes,
their actors and their addresses. So:

* an entry about a task (``task_id`` set: the task, its runs, its trigger URLs, its rules) is read
  by the members of the task's **current** team;
* an entry about another object that belongs to a team (a limit, a calendar, a notification
  channel, a run replayed across tasks: registered with :func:`register_team_object`) is read by
  the members of that object's current team;
* an entry about something of the user's own account that no team holds (their personal access
  tokens) is read by that user (``owner``);
* entries about teams, quotas and service accounts (no owner) are staff's, as before;
* staff read every entry; a token scoped to one team reads the entries of that team's objects only.
"""

from __future__ import annotations

from typing import Any

from django.db.models import CharField, Model, Q, QuerySet
from django.db.models.functions import Cast

from tasks_app.models import AuditEntry, Calendar, Limit, Task
from tasks_app.teams import scope_to_teams, sees_all
from tms_core.auth import token_team_id

#: ``object_type`` -> the model of objects that belong to a team (a ``team_id`` column) and whose
#: entries carry no ``task_id``. Apps above this one register theirs in ``AppConfig.ready``.
_TEAM_OBJECTS: dict[str, type[Model]] = {"limit": Limit, "calendar": Calendar}


def register_team_object(object_type: str, model: type[Model]) -> None:
    """Entries of ``object_type`` are read by the members of the team of the ``model`` row whose
    primary key is the entry's ``object_id`` (the row must have a ``team_id``)."""
    _TEAM_OBJECTS[object_type] = model


def team_object_types() -> frozenset[str]:
    """The object types whose entries follow their object's team."""
    return frozenset(_TEAM_OBJECTS)


def audit_visible(queryset: QuerySet[AuditEntry], user: Any) -> QuerySet[AuditEntry]:
    """``queryset`` narrowed to the entries ``user`` may read (see the module docstring)."""
    if sees_all(user):
        return queryset
    visible = Q(task_id__in=scope_to_teams(Task.objects.all(), user).values("pk"))
    for object_type, model in _TEAM_OBJECTS.items():
        ids = scope_to_teams(model._default_manager.all(), user).annotate(_key=Cast("pk", CharField()))
        visible |= Q(task_id__isnull=True, object_type=object_type, object_id__in=ids.values("_key"))
    if token_team_id(user) is None:
        # What belongs to no team: the user's own account's objects. A token scoped to one team
        # reads none of them (its user's other tokens are no business of a key for one team).
        visible |= Q(task_id__isnull=True, owner_id=user.pk) & ~Q(object_type__in=[*sorted(_TEAM_OBJECTS), "task"])
    return queryset.filter(visible)
