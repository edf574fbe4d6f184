"""Per-owner limits: config size, tasks, executions created on request, artifact bytes, and the
rolling-window ledger that runner send rates use too.

Every check that counts and then writes runs inside the caller's transaction, after locking the
owner's :class:`~tasks_app.models.OwnerQuota` row (``SELECT ... FOR UPDATE``, the row created on
first use). Two concurrent requests of one owner therefore take turns: the second counts what the
first wrote (READ COMMITTED reads each statement from a fresh snapshot, taken after the lock was
granted), so they can never both pass the last free unit. Owners never wait on each other.

Which creations count against the hourly execution quota: those a user asks for (run now,
backfill, retry). The scheduler's own occurrences do not: they are bounded by the task quota and
the runners' minimum intervals (see :func:`tasks_api.services.task_check_min_interval`).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Sum

from tasks_app.models import Artifact, ArtifactStatus, OwnerQuota, QuotaUse, Task, TaskStatus
from tms_core.clock import db_now
from tms_core.conf import tms_settings
from tms_core.errors import InvalidInput, QuotaExceeded

#: The largest fair-share weight (the ratio between two owners' shares stays readable).
MAX_FAIR_WEIGHT = 1000
#: The ledger kind of executions created on request.
EXECUTIONS = "executions"
HOUR = 3600.0


@dataclass(frozen=True)
class OwnerLimits:
    """An owner's effective limits (0: no limit)."""

    max_tasks: int
    max_executions_per_hour: int
    max_artifact_bytes: int
    #: Share of the workers against other owners when more is due than they can start.
    fair_weight: int


def owner_limits(owner: AbstractBaseUser) -> OwnerLimits:
    """The limits that apply to ``owner``: their :class:`OwnerQuota` where set, else the defaults."""
    conf = tms_settings()
    row = OwnerQuota.objects.filter(pk=owner.pk).first() or OwnerQuota(user_id=owner.pk)
    return OwnerLimits(
        max_tasks=_limit(row.max_tasks, conf.QUOTA_MAX_TASKS),
        max_executions_per_hour=_limit(row.max_executions_per_hour, conf.QUOTA_EXECUTIONS_PER_HOUR),
        max_artifact_bytes=_limit(row.max_artifact_bytes, conf.QUOTA_ARTIFACT_BYTES),
        fair_weight=_limit(row.fair_weight, conf.FAIR_WEIGHT),
    )


def owner_quota_set(*, owner: AbstractBaseUser, **limits: int | None) -> OwnerQuota:
    """Set some of ``owner``'s limits (``max_tasks``, ``max_executions_per_hour``,
    ``max_artifact_bytes``; None: back to the default, 0: no limit) and their ``fair_weight`` (their
    share of the workers when more is due than they can start; 1 to 1000, None: the default
    ``TMS_FAIR_WEIGHT``). For operators and tooling."""
    unknown = set(limits) - {"max_tasks", "max_executions_per_hour", "max_artifact_bytes", "fair_weight"}
    if unknown:
        raise InvalidInput({name: ["Not a quota."] for name in sorted(unknown)})
    negative = sorted(
        name for name, value in limits.items() if name != "fair_weight" and value is not None and value < 0
    )
    errors = {name: ["Must be 0 (no limit) or more."] for name in negative}
    weight = limits.get("fair_weight")
    if weight is not None and not 1 <= weight <= MAX_FAIR_WEIGHT:
        errors["fair_weight"] = [f"Must be between 1 and {MAX_FAIR_WEIGHT} (empty: the default)."]
    if errors:
        raise InvalidInput(errors)
    quota, _ = OwnerQuota.objects.update_or_create(user_id=owner.pk, defaults=limits)
    return quota


def _lock(owner_id: int) -> OwnerQuota:
    """Lock (creating it if needed) the owner's quota row until the transaction ends."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("quota checks must run inside the transaction that writes")  # a programming error
    locked = OwnerQuota.objects.select_for_update()
    quota = locked.filter(pk=owner_id).first()
    if quota is None:  # first use: create it (a concurrent first use may win), then lock it
        OwnerQuota.objects.bulk_create([OwnerQuota(user_id=owner_id)], ignore_conflicts=True)
        quota = locked.get(pk=owner_id)
    return quota


def _limit(value: int | None, default: int) -> int:
    return default if value is None else value


@functools.cache
def _limit_statement(field: str) -> str:
    meta = OwnerQuota._meta
    quote = connection.ops.quote_name
    column = str(getattr(meta.get_field(field), "column", field))
    return (
        f"SELECT {quote(column)} FROM {quote(str(meta.db_table))} "  # noqa: S608 - the model's names
        f"WHERE {quote(str(getattr(meta.pk, 'column', 'user_id')))} = %s"
    )


def _unlimited(owner_id: int, field: str, default: int) -> bool:
    """Whether the owner has no limit on ``field`` (0), read without a lock: such an owner's
    writes need not take turns (a limit set meanwhile applies from the next request on).
    Its statement is written once per field: building the ORM's query for it each time was a
    sixth of a single task create's CPU (issue 33)."""
    with connection.cursor() as cursor:
        cursor.execute(_limit_statement(field), [owner_id])
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


def quota_check_tasks(*, owner: AbstractBaseUser, adding: int) -> None:
    """Inside the creating transaction: raise :class:`InvalidInput` unless ``owner`` may have
    ``adding`` more tasks (tasks not deleted count, paused and completed ones included)."""
    if _unlimited(owner.pk, "max_tasks", tms_settings().QUOTA_MAX_TASKS):
        return
    quota = _lock(owner.pk)
    limit = _limit(quota.max_tasks, tms_settings().QUOTA_MAX_TASKS)
    if not limit:
        return
    have = Task.objects.filter(owner_id=owner.pk).exclude(status=TaskStatus.DELETED).count()
    if have + adding > limit:
        raise InvalidInput.on(
            "non_field_errors",
            f"quota: at most {limit} tasks; you have {have}. Delete tasks you no longer need, "
            "or ask an operator to raise your quota.",
        )


def quota_check_artifact(*, owner: AbstractBaseUser, size: int, field: str = "file") -> None:
    """Inside the storing transaction: raise :class:`InvalidInput` on ``field`` unless ``owner``
    may keep ``size`` more bytes of artifacts. Both ways in call it: a multipart upload before it
    stores the file, a signed upload when it is declared (its declared size is held from then on,
    until it is REJECTED or deleted); what is counted is every artifact but REJECTED ones."""
    if _unlimited(owner.pk, "max_artifact_bytes", tms_settings().QUOTA_ARTIFACT_BYTES):
        return
    quota = _lock(owner.pk)
    limit = _limit(quota.max_artifact_bytes, tms_settings().QUOTA_ARTIFACT_BYTES)
    if not limit:
        return
    held = Artifact.objects.filter(owner_id=owner.pk).exclude(status=ArtifactStatus.REJECTED)
    have = held.aggregate(total=Sum("size"))["total"] or 0
    if have + size > limit:
        raise InvalidInput.on(
            field,
            f"quota: artifacts may take at most {limit} bytes; you keep {have} and this one has {size}. "
            "Delete artifacts you no longer need, or ask an operator to raise your quota.",
        )


# --- rolling windows (429) -----------------------------------------------------------------------


def _take(*, owner_id: int, kind: str, amount: int, limit: int, window: float) -> float:
    """Record ``amount`` uses of ``kind`` if they fit in ``limit`` per rolling ``window`` seconds
    and return 0; else record nothing and return the seconds until they would fit (``inf`` if
    ``amount`` alone exceeds ``limit``). The caller holds the owner's quota lock."""
    now = db_now()
    start = now - timedelta(seconds=window)
    uses = QuotaUse.objects.filter(owner_id=owner_id, kind=kind)
    uses.filter(at__lte=start).delete()
    if amount > limit:
        return math.inf
    used = uses.aggregate(total=Sum("amount"))["total"] or 0
    excess = used + amount - limit
    if excess <= 0:
        QuotaUse.objects.create(owner_id=owner_id, kind=kind, amount=amount)
        return 0.0
    freed = 0
    for at, count in uses.order_by("at").values_list("at", "amount").iterator():  # the oldest leave first
        freed += count
        if freed >= excess:
            return max((at + timedelta(seconds=window) - now).total_seconds(), 0.001)
    return window  # pragma: no cover - excess never exceeds what is in the window


def quota_charge_executions(*, owner_id: int, count: int, field: str = "non_field_errors") -> None:
    """Inside the creating transaction: count ``count`` executions created on request against
    the owner's hourly quota, or raise :class:`QuotaExceeded` (429, with the seconds to wait) if
    they do not fit now, or :class:`InvalidInput` on ``field`` if they never can in one request."""
    if count <= 0 or _unlimited(owner_id, "max_executions_per_hour", tms_settings().QUOTA_EXECUTIONS_PER_HOUR):
        return
    quota = _lock(owner_id)
    limit = _limit(quota.max_executions_per_hour, tms_settings().QUOTA_EXECUTIONS_PER_HOUR)
    if not limit:
        return
    wait = _take(owner_id=owner_id, kind=EXECUTIONS, amount=count, limit=limit, window=HOUR)
    if wait == math.inf:
        raise InvalidInput.on(
            field, f"quota: at most {limit} executions per hour on request; this request would create {count}."
        )
    if wait:
        raise QuotaExceeded(
            f"quota: at most {limit} executions per hour on request (run now, backfill, retry); "
            f"this request would create {count}. Try again in {math.ceil(wait)} s.",
            retry_after=math.ceil(wait),
        )


def rate_take(*, owner_id: int, kind: str, limit: int, window: float) -> float:
    """Take one use of ``kind`` for the owner if ``limit`` per rolling ``window`` seconds allows
    (returns 0), else the seconds to wait. Its own transaction: for the worker side (a runner's
    send rate, consulted before each launch)."""
    with transaction.atomic():
        _lock(owner_id)
        return _take(owner_id=owner_id, kind=kind, amount=1, limit=limit, window=window)


def quota_uses_expire() -> int:
    """Delete ledger rows older than the longest window (an hour): those of owners whose next
    check would have deleted them but who have not come back. Returns how many."""
    deleted, _ = QuotaUse.objects.filter(at__lt=db_now() - timedelta(seconds=HOUR)).delete()
    return deleted
