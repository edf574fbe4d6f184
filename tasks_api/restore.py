"""Restore a task's earlier version: its settings as they were then, applied as a change like any
other (the API's PATCH rules, :func:`tasks_api.editing.task_update`), so it is audited, makes a
new version and replaces the runs that have not started where a PATCH would.

A version holds its config with every secret masked (:mod:`tasks_app.versions`): a restore keeps
the task's current value of each secret still at the same place, and refuses (400 on ``config``)
a version whose config had a secret the task no longer holds, which no restore can bring back.
The team, the artifact and the lifecycle are not settings of a version: a restore leaves them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rest_framework.exceptions import ValidationError

from tasks_api.editing import task_update
from tasks_api.serializers import TaskUpdateSerializer
from tasks_api.task_config import task_config
from tasks_app.fields import UPDATABLE_FIELDS
from tasks_app.masking import masks_left
from tasks_app.models import Task, TaskVersion, TeamRole
from tasks_app.secrets import config_unmask
from tasks_app.teams import require
from tasks_app.versions import version_first_ensure
from tms_core.errors import GoneError, InvalidInput

#: Settings a version names only when they hold something: missing means none.
LIST_SETTINGS = ("limits", "after")


@dataclass(frozen=True)
class RestoreReport:
    """What a restore did: the version restored, the settings it changed, the task's version now."""

    restored: int
    changed: list[str]
    version: int


def version_changes(task: Task, snapshot: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of ``snapshot`` (an earlier version) that differ from ``current`` (the task's
    version now), as the API's PATCH takes them."""
    changes: dict[str, Any] = {}
    for name in sorted(UPDATABLE_FIELDS):
        if name in LIST_SETTINGS:
            old, now = snapshot.get(name) or [], current.get(name) or []
        elif name not in snapshot:
            continue  # a setting the task did not have then: left as it is
        else:
            old, now = snapshot[name], current.get(name)
        if old != now:
            changes[name] = old
    if "config" in changes and masks_left(config_unmask(changes["config"], task_config(task))):
        raise InvalidInput.on(
            "config",
            "This version's config held a secret that the task no longer has (versions never keep secrets): "
            "restore cannot bring it back. Edit the task and type the secret instead.",
        )
    return changes


def task_version_restore(*, task: Task, number: int, user: Any, actor: str, request: Any = None) -> RestoreReport:
    """Give ``task`` the settings of its version ``number`` again (see the module). An editor's
    act in the task's team (PermissionDenied otherwise, as any change); :class:`GoneError` (404)
    for a version the task does not have; the PATCH's refusals (400 per field) when those
    settings are no longer valid (a calendar or an upstream task since deleted ...)."""
    require(user, task.team_id, TeamRole.EDITOR, "tasks_app.change_task")
    if 1 in (number, task.version):
        version_first_ensure(task.pk)  # written lazily (tasks_app.versions)
    versions = {
        row.number: row for row in TaskVersion.objects.filter(task_id=task.pk, number__in={number, task.version})
    }
    if number not in versions:
        raise GoneError(f"The task has no version {number}.")
    current = versions[task.version].snapshot if task.version in versions else {}
    changes = version_changes(task, versions[number].snapshot, current)
    if not changes:
        return RestoreReport(restored=number, changed=[], version=task.version)
    serializer = TaskUpdateSerializer(task, data=changes, context={"request": request})
    if not serializer.is_valid():
        raise ValidationError(serializer.errors)
    updated = task_update(
        task=task, actor=actor, changes=serializer.validated_data, detail=f"restored version {number}"
    )
    return RestoreReport(restored=number, changed=sorted(changes), version=updated.version)
