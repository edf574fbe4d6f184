"""Named limits: the services that define them and attach them to tasks.

A team's editors define limits for the team's tasks; staff define global ones (no team) that any
team's task may reference by name. A task names its limits; a limit of the task's team of that
name wins over a global one, and a limit of another team is never found. The enforcement is in
:mod:`executions.limits`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q

from executions.models import Execution, ExecutionStatus
from tasks_api.named import audit_update, change_locked, create_audited, delete_audited, listed, name_taken
from tasks_app.models import (
    MAX_LIMIT_CONCURRENCY,
    MAX_LIMITS_PER_TASK,
    MAX_WINDOW_COUNT,
    MAX_WINDOW_SECONDS,
    MAX_WINDOWS,
    MIN_WINDOW_SECONDS,
    Limit,
    LimitScope,
    Task,
    Team,
    claims_exclusive,
)
from tasks_app.teams import member_team_ids, sees_all
from tasks_app.teams.services import team_for_new
from tms_core.errors import InvalidInput

#: What an audit entry shows of a limit.
LIMIT_FIELDS = ("name", "scope", "key", "max_concurrency", "windows")


def _snapshot(limit: Limit) -> dict[str, Any]:
    return {name: getattr(limit, name) for name in LIMIT_FIELDS}


def limit_clean_windows(windows: Any) -> list[dict[str, float | int]]:
    """Normalise rate windows (``[{"count": 10, "seconds": 1}]``); a window that cannot be met
    (count or length not positive, out of bounds) is an error on ``windows``."""
    given = listed(
        windows,
        field="windows",
        expected='{"count": N, "seconds": S}',
        most=MAX_WINDOWS,
        too_many=f"At most {MAX_WINDOWS} rate windows.",
    )
    cleaned: list[dict[str, float | int]] = []
    for index, window in enumerate(given):
        where = f"Window {index}"
        if not isinstance(window, Mapping) or set(window) != {"count", "seconds"}:
            raise InvalidInput.on("windows", f'{where}: expected exactly {{"count": N, "seconds": S}}.')
        count, seconds = window["count"], window["seconds"]
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_WINDOW_COUNT:
            raise InvalidInput.on("windows", f"{where}: count must be a whole number from 1 to {MAX_WINDOW_COUNT}.")
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or not MIN_WINDOW_SECONDS <= seconds <= MAX_WINDOW_SECONDS
        ):
            raise InvalidInput.on(
                "windows", f"{where}: seconds must be from {MIN_WINDOW_SECONDS:g} to {MAX_WINDOW_SECONDS:g}."
            )
        if any(other["seconds"] == float(seconds) for other in cleaned):
            raise InvalidInput.on("windows", f"{where}: two windows of {seconds:g}s.")
        cleaned.append({"count": count, "seconds": float(seconds)})
    return cleaned


def _validate(limit: Limit) -> None:
    errors: dict[str, list[str]] = {}
    if not limit.name or len(limit.name) > 100:
        errors["name"] = ["A name of 1 to 100 characters is required."]
    if limit.scope not in LimitScope.values:
        errors["scope"] = [f"One of {', '.join(LimitScope.values)}."]
    if limit.max_concurrency is not None and not 1 <= limit.max_concurrency <= MAX_LIMIT_CONCURRENCY:
        errors["max_concurrency"] = [f"From 1 to {MAX_LIMIT_CONCURRENCY}, or empty for no cap."]
    if limit.max_concurrency is None and not limit.windows and "max_concurrency" not in errors:
        errors["windows"] = ["A limit needs a concurrency cap (max_concurrency) or at least one rate window."]
    if limit.key and limit.scope != LimitScope.KEY:
        errors["key"] = ["Only a limit of scope key takes a key: the others take it from each run."]
    if errors:
        raise InvalidInput(errors)


def _name_taken(*, team_id: int | None, name: str, exclude: int | None = None) -> bool:
    same = Limit.objects.filter(name=name)
    same = same.filter(team__isnull=True) if team_id is None else same.filter(team_id=team_id)
    return same.exclude(pk=exclude).exists() if exclude is not None else same.exists()


def limit_create(
    *,
    owner: User | None,
    team: Team | None = None,
    name: str,
    scope: str = LimitScope.KEY,
    key: str = "",
    max_concurrency: int | None = None,
    windows: Any = None,
) -> Limit:
    """Define a named limit for the tasks of ``team`` (default: ``owner``'s personal team; ``owner``
    needs the editor role in it, else PermissionDenied), or a global one (``owner=None``: staff
    only, checked by the caller). ``owner`` is recorded as who defined it. Audited. A duplicate
    name (per team; among global limits) is an error on ``name``."""
    if owner is not None:
        team = team_for_new(owner, team, permission="tasks_app.add_limit", what="this team's limits")
    limit = Limit(
        owner=owner,
        team=team if owner is not None else None,
        name=name,
        scope=scope,
        key=key,
        max_concurrency=max_concurrency,
        windows=limit_clean_windows(windows),
    )
    _validate(limit)
    owner_id = owner.pk if owner is not None else None
    if _name_taken(team_id=limit.team_id, name=name):
        raise name_taken("limit", name)
    create_audited(limit, kind="limit", owner_id=owner_id, snapshot=_snapshot)
    return limit


def limit_update(*, limit: Limit, changes: Mapping[str, Any]) -> Limit:
    """Change a limit (partial). Takes effect at the next claim of each run; runs already
    holding a slot keep it. Audited."""
    with transaction.atomic():
        # The limit's row, not its buckets: claims lock buckets, so an update never waits on them.
        locked, before = change_locked(
            limit, changes, fields=LIMIT_FIELDS, snapshot=_snapshot, clean={"windows": limit_clean_windows}
        )
        _validate(locked)
        if "name" in changes and _name_taken(team_id=locked.team_id, name=locked.name, exclude=locked.pk):
            raise name_taken("limit", locked.name)
        if "scope" in changes or "key" in changes:
            locked.buckets.all().delete()  # budgets are re-made per the new scope at the next claims
        locked.save()
        audit_update(locked, kind="limit", before=before, after=_snapshot(locked))
    return locked


def limit_delete(*, limit: Limit) -> None:
    """Delete a limit no task references (a referenced one is an error naming the tasks). Audited."""
    with transaction.atomic():
        locked = Limit.objects.select_for_update().get(pk=limit.pk)
        users = list(locked.tasks.exclude(status="DELETED").values_list("id", flat=True)[:5])
        if users:
            names = ", ".join(str(task_id) for task_id in users)
            raise InvalidInput.on("name", f"Limit {locked.name!r} is referenced by tasks ({names}); remove it first.")
        delete_audited(locked, kind="limit", snapshot=_snapshot)


def limits_visible(*, user: User) -> Any:
    """The limits a user may read: their teams' and the global ones (staff: all)."""
    if sees_all(user):
        return Limit.objects.all()
    return Limit.objects.filter(Q(team_id__in=member_team_ids(user)) | Q(team__isnull=True))


def limits_resolve(*, team_id: int, names: Iterable[str], field: str = "limits") -> list[Limit]:
    """The limits a task of team ``team_id`` means by ``names``: the team's own of that name,
    else the global one. An unknown name (a limit of another team included: it is not found), a
    repeated one or too many are errors on ``field``."""
    names = list(names)
    if not names:
        return []  # most tasks: no query (a bulk create asked once per task)
    if len(names) > MAX_LIMITS_PER_TASK:
        raise InvalidInput.on(field, f"At most {MAX_LIMITS_PER_TASK} limits per task.")
    if len(set(names)) != len(names):
        raise InvalidInput.on(field, "A limit is named twice.")
    found: dict[str, Limit] = {}
    for limit in Limit.objects.filter(Q(team_id=team_id) | Q(team__isnull=True), name__in=names):
        if limit.name not in found or limit.team_id is not None:
            found[limit.name] = limit
    unknown = [name for name in names if name not in found]
    if unknown:
        raise InvalidInput.on(
            field, f"No limit named {', '.join(map(repr, unknown))} in the task's team, nor a global one."
        )
    return [found[name] for name in names]


def task_limit_names(task: Task) -> list[str]:
    return sorted(limit.name for limit in task.limits.all())


def task_set_limits(*, task: Task, limits: Sequence[Limit]) -> None:
    """Reference exactly ``limits`` from ``task`` (in the caller's transaction, the task locked):
    sets the denormalised ``has_limits`` and routes its waiting executions to the checked claim."""
    task.limits.set(limits)
    has = bool(limits)
    if task.has_limits != has:
        task.has_limits = has
        Task.objects.filter(pk=task.pk).update(has_limits=has)
    exclusive = claims_exclusive(
        overlap_policy=task.overlap_policy, max_concurrency=task.max_concurrency, has_limits=has
    )
    Execution.objects.filter(task=task, status__in=(ExecutionStatus.SCHEDULED, ExecutionStatus.PENDING)).exclude(
        exclusive=exclusive
    ).update(exclusive=exclusive)
