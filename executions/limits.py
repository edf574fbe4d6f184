"""Named limits, enforced where a run is claimed: concurrency slots (leases) and rate windows
(a log of starts), kept in PostgreSQL so they hold across every worker and monitor.

A limit (:class:`tasks_app.models.Limit`) has one or more *buckets* (:class:`LimitBucket`): one
for the limit, or one per runner alias or target host of the runs that reference it. The checked
claim (:func:`executions.transitions.execution_claim_exclusive`) calls :func:`limits_take` in its
transaction, after locking the task and the execution: it locks the run's buckets
(``SELECT … FOR UPDATE``, in id order, so two claims never wait on each other in a cycle), counts
their live slots and their starts in each window, and either takes a slot in each capped bucket
(and, after the claim, logs the start with :func:`limits_record_start`) or says how long the run
must wait. Claims of different buckets never wait on each other; claims of one bucket take turns.

Nothing here writes an execution's status: the wait itself is a transition
(:func:`executions.transitions.execution_wait_for_limit`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, DateTimeField, ExpressionWrapper, Min, Q, Value
from django.db.models.functions import Now

from executions.models import Execution, ExecutionEvent, LimitBucket, LimitSlot, LimitStart
from executions.models import ExecutionStatus as S
from runners.registry import get_runner
from tasks_app.models import Limit, LimitScope
from tms_core.clock import db_now

logger = logging.getLogger(__name__)

#: A claim that finds a rate window full but with room within this many seconds waits for it
#: under the bucket lock instead of going back to wait (see :func:`limits_take`).
SPIN_SECONDS = 0.25

#: A run waiting for a concurrency slot is released by the end of a run holding one
#: (:func:`limits_release`); this backstop re-check covers a release that was lost, and a slot
#: whose holder died (the re-check comes when its lease lapses, if that is sooner).
SLOT_RECHECK_SECONDS = 30.0


def clock() -> datetime:
    """The database clock now (``clock_timestamp()``, not the transaction's start): taken after
    the bucket locks, so every claim of a bucket sees a later time than the one before it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def window_label(count: int, seconds: float) -> str:
    """``10/s``, ``1000/h``, ``100/min``, or ``5/2.5s``."""
    units = {1.0: "s", 60.0: "min", 3600.0: "h", 86400.0: "d"}
    if float(seconds) in units:
        return f"{count}/{units[float(seconds)]}"
    return f"{count}/{seconds:g}s"


@dataclass(frozen=True)
class Budget:
    """One bucket of a limit as a claim sees it."""

    bucket_id: int
    limit_id: int
    label: str
    max_concurrency: int | None
    windows: tuple[tuple[int, float], ...]


def _bucket_key(limit: Mapping[str, Any], *, runner: str, config: Mapping[str, Any]) -> str:
    if limit["scope"] == LimitScope.RUNNER:
        return runner
    if limit["scope"] == LimitScope.HOST:
        try:
            return get_runner(runner).limit_key(config)[:200]
        except Exception:
            logger.warning("runner %s: no limit key; using its alias", runner, exc_info=True)
            return runner
    return limit["key"] or limit["name"]


def _label(limit: Mapping[str, Any], key: str) -> str:
    return limit["name"] if limit["scope"] == LimitScope.KEY else key


def budgets_of(*, task_id: Any, runner: str, config: Mapping[str, Any], lock: bool) -> list[Budget]:
    """The buckets a run of the task counts against, created where missing; locked ``FOR UPDATE``
    in id order if ``lock`` (the caller's transaction holds them until it ends)."""
    limits = list(
        Limit.objects.filter(tasks=task_id).values("id", "name", "scope", "key", "max_concurrency", "windows")
    )
    if not limits:
        return []
    keys = {row["id"]: _bucket_key(row, runner=runner, config=config) for row in limits}
    wanted = Q()
    for limit_id, key in keys.items():
        wanted |= Q(limit_id=limit_id, key=key)
    buckets = LimitBucket.objects.filter(wanted).order_by("id")
    if lock:
        buckets = buckets.select_for_update()
    found = {row["limit_id"]: row["id"] for row in buckets.values("id", "limit_id")}
    missing = [LimitBucket(limit_id=i, key=k) for i, k in keys.items() if i not in found]
    if missing:
        # Created once per budget; a concurrent creator's row wins the unique (limit, key).
        LimitBucket.objects.bulk_create(missing, ignore_conflicts=True)
        found = {row["limit_id"]: row["id"] for row in buckets.values("id", "limit_id")}
    by_id = {row["id"]: row for row in limits}
    return sorted(
        (
            Budget(
                bucket_id=found[limit_id],
                limit_id=limit_id,
                label=_label(by_id[limit_id], keys[limit_id]),
                max_concurrency=by_id[limit_id]["max_concurrency"],
                windows=tuple((int(w["count"]), float(w["seconds"])) for w in by_id[limit_id]["windows"] or []),
            )
            for limit_id in keys
            if limit_id in found
        ),
        key=lambda budget: budget.bucket_id,
    )


@dataclass(frozen=True)
class LimitWait:
    """A run that may not start now: why, which bucket it waits for, and when to ask again."""

    bucket_id: int
    reason: str
    retry_at: datetime


@dataclass(frozen=True)
class LimitGrant:
    """A run that may start: its slots are taken; its start is logged after the claim."""

    rate_buckets: tuple[int, ...]


def _live_slots(bucket_id: int, now: datetime, *, other_than: int | None = None) -> Any:
    slots = LimitSlot.objects.filter(bucket_id=bucket_id, expires_at__gt=now, execution__status=S.RUNNING)
    return slots.exclude(execution_id=other_than) if other_than is not None else slots


def limits_take(
    *,
    execution_id: int,
    task_id: Any,
    runner: str,
    config: Mapping[str, Any],
    waiting_on: int | None,
    lease_seconds: float,
    behind_waiters: bool = False,
) -> LimitGrant | LimitWait:
    """Decide, in the caller's transaction, whether a run of a task with named limits may start
    now; if so take a slot in each capped bucket (a lease ``lease_seconds`` long, renewed with
    the execution's lease by :func:`limits_extend_slots`).

    Every bucket must have a live slot free (fewer than ``max_concurrency`` slots of RUNNING
    executions not expired) and room in every rate window (fewer than ``count`` logged starts
    after ``now - seconds``). Otherwise the run waits: for a slot, until a run of the bucket ends
    (:func:`limits_release`) or the earliest slot's lease would lapse, at most
    :data:`SLOT_RECHECK_SECONDS`; for a rate window, until the window has room. A run deferred
    by a rate window is *booked*: the bucket's ``next_start_at`` advances by one rate interval
    for each, so a herd of waiters wakes one interval apart rather than all at the roll of the
    window (no polling storm). A booked run that comes back to a full window (its claim was
    later than its booking) asks again when the window rolls, without a new booking. A window
    that has room within :data:`SPIN_SECONDS` is waited for here, under the bucket lock: with a
    sliding log every start that comes late (by a trip through the queue) delays every later
    start of its chain, so the rate would drift below its figure.

    ``behind_waiters``: the runs already waiting for a slot of a bucket go first (a run resumed
    after its worker died starts again behind them, see :func:`limits_take_again`).
    """
    budgets = budgets_of(task_id=task_id, runner=runner, config=config, lock=True)
    now = clock()
    for budget in budgets:
        if budget.max_concurrency is not None:
            live = _live_slots(budget.bucket_id, now, other_than=execution_id).aggregate(
                held=Count("id"), first=Min("expires_at")
            )
            held = live["held"]
            if behind_waiters:
                # Waiting, or published again to ask (still marked with the bucket until claimed).
                held += Execution.objects.filter(
                    status__in=(S.SCHEDULED, S.PENDING), waiting_on=budget.bucket_id
                ).count()
            if held >= budget.max_concurrency:
                recheck = now + timedelta(seconds=SLOT_RECHECK_SECONDS)
                lapse = live["first"] + timedelta(milliseconds=50) if live["first"] else recheck
                return LimitWait(
                    budget.bucket_id,
                    f"limit {budget.label} concurrency {budget.max_concurrency}",
                    min(recheck, lapse),
                )
        full = _full_windows(budget, now)
        if full and max(full)[0] - now <= timedelta(seconds=SPIN_SECONDS):
            # Room in a moment: wait for it here, holding the bucket (whose other claims would
            # be refused meanwhile anyway), rather than go back to the queue and come back late:
            # a start that is late by the round trip moves every later start of its chain.
            time.sleep(max(0.0, (max(full)[0] - now).total_seconds()) + 0.001)
            now = clock()
            full = _full_windows(budget, now)
        if full:
            return _book(budget, full, now=now, rebooked=waiting_on == budget.bucket_id)
    grant_rates = []
    for budget in budgets:
        if budget.max_concurrency is not None:
            _hold_slot(budget.bucket_id, execution_id, until=now + timedelta(seconds=lease_seconds))
        if budget.windows:
            grant_rates.append(budget.bucket_id)
            longest = max(seconds for _, seconds in budget.windows)
            LimitStart.objects.filter(bucket_id=budget.bucket_id, at__lt=now - timedelta(seconds=longest)).delete()
    return LimitGrant(tuple(grant_rates))


def _full_windows(budget: Budget, now: datetime) -> list[tuple[datetime, int, float]]:
    """The bucket's rate windows that are full at ``now``: (when it has room again, count, seconds)."""
    full = []
    for count, seconds in budget.windows:
        oldest = list(
            LimitStart.objects.filter(bucket_id=budget.bucket_id, at__gt=now - timedelta(seconds=seconds))
            .order_by("-at")
            .values_list("at", flat=True)[count - 1 : count]
        )
        if oldest:
            full.append((oldest[0] + timedelta(seconds=seconds), count, seconds))
    return full


def _book(budget: Budget, full: Sequence[tuple[datetime, int, float]], *, now: datetime, rebooked: bool) -> LimitWait:
    opens_at, count, seconds = max(full)
    reason = f"limit {budget.label} {window_label(count, seconds)}"
    if rebooked:
        return LimitWait(budget.bucket_id, reason, opens_at)
    booked = LimitBucket.objects.filter(pk=budget.bucket_id).values_list("next_start_at", flat=True).first()
    retry_at = max(opens_at, booked) if booked is not None else opens_at
    spacing = max(window_seconds / window_count for _, window_count, window_seconds in full)
    LimitBucket.objects.filter(pk=budget.bucket_id).update(next_start_at=retry_at + timedelta(seconds=spacing))
    return LimitWait(budget.bucket_id, reason, retry_at)


def _hold_slot(bucket_id: int, execution_id: int, *, until: datetime) -> None:
    updated = LimitSlot.objects.filter(bucket_id=bucket_id, execution_id=execution_id).update(expires_at=until)
    if not updated:
        try:
            with transaction.atomic():
                LimitSlot.objects.create(bucket_id=bucket_id, execution_id=execution_id, expires_at=until)
        except IntegrityError:  # pragma: no cover - the bucket lock serialises its slots
            LimitSlot.objects.filter(bucket_id=bucket_id, execution_id=execution_id).update(expires_at=until)


def limits_record_start(*, execution_id: int, buckets: Iterable[int]) -> None:
    """Log the start of a just-claimed run in its rate buckets, at the time of its claim event
    (so the event log and the rate log agree to the microsecond). In the claim's transaction,
    with the buckets still locked: every start logged before it is no later."""
    buckets = list(buckets)
    if not buckets:
        return
    at = (
        ExecutionEvent.objects.filter(execution_id=execution_id, to_status=S.RUNNING)
        .order_by("-id")
        .values_list("at", flat=True)
        .first()
    )
    LimitStart.objects.bulk_create([LimitStart(bucket_id=b, at=at or clock()) for b in buckets])


def limits_extend_slots(*, execution_id: int, seconds: float) -> int:
    """Push the expiry of the slots an execution holds (the lease keeper's heartbeat, or the
    gap until the next poll of an asynchronous run). Returns how many."""
    until = ExpressionWrapper(Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField())
    return LimitSlot.objects.filter(execution_id=execution_id).update(expires_at=until)


def limits_take_again(
    *, execution_id: int, task_id: Any, runner: str, config: Mapping[str, Any], seconds: float
) -> float | None:
    """A RUNNING run resumed after its worker died, before its external run was started (it
    starts again): its slots lapsed with the lease, and another run may hold them now. It takes
    them again like a new start, behind the runs already waiting for them, and its start counts
    in the rate windows again. Returns None if it may start, else the seconds to wait."""
    with transaction.atomic():
        decision = limits_take(
            execution_id=execution_id,
            task_id=task_id,
            runner=runner,
            config=config,
            waiting_on=None,
            lease_seconds=seconds,
            behind_waiters=True,
        )
        if isinstance(decision, LimitGrant):
            now = clock()
            LimitStart.objects.bulk_create([LimitStart(bucket_id=b, at=now) for b in decision.rate_buckets])
            return None
        return max(0.05, (decision.retry_at - clock()).total_seconds())


def limits_retake(*, execution_id: int, task_id: Any, runner: str, config: Mapping[str, Any], seconds: float) -> int:
    """A run polled or resumed while its external run goes on holds its slots again (they may have
    lapsed with its dead worker's lease): unconditionally, because the external run is using the
    target whatever the limit says. Returns how many."""
    with transaction.atomic():
        budgets = budgets_of(task_id=task_id, runner=runner, config=config, lock=True)
        until = clock() + timedelta(seconds=seconds)
        capped = [b for b in budgets if b.max_concurrency is not None]
        for budget in capped:
            _hold_slot(budget.bucket_id, execution_id, until=until)
    return len(capped)


def limits_release(*, execution_id: int) -> dict[int, int]:
    """Free the slots of a run that ended; return, for each capped bucket it freed, how many slots
    are free now. The caller makes as many of the bucket's waiting runs due now
    (:func:`executions.transitions.executions_release_limit_waiters`), in the same transaction:
    due times only, their claims decide again under the bucket lock."""
    freed = list(
        LimitSlot.objects.filter(execution_id=execution_id)
        .select_related("bucket__limit")
        .values_list("bucket_id", "bucket__limit__max_concurrency")
    )
    if not freed:
        return {}
    LimitSlot.objects.filter(execution_id=execution_id).delete()
    now = db_now()
    free = {}
    for bucket_id, cap in freed:
        if cap is not None and (room := cap - _live_slots(bucket_id, now).count()) > 0:
            free[bucket_id] = room
    return free


# --- what the API shows ----------------------------------------------------------------------


def limit_usage(*, limit: Limit, team_ids: Any = None) -> list[dict[str, Any]]:
    """Current use of each bucket of a limit: its key, the live slots held, the runs waiting and
    the starts logged in each rate window (database clock).

    With ``team_ids`` (the ids of a user's teams, a list or a subquery: a user reading a global
    limit, whose buckets every team shares): those teams' use only, in the buckets where their
    runs hold a slot or wait; another team's bucket keys (its target hosts), slots and waiting runs
    never show. Starts are logged per bucket, not per team, so a window's ``starts`` is None there."""
    now = clock()
    usage = []
    for bucket in LimitBucket.objects.filter(limit=limit).order_by("key"):
        slots = _live_slots(bucket.pk, now)
        waiting = Execution.objects.filter(status=S.SCHEDULED, waiting_on=bucket.pk)
        if team_ids is not None:
            slots = slots.filter(execution__team_id__in=team_ids)
            waiting = waiting.filter(team_id__in=team_ids)
        held = slots.count() if limit.max_concurrency is not None else 0
        waits = waiting.count()
        if team_ids is not None and not held and not waits:
            continue
        windows = [
            {
                "count": int(w["count"]),
                "seconds": float(w["seconds"]),
                "starts": None
                if team_ids is not None
                else LimitStart.objects.filter(
                    bucket=bucket, at__gt=now - timedelta(seconds=float(w["seconds"]))
                ).count(),
            }
            for w in limit.windows or []
        ]
        usage.append({"key": bucket.key, "slots_held": held, "waiting": waits, "windows": windows})
    return usage


def limits_in_use(
    *, limit_ids: Iterable[int], shared: Iterable[int] = (), team_ids: Iterable[int] | None = None
) -> dict[int, dict[str, int]]:
    """Per limit of ``limit_ids``: the live slots its runs hold (``running``) and the runs waiting
    on it (``waiting``), over all its buckets, in three queries however many limits (a list's
    column; :func:`limit_usage` gives one limit's buckets in detail).

    ``shared`` (global limits, whose budgets every team shares) count only the runs of
    ``team_ids`` when it is given (a user who does not see every team)."""
    ids = list(limit_ids)
    only = set(shared) if team_ids is not None else set()
    teams = set(team_ids or ())
    use = {pk: {"running": 0, "waiting": 0} for pk in ids}
    limit_of = dict(LimitBucket.objects.filter(limit_id__in=ids).values_list("pk", "limit_id"))
    if not limit_of:
        return use
    slots = (
        LimitSlot.objects.filter(bucket_id__in=list(limit_of), expires_at__gt=clock(), execution__status=S.RUNNING)
        .values_list("bucket_id", "execution__team_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    waiting = (
        Execution.objects.filter(status=S.SCHEDULED, waiting_on__in=list(limit_of))
        .values_list("waiting_on", "team_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    for what, rows in (("running", slots), ("waiting", waiting)):
        for bucket_id, team_id, count in rows:
            limit_id = limit_of[bucket_id]
            if limit_id not in only or team_id in teams:
                use[limit_id][what] += count
    return use
