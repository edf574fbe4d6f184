"""Per-team limits: tasks, executions created on request, artifact bytes, the fair-share weight,
and the rolling-window ledger that runner send rates use too; and the config size limit.

Every quota is a team's (:class:`~tasks_app.models.TeamQuota`): a task counts against its team,
a run started on request against the team of its task, whoever asks. Every user has a personal
team, so the functions that take a user (:func:`owner_limits`, :func:`owner_quota_set`) mean
that user's personal team: the quotas users had before teams are their personal teams' now.

Every check that counts and then writes runs inside the caller's transaction, after locking the
team's :class:`~tasks_app.models.TeamQuota` row (``SELECT ... FOR UPDATE``, the row created on
first use). Two concurrent requests for one team therefore take turns: the second counts what
the first wrote (READ COMMITTED reads each statement from a fresh snapshot, taken after the lock
was granted), so they can never both pass the last free unit. Teams never wait on each other.
A check that spans several teams (a replay of several teams' runs) locks them in id order.

Which creations count against the hourly execution quota: those a user asks for (run now,
backfill, retry, replay, materialise on request). The scheduler's own occurrences do not: they
are bounded by the task quota and the runners' minimum intervals (see
:func:`tasks_api.checks.task_check_min_interval`).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Sum

from tasks_app.audit import audit_record
from tasks_app.models import Artifact, ArtifactStatus, QuotaUse, Task, TaskStatus, Team, TeamQuota
from tasks_app.teams.services import personal_team_of
from tms_core.clock import db_now
from tms_core.conf import tms_settings
from tms_core.errors import InvalidInput, QuotaExceeded

#: The largest fair-share weight (the ratio between two teams' shares stays readable).
MAX_FAIR_WEIGHT = 1000
#: The ledger kind of executions created on request.
EXECUTIONS = "executions"
HOUR = 3600.0
#: The limits a quota sets (and :func:`team_quota_set` takes).
QUOTA_FIELDS = ("max_tasks", "max_executions_per_hour", "max_artifact_bytes", "fair_weight")


@dataclass(frozen=True)
class TeamLimits:
    """A team's effective limits (0: no limit)."""

    max_tasks: int
    max_executions_per_hour: int
    max_artifact_bytes: int
    #: Share of the workers against other teams when more is due than they can start.
    fair_weight: int


#: The name before teams: the limits of a user's personal team.
OwnerLimits = TeamLimits


def personal_team_id(user_id: int) -> int:
    """The id of the personal team of the user ``user_id`` (made if they have none yet)."""
    found = Team.objects.filter(personal_of_id=user_id).values_list("id", flat=True).first()
    if found is not None:
        return found
    return personal_team_of(get_user_model().objects.get(pk=user_id)).pk


def team_limits(team_id: int) -> TeamLimits:
    """The limits that apply to the team: its :class:`TeamQuota` where set, else the defaults."""
    conf = tms_settings()
    row = TeamQuota.objects.filter(pk=team_id).first() or TeamQuota(team_id=team_id)
    return TeamLimits(
        max_tasks=_limit(row.max_tasks, conf.QUOTA_MAX_TASKS),
        max_executions_per_hour=_limit(row.max_executions_per_hour, conf.QUOTA_EXECUTIONS_PER_HOUR),
        max_artifact_bytes=_limit(row.max_artifact_bytes, conf.QUOTA_ARTIFACT_BYTES),
        fair_weight=_limit(row.fair_weight, conf.FAIR_WEIGHT),
    )


def owner_limits(owner: AbstractBaseUser) -> TeamLimits:
    """The limits of ``owner``'s personal team (the per-user form from before teams)."""
    return team_limits(personal_team_id(owner.pk))


def quota_check_values(limits: Mapping[str, Any]) -> dict[str, list[str]]:
    """The errors of a quota change ``limits`` (field: messages; empty when it is valid): a name
    that is not a quota, a limit that is not a whole number of 0 or more, a weight out of 1-1000.
    None means "back to the default"."""
    errors: dict[str, list[str]] = {name: ["Not a quota."] for name in sorted(set(limits) - set(QUOTA_FIELDS))}
    for name, value in limits.items():
        if name not in QUOTA_FIELDS or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            errors[name] = ["A whole number (empty: the default)."]
        elif name == "fair_weight" and not 1 <= value <= MAX_FAIR_WEIGHT:
            errors[name] = [f"Must be between 1 and {MAX_FAIR_WEIGHT} (empty: the default)."]
        elif name != "fair_weight" and value < 0:
            errors[name] = ["Must be 0 (no limit) or more."]
        elif name != "fair_weight" and value > (2**63 - 1 if name == "max_artifact_bytes" else 2**31 - 1):
            errors[name] = ["Too large."]
    return errors


def team_quota_set(*, team: Team, **limits: int | None) -> TeamQuota:
    """Set some of ``team``'s limits (``max_tasks``, ``max_executions_per_hour``,
    ``max_artifact_bytes``; None: back to the default, 0: no limit) and its ``fair_weight`` (its
    share of the workers when more is due than they can start; 1 to 1000, None: the default
    ``TMS_FAIR_WEIGHT``). Fields not given keep their values. :class:`InvalidInput` (per field)
    on a bad value, and nothing is changed. Audited (``quota.update``, for staff, as team changes
    are) when something changed. For operators (the admin, the API's ``PATCH /teams/{id}/quota``) and tooling."""
    errors = quota_check_values(limits)
    if errors:
        raise InvalidInput(errors)
    with transaction.atomic():
        quota = _lock(team.pk)
        changes = {
            name: {"from": getattr(quota, name), "to": value}
            for name, value in limits.items()
            if getattr(quota, name) != value
        }
        if changes:
            for name, value in limits.items():
                setattr(quota, name, value)
            quota.save(update_fields=list(limits))
            audit_record(
                action="quota.update",
                object_type="team",
                object_id=team.pk,
                owner=None,  # as the teams' own entries: for staff
                changes=changes,
                detail=f"quota of team {team.slug}",
            )
    return quota


def owner_quota_set(*, owner: AbstractBaseUser, **limits: int | None) -> TeamQuota:
    """:func:`team_quota_set` on ``owner``'s personal team (the per-user form from before teams)."""
    return team_quota_set(team=Team.objects.get(pk=personal_team_id(owner.pk)), **limits)


def _lock(team_id: int) -> TeamQuota:
    """Lock (creating it if needed) the team's quota row until the transaction ends."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("quota checks must run inside the transaction that writes")  # a programming error
    locked = TeamQuota.objects.select_for_update()
    quota = locked.filter(pk=team_id).first()
    if quota is None:  # first use: create it (a concurrent first use may win), then lock it
        TeamQuota.objects.bulk_create([TeamQuota(team_id=team_id)], ignore_conflicts=True)
        quota = locked.get(pk=team_id)
    return quota


def _limit(value: int | None, default: int) -> int:
    return default if value is None else value


@functools.cache
def _limit_statement(field: str) -> str:
    meta = TeamQuota._meta
    quote = connection.ops.quote_name
    column = str(getattr(meta.get_field(field), "column", field))
    return (
        f"SELECT {quote(column)} FROM {quote(str(meta.db_table))} "  # noqa: S608 - the model's names
        f"WHERE {quote(str(getattr(meta.pk, 'column', 'team_id')))} = %s"
    )


def _unlimited(team_id: int, field: str, default: int) -> bool:
    """Whether the team has no limit on ``field`` (0), read without a lock: such a team's
    writes need not take turns (a limit set meanwhile applies from the next request on).
    Its statement is written once per field: building the ORM's query for it each time was a
    sixth of a single task create's CPU (issue 33)."""
    with connection.cursor() as cursor:
        cursor.execute(_limit_statement(field), [team_id])
        row = cursor.fetchone()
    return _limit(row[0] if row else None, default) == 0


# --- sizes ---------------------------------------------------------------------------------------


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (how its size is judged against the limits)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())


def check_config_size(config: Any, *, field: str = "config") -> None:
    """Raise :class:`InvalidInput` on ``field`` when ``config`` is larger than TMS_MAX_CONFIG_BYTES."""
    limit = tms_settings().MAX_CONFIG_BYTES
    size = json_size(config)
    if size > limit:
        raise InvalidInput.on(field, f"At most {limit} bytes of JSON (TMS_MAX_CONFIG_BYTES); this one has {size}.")


# --- tasks and artifacts (400) -------------------------------------------------------------------


def quota_tasks_unlimited(max_tasks: int | None) -> bool:
    """Whether a team whose quota row says ``max_tasks`` (None: no row, or no value) holds any
    number of tasks: what :func:`quota_check_tasks` reads, for a caller that read the row already."""
    return _limit(max_tasks, tms_settings().QUOTA_MAX_TASKS) == 0


def quota_check_tasks(*, team_id: int, adding: int, unlimited: bool | None = None) -> None:
    """Inside the creating (or moving) transaction: raise :class:`InvalidInput` unless the team
    may hold ``adding`` more tasks (tasks not deleted count, paused and completed ones included,
    whoever created them). ``unlimited``: :func:`quota_tasks_unlimited` of the team's quota row,
    when the caller read it already (None: read here)."""
    if unlimited is None:
        unlimited = _unlimited(team_id, "max_tasks", tms_settings().QUOTA_MAX_TASKS)
    if adding <= 0 or unlimited:
        return
    quota = _lock(team_id)
    limit = _limit(quota.max_tasks, tms_settings().QUOTA_MAX_TASKS)
    if not limit:
        return
    have = Task.objects.filter(team_id=team_id).exclude(status=TaskStatus.DELETED).count()
    if have + adding > limit:
        raise InvalidInput.on(
            "non_field_errors",
            f"quota: at most {limit} tasks in this team; it has {have}. Delete tasks it no longer needs, "
            "or ask an operator to raise the team's quota.",
        )


def team_artifact_bytes(team_id: int) -> int:
    """Bytes of artifacts ``team_id`` holds: every artifact of the team but REJECTED ones, whoever
    uploaded it. The one count of the quota: its check and its report (:func:`team_quota_use`)."""
    held = Artifact.objects.filter(team_id=team_id).exclude(status=ArtifactStatus.REJECTED)
    return held.aggregate(total=Sum("size"))["total"] or 0


def quota_check_artifact(*, team_id: int, size: int, field: str = "file") -> None:
    """Inside the storing transaction: raise :class:`InvalidInput` on ``field`` unless the team
    may keep ``size`` more bytes of artifacts. Both ways in call it: a multipart upload before it
    stores the file, a signed upload when it is declared (its declared size is held from then on,
    until it is REJECTED or deleted); what is counted is :func:`team_artifact_bytes`."""
    if _unlimited(team_id, "max_artifact_bytes", tms_settings().QUOTA_ARTIFACT_BYTES):
        return
    quota = _lock(team_id)
    limit = _limit(quota.max_artifact_bytes, tms_settings().QUOTA_ARTIFACT_BYTES)
    if not limit:
        return
    have = team_artifact_bytes(team_id)
    if have + size > limit:
        raise InvalidInput.on(
            field,
            f"quota: artifacts may take at most {limit} bytes; you keep {have} and this one has {size}. "
            "Delete artifacts you no longer need, or ask an operator to raise your team's quota.",
        )


# --- rolling windows (429) -----------------------------------------------------------------------


def _take(*, team_id: int, kind: str, amount: int, limit: int, window: float) -> float:
    """Record ``amount`` uses of ``kind`` if they fit in ``limit`` per rolling ``window`` seconds
    and return 0; else record nothing and return the seconds until they would fit (``inf`` if
    ``amount`` alone exceeds ``limit``). The caller holds the team's quota lock."""
    now = db_now()
    start = now - timedelta(seconds=window)
    uses = QuotaUse.objects.filter(team_id=team_id, kind=kind)
    uses.filter(at__lte=start).delete()
    if amount > limit:
        return math.inf
    used = uses.aggregate(total=Sum("amount"))["total"] or 0
    excess = used + amount - limit
    if excess <= 0:
        QuotaUse.objects.create(team_id=team_id, kind=kind, amount=amount)
        return 0.0
    freed = 0
    for at, count in uses.order_by("at").values_list("at", "amount").iterator():  # the oldest leave first
        freed += count
        if freed >= excess:
            return max((at + timedelta(seconds=window) - now).total_seconds(), 0.001)
    return window  # pragma: no cover - excess never exceeds what is in the window


def quota_charge_executions(*, team_id: int, count: int, field: str = "non_field_errors") -> None:
    """Inside the creating transaction: count ``count`` executions created on request against
    the team's hourly quota, or raise :class:`QuotaExceeded` (429, with the seconds to wait) if
    they do not fit now, or :class:`InvalidInput` on ``field`` if they never can in one request."""
    quota_charge_executions_of({team_id: count}, field=field)


def quota_charge_executions_of(counts: Mapping[int, int], *, field: str = "non_field_errors") -> None:
    """:func:`quota_charge_executions` for runs of several teams at once (``{team id: count}``):
    all of them fit, each in its team's quota, or the first team's refusal is raised (the caller's
    transaction, and what was charged in it, is rolled back). The teams' rows are locked in id
    order, so two such requests never deadlock."""
    default = tms_settings().QUOTA_EXECUTIONS_PER_HOUR
    for team_id, count in sorted(counts.items()):
        if count <= 0 or _unlimited(team_id, "max_executions_per_hour", default):
            continue
        quota = _lock(team_id)
        limit = _limit(quota.max_executions_per_hour, default)
        if not limit:
            continue
        wait = _take(team_id=team_id, kind=EXECUTIONS, amount=count, limit=limit, window=HOUR)
        whose = "" if len(counts) == 1 else f" (team {team_id})"
        if wait == math.inf:
            raise InvalidInput.on(
                field,
                f"quota: at most {limit} executions per hour on request{whose}; this request would create {count}.",
            )
        if wait:
            raise QuotaExceeded(
                f"quota: at most {limit} executions per hour on request (run now, backfill, retry){whose}; "
                f"this request would create {count}. Try again in {math.ceil(wait)} s.",
                retry_after=math.ceil(wait),
            )


def rate_take(
    *, kind: str, limit: int, window: float, team_id: int | None = None, owner_id: int | None = None
) -> float:
    """Take one use of ``kind`` for the team if ``limit`` per rolling ``window`` seconds allows
    (returns 0), else the seconds to wait. Its own transaction: for the worker side (a runner's
    send rate, consulted before each launch). ``owner_id`` instead of ``team_id``: that user's
    personal team (what belongs to a user, such as a notification channel, counts there)."""
    if team_id is None:
        if owner_id is None:
            raise TypeError("rate_take needs team_id or owner_id")  # a programming error
        team_id = personal_team_id(owner_id)
    with transaction.atomic():
        _lock(team_id)
        return _take(team_id=team_id, kind=kind, amount=1, limit=limit, window=window)


@dataclass(frozen=True)
class TeamQuotaUse:
    """What a team uses of its quota now."""

    #: Tasks not deleted.
    tasks: int
    #: Executions created on request over the last hour.
    executions_last_hour: int
    #: Bytes of the team's artifacts held (all but REJECTED ones): :func:`team_artifact_bytes`,
    #: the count the check enforces.
    artifact_bytes: int


def team_quota_use(team: Team) -> TeamQuotaUse:
    """What ``team`` uses of its quota now (for the quota's page and API; three indexed reads)."""
    tasks = Task.objects.filter(team_id=team.pk).exclude(status=TaskStatus.DELETED).count()
    since = db_now() - timedelta(seconds=HOUR)
    uses = QuotaUse.objects.filter(team_id=team.pk, kind=EXECUTIONS, at__gt=since)
    executions = uses.aggregate(total=Sum("amount"))["total"] or 0
    return TeamQuotaUse(tasks=tasks, executions_last_hour=executions, artifact_bytes=team_artifact_bytes(team.pk))


def quota_uses_expire() -> int:
    """Delete ledger rows older than the longest window (an hour): those of teams whose next
    check would have deleted them but that have not come back. Returns how many."""
    deleted, _ = QuotaUse.objects.filter(at__lt=db_now() - timedelta(seconds=HOUR)).delete()
    return deleted
