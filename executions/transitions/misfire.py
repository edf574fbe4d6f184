"""The misfire policy and the maximum age, decided where a run is dispatched or claimed, and the
skip both start rules (misfire, overlap) record: ``SCHEDULED | PENDING → CANCELLED`` with a
skipped occurrence."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, OuterRef, Q, Subquery, Value
from django.db.models.functions import Now
from django.db.models.lookups import IsNull

from executions.models import Execution, SkippedOccurrence, SkipReason
from executions.transitions import states
from executions.transitions.sql import write
from tasks_app.models import MisfirePolicy, Task

#: No task's misfire grace is shorter (``tasks_app.models.MIN_MISFIRE_GRACE``): a row less late
#: than this is on time whatever its task says, and is dispatched or claimed without looking.
_NEVER_STALE = timedelta(seconds=1)


def _of_task(column: str) -> Subquery:
    return Subquery(Task.objects.filter(pk=OuterRef("task_id")).values(column)[:1])


def _ago(amount: Subquery) -> ExpressionWrapper:
    return ExpressionWrapper(Now() - amount, output_field=DateTimeField())


def on_time_cheap() -> Q:
    """Rows certainly on time for the misfire policy, known from the row alone: not a scheduled
    first attempt (triggers, retries by request and retry backoffs are not misfires), or due less
    than a second ago."""
    return (
        Q(due_at__gte=ExpressionWrapper(Now() - Value(_NEVER_STALE), output_field=DateTimeField()))
        | ~Q(origin="schedule")
        | Q(attempt__gt=1)
    )


def on_time() -> Q:
    """The rows the misfire policy and the maximum age have nothing to say about now:
    :func:`on_time_cheap`, or due less than the task's ``misfire_grace`` ago and fired less than
    its ``max_age`` ago. The cheap tests come first: PostgreSQL evaluates an OR left to right and
    stops at the first true one, so the task is looked up (primary-key reads) only for a row over a
    second late. (A row due less than a second ago is never expired: ``max_age`` is at least the
    task's jitter plus one second.)"""
    fresh = Q(due_at__gte=_ago(_of_task("misfire_grace"))) & (
        Q(scheduled_for__gte=_ago(_of_task("max_age"))) | Q(IsNull(_of_task("max_age"), True))
    )
    return on_time_cheap() | fresh


@dataclass(frozen=True)
class Misfire:
    """What the misfire policy says of a stale execution: dropped (recorded as a skipped
    occurrence with ``reason``), or, with no reason, run as a catch-up."""

    reason: str
    detail: str

    @property
    def dropped(self) -> bool:
        return bool(self.reason)


def misfire_decision(*, execution_id: int) -> Misfire | None:
    """What the task's misfire policy says of a SCHEDULED or PENDING execution now: None (it is
    not stale), a catch-up run, or why it is dropped.

    A scheduled first attempt is *stale* when more than its task's ``misfire_grace`` has passed
    since it was due. Of a stale execution, ``skip`` runs nothing (reason ``missed``); ``run_once``
    runs it only if no later occurrence of the task is stale too (whatever became of it), and
    ``run_all`` only if fewer than ``catch_up_limit`` are (otherwise ``coalesced``): the latest
    missed occurrences run, once. A later occurrence that is on time does not count: it is not
    a catch-up run (docs/scheduling.md's 10:09 catch-up runs beside the on-time 10:10).

    The answer depends only on which later occurrences exist and their due times, never on what
    another process decides about them or how far they got, so a monitor and any number of
    workers deciding about sibling executions at the same time agree without a lock: the latest
    stale occurrence is never dropped, every earlier one is, and a row's own transition is the
    conditional UPDATE that makes the decision count once.
    """
    row = (
        Execution.objects.filter(pk=execution_id, origin="schedule", attempt=1)
        .annotate(
            now=Now(),
            grace=F("task__misfire_grace"),
            policy=F("task__misfire_policy"),
            limit=F("task__catch_up_limit"),
            max_age=F("task__max_age"),
        )
        .values("task_id", "scheduled_for", "due_at", "now", "grace", "policy", "limit", "max_age")
        .first()
    )
    if row is None:
        return None
    age = row["now"] - row["scheduled_for"]
    if row["max_age"] is not None and age > row["max_age"]:
        return Misfire(
            SkipReason.EXPIRED,
            f"expired: not started {age.total_seconds():.1f}s after its fire time, "
            f"past its max_age of {row['max_age'].total_seconds():g}s",
        )
    late = row["now"] - row["due_at"]
    if late <= row["grace"]:
        return None
    grace = row["grace"].total_seconds()
    if row["policy"] == MisfirePolicy.SKIP:
        return Misfire(
            SkipReason.MISSED,
            f"missed: {late.total_seconds():.1f}s late, more than its misfire grace of {grace:g}s; misfire policy skip",
        )
    keep = 1 if row["policy"] == MisfirePolicy.RUN_ONCE else row["limit"]
    later = list(
        Execution.objects.filter(
            task_id=row["task_id"], origin="schedule", superseded=False, scheduled_for__gt=row["scheduled_for"]
        )
        .filter(due_at__lt=row["now"] - row["grace"])
        .order_by("scheduled_for")
        .values_list("scheduled_for", flat=True)[:keep]
    )
    if len(later) < keep:
        return Misfire("", f"catch-up run: {late.total_seconds():.1f}s late, misfire policy {row['policy']}")
    if row["policy"] == MisfirePolicy.RUN_ONCE:
        detail = (
            f"coalesced: {late.total_seconds():.1f}s late (misfire grace {grace:g}s); misfire policy run_once runs "
            f"only the latest missed occurrence (the later {later[-1].isoformat()} is missed too)"
        )
    else:
        detail = (
            f"coalesced: {late.total_seconds():.1f}s late (misfire grace {grace:g}s); misfire policy run_all: "
            f"beyond its bound of {keep} catch-up runs"
        )
    return Misfire(SkipReason.COALESCED, detail)


def skip_occurrence(
    *,
    execution_id: int,
    attempt: int,
    from_status: str,
    reason: str,
    detail: str,
    actor: str,
    occurrence: Mapping[str, Any] | None = None,
) -> bool:
    """SCHEDULED | PENDING → CANCELLED because a start rule drops it, recorded as a skipped
    occurrence with ``reason``; conditional on the status and attempt the caller saw. Returns
    whether it won. ``occurrence`` (its task_id and scheduled_for) saves a read if known."""
    with transaction.atomic():
        won = write(
            states.SKIP,
            Q(pk=execution_id, attempt=attempt),
            {"finished_at": Now(), "error": detail, "lease_owner": "", "lease_expires_at": None},
            actor=actor,
            detail=detail,
            source=from_status,
        )
        if won:
            if occurrence is None:
                occurrence = Execution.objects.filter(pk=execution_id).values("task_id", "scheduled_for").get()
            SkippedOccurrence.objects.bulk_create(
                [
                    SkippedOccurrence(
                        task_id=occurrence["task_id"],
                        scheduled_for=occurrence["scheduled_for"],
                        reason=reason,
                        detail=detail,
                        execution_id=execution_id,
                    )
                ],
                ignore_conflicts=True,
            )
    return bool(won)


def execution_skip_misfire(*, execution_id: int, attempt: int, from_status: str, misfire: Misfire, actor: str) -> bool:
    """SCHEDULED | PENDING → CANCELLED because its task's misfire policy drops it (see
    :func:`misfire_decision`), recorded as a skipped occurrence with the reason; conditional on
    the status and attempt the caller saw. Returns whether it won."""
    return skip_occurrence(
        execution_id=execution_id,
        attempt=attempt,
        from_status=from_status,
        reason=misfire.reason,
        detail=misfire.detail,
        actor=actor,
    )


def drop_misfires(rows: Sequence[tuple[int, int, bool]], *, from_status: str, actor: str) -> set[int]:
    """Apply the misfire policy to taken rows (id, attempt, maybe stale); return the ids dropped."""
    dropped = set()
    for execution_id, attempt, maybe_stale in rows:
        if not maybe_stale:
            continue
        misfire = misfire_decision(execution_id=execution_id)
        if (
            misfire
            and misfire.dropped
            and execution_skip_misfire(
                execution_id=execution_id, attempt=attempt, from_status=from_status, misfire=misfire, actor=actor
            )
        ):
            dropped.add(execution_id)
    return dropped
