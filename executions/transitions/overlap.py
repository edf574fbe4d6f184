"""Claims that look at a task's other runs first: the overlap policy, the concurrency cap
(``max_concurrency``) and a stale run's misfire policy, under the task's row lock. A run that may
not start yet waits (``PENDING → SCHEDULED``, one transition for ``queue_one`` and
``max_concurrency``); one a rule drops is skipped (``PENDING → CANCELLED``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Now

from executions import limits
from executions.models import Execution, SkipReason
from executions.models import ExecutionStatus as S
from executions.transitions import states
from executions.transitions.actions import CancelOutcome, execution_cancel
from executions.transitions.misfire import execution_skip_misfire, misfire_decision, skip_occurrence
from executions.transitions.sql import db_now_plus, write, write_quiet
from executions.transitions.worker import execution_claim_loaded
from tasks_app.models import OverlapPolicy, Task

#: How long a queue_one execution waits before asking again whether the previous run ended.
QUEUE_RETRY_SECONDS = 1.0
#: A run held by its task's ``max_concurrency`` is released by the end of a running sibling
#: (:func:`executions_release_waiting`); this is only the backstop, if that release was lost (its
#: worker died between the two writes), so the wait is re-checked this often, not every second.
WAIT_RECHECK_SECONDS = 30.0


@dataclass(frozen=True)
class ExclusiveClaim:
    """What :func:`execution_claim_exclusive` did."""

    #: ``claimed``, ``skipped`` (cancelled: the previous run still runs, or dropped by the misfire
    #: policy), ``queued`` (back to SCHEDULED, due again shortly), ``waiting`` (back to SCHEDULED
    #: until a run of the task ends: its max_concurrency is reached) or ``lost`` (not a PENDING row
    #: of this attempt).
    outcome: str
    #: The claimed execution with its task loaded (``claimed`` only).
    execution: Execution | None = None
    #: Running siblings cancelled by the overlap policy cancel_previous: their external runs must
    #: be stopped through their runner after the transaction committed.
    cancelled: tuple[tuple[int, CancelOutcome], ...] = ()
    detail: str = ""


def execution_claim_exclusive(
    *, execution_id: int, attempt: int, worker_id: str, lease_seconds: float
) -> ExclusiveClaim:
    """Claim a PENDING execution the fast claim refused: an exclusive one, under its task's
    overlap policy, or a stale one (more than its task's ``misfire_grace`` late), under its
    misfire policy (:func:`~executions.transitions.misfire.misfire_decision`), which may drop it
    (PENDING → CANCELLED, recorded as a skipped occurrence: ``missed`` or ``coalesced``) before
    the overlap policy is looked at.

    The task row is locked (``SELECT … FOR UPDATE``), so the exclusive claims of one task are
    serialised and each sees the previous one's outcome; then the execution's own row, so the
    policy is applied to it as it is: nothing that does not take the task lock (a user's cancel,
    a monitor's untake) can move it between the check and the writes. With no RUNNING sibling
    (or policy "allow") it is claimed as usual. Otherwise, per the task's overlap policy:

    * ``skip``: PENDING → CANCELLED, recorded as a skipped occurrence (reason ``overlap``);
    * ``queue_one``: if an older sibling is already waiting, cancelled like ``skip``; else
      PENDING → SCHEDULED, due again in :data:`QUEUE_RETRY_SECONDS` ("queued behind N");
    * ``cancel_previous``: the RUNNING siblings go RUNNING → CANCELLED ("cancelled by the next
      run"), then this one is claimed. The caller stops their external runs after the commit.

    Every status write is a conditional UPDATE with its event in the same transaction.
    """
    claimable = Execution.objects.filter(pk=execution_id, status__in=states.CLAIM.sources, attempt=attempt)
    with transaction.atomic():
        locked = _lock_task_and_row(claimable)
        if locked is None:
            return ExclusiveClaim("lost")
        task, row = locked
        settled = _apply_misfire_policy(execution_id, attempt, row, worker_id, lease_seconds)
        if settled is not None:
            return settled
        policy = task["overlap_policy"]
        siblings = Execution.objects.filter(task_id=row["task_id"]).exclude(pk=execution_id)
        running = list(siblings.filter(status=S.RUNNING).order_by("id").values_list("id", flat=True))
        cancelled: tuple[tuple[int, CancelOutcome], ...] = ()
        if running and policy != OverlapPolicy.ALLOW:
            if policy != OverlapPolicy.CANCEL_PREVIOUS:
                return _queue_or_skip(execution_id, attempt, row, worker_id, policy, siblings=siblings, running=running)
            cancelled = _cancel_previous(execution_id, worker_id, running)
        cap = task["max_concurrency"]
        if cap is not None and policy == OverlapPolicy.ALLOW:
            held = _wait_for_slot(execution_id, attempt, row, worker_id, cap=cap, running=len(running))
            if held is not None:
                return held
        granted: limits.LimitGrant | ExclusiveClaim | None = None
        if task["has_limits"]:  # named limits, last: the cheaper checks above may already say no
            granted = _take_limits(execution_id, attempt, row, task, worker_id, lease_seconds)
            if isinstance(granted, ExclusiveClaim):
                return granted
        claimed = execution_claim_loaded(
            execution_id=execution_id,
            attempt=attempt,
            worker_id=worker_id,
            lease_seconds=lease_seconds,
            exclusive=True,
            checked=True,
        )
        if claimed is not None and isinstance(granted, limits.LimitGrant):
            limits.limits_record_start(execution_id=execution_id, buckets=granted.rate_buckets)
    if claimed is None:  # pragma: no cover - the row is locked PENDING
        return ExclusiveClaim("lost")
    return ExclusiveClaim("claimed", claimed, cancelled)


def _lock_task_and_row(claimable: QuerySet[Execution]) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """Lock the task's row, then the claimable execution's (in the caller's transaction): None if it moved on."""
    # Unlocked first: a duplicate or stale delivery loses without waiting for the task lock.
    task_id = claimable.values_list("task_id", flat=True).first()
    if task_id is None:
        return None
    task = (
        Task.objects.select_for_update()
        .filter(pk=task_id)
        .values("overlap_policy", "max_concurrency", "has_limits", "runner", "config")
        .first()
    )
    if task is None:  # pragma: no cover - executions go with their task
        return None
    # Task, then execution: the order task_update, task_pause and task_delete lock them in.
    row = (
        claimable.select_for_update()
        .values("task_id", "scheduled_for", "exclusive", "waiting_on", "config_override")
        .first()
    )
    if row is None:  # moved on (cancelled, untaken, claimed) since the first read
        return None
    return task, row


def _apply_misfire_policy(
    execution_id: int, attempt: int, row: Mapping[str, Any], worker_id: str, lease_seconds: float
) -> ExclusiveClaim | None:
    """Drop a stale run, or claim a late one that is not exclusive: None leaves it to the overlap policy."""
    # The misfire policy, decided where the run is claimed (the rows stayed PENDING while no
    # worker ran: it may be stale now, or a later occurrence may be).
    misfire = misfire_decision(execution_id=execution_id)
    if misfire is not None and misfire.dropped:
        if execution_skip_misfire(
            execution_id=execution_id, attempt=attempt, from_status=S.PENDING, misfire=misfire, actor=worker_id
        ):
            return ExclusiveClaim("skipped", detail=misfire.detail)
        return ExclusiveClaim("lost")  # pragma: no cover - the row is locked PENDING
    if row["exclusive"]:
        return None
    if misfire is None:  # on time and not exclusive: the fast claim is the way
        return ExclusiveClaim("lost")
    late = execution_claim_loaded(
        execution_id=execution_id,
        attempt=attempt,
        worker_id=worker_id,
        lease_seconds=lease_seconds,
        checked=True,
    )
    return ExclusiveClaim("lost") if late is None else ExclusiveClaim("claimed", late)


def _cancel_previous(
    execution_id: int, worker_id: str, running: Sequence[int]
) -> tuple[tuple[int, CancelOutcome], ...]:
    """Cancel the RUNNING siblings (overlap policy cancel_previous): those whose cancel won, with its outcome."""
    cancelled: list[tuple[int, CancelOutcome]] = []
    for previous in running:
        outcome = execution_cancel(
            execution_id=previous, actor=worker_id, reason=f"cancelled by the next run ({execution_id})"
        )
        if outcome.won:
            cancelled.append((previous, outcome))
    return tuple(cancelled)


def _queue_or_skip(
    execution_id: int,
    attempt: int,
    row: Mapping[str, Any],
    worker_id: str,
    policy: str,
    *,
    siblings: QuerySet[Execution],
    running: Sequence[int],
) -> ExclusiveClaim:
    """Apply the overlap policy skip or queue_one to a run whose sibling is RUNNING: queued or skipped."""
    names = ", ".join(str(i) for i in running)
    waiting = (
        siblings.filter(status__in=(S.SCHEDULED, S.PENDING), exclusive=True)
        .filter(Q(scheduled_for__lt=row["scheduled_for"]) | Q(scheduled_for=row["scheduled_for"], pk__lt=execution_id))
        .order_by("scheduled_for")
        .values_list("id", flat=True)
        .first()
    )
    if policy == OverlapPolicy.QUEUE_ONE and waiting is None:
        detail = f"overlap: queued behind running execution {names}"
        return _wait(execution_id, attempt, worker_id, "queued", due_in=QUEUE_RETRY_SECONDS, detail=detail)
    if policy == OverlapPolicy.QUEUE_ONE:
        detail = f"overlap: execution {waiting} is already waiting behind running execution {names}"
    else:
        detail = f"overlap: previous run {names} still running"
    return _skip_for_overlap(execution_id, attempt, row, worker_id, detail)


def _wait(
    execution_id: int,
    attempt: int,
    worker_id: str,
    outcome: str,
    *,
    due_in: float,
    detail: str,
    waiting: str | None = None,
    summary: str = "",
) -> ExclusiveClaim:
    """PENDING → SCHEDULED: the run may not start yet and asks again in ``due_in`` seconds (or
    when a slot frees: ``waiting`` says for what, see :func:`executions_release_waiting`)."""
    values: dict[str, object] = {"due_at": db_now_plus(due_in), "message_id": "", "enqueued_at": None}
    if waiting is not None:
        values["waiting"] = waiting
    won = write(states.WAIT, Q(pk=execution_id, attempt=attempt), values, actor=worker_id, detail=detail)
    return ExclusiveClaim(outcome if won else "lost", detail=summary or detail)


def _wait_for_slot(
    execution_id: int, attempt: int, row: Mapping, worker_id: str, *, cap: int, running: int
) -> ExclusiveClaim | None:
    """Apply the task's concurrency cap to a PENDING execution (the task row is locked by the
    caller): None if it may start now, else it goes back to SCHEDULED to wait, with its reason.

    It may start if fewer than ``cap`` siblings are RUNNING and fewer earlier runs than free
    slots are waiting or published (runs start in due order: a later one does not overtake)."""
    free = cap - running
    if free > 0:
        # Ahead of it: earlier runs that wait for a slot, or that are published and not claimed
        # yet (a run that never had to wait must not be overtaken by a later one either).
        earlier = (
            Execution.objects.filter(task_id=row["task_id"])
            .filter(Q(status=S.SCHEDULED) & ~Q(waiting="") | Q(status=S.PENDING))
            .filter(
                Q(scheduled_for__lt=row["scheduled_for"]) | Q(scheduled_for=row["scheduled_for"], pk__lt=execution_id)
            )
            .values_list("id", flat=True)[:free]
        )
        if len(earlier) < free:
            return None
    reason = f"max_concurrency {cap}"
    return _wait(
        execution_id,
        attempt,
        worker_id,
        "waiting",
        due_in=WAIT_RECHECK_SECONDS,
        waiting=reason,
        detail=f"waiting: {reason} ({running} running)",
        summary=f"waiting: {reason}",
    )


def _take_limits(
    execution_id: int, attempt: int, row: Mapping, task: Mapping, worker_id: str, lease_seconds: float
) -> limits.LimitGrant | ExclusiveClaim:
    """Apply the task's named limits (:func:`executions.limits.limits_take`, under the bucket
    locks, in this transaction): the grant, or the run goes back to wait
    (:func:`execution_wait_for_limit`)."""
    decision = limits.limits_take(
        execution_id=execution_id,
        task_id=row["task_id"],
        runner=task["runner"],
        # A run with a config of its own (a replay's) is counted where that config sends it.
        config=task["config"] if row["config_override"] is None else row["config_override"],
        waiting_on=row["waiting_on"],
        lease_seconds=lease_seconds,
    )
    if isinstance(decision, limits.LimitGrant):
        return decision
    won = execution_wait_for_limit(
        execution_id=execution_id,
        attempt=attempt,
        worker_id=worker_id,
        reason=decision.reason,
        retry_at=decision.retry_at,
        bucket_id=decision.bucket_id,
    )
    return ExclusiveClaim("waiting" if won else "lost", detail=f"waiting: {decision.reason}")


def execution_wait_for_limit(
    *, execution_id: int, attempt: int, worker_id: str, reason: str, retry_at: datetime, bucket_id: int
) -> bool:
    """PENDING → SCHEDULED because a named limit holds the run back: ``waiting`` says why
    (``limit api.example.com 10/s``), ``waiting_on`` which bucket it waits for, and it is due
    again at ``retry_at`` (when the limit may have room). Conditional on status and attempt."""
    values: dict[str, object] = {
        "due_at": retry_at,
        "message_id": "",
        "enqueued_at": None,
        "waiting": reason[:200],
        "waiting_on": bucket_id,
    }
    return bool(
        write(states.WAIT, Q(pk=execution_id, attempt=attempt), values, actor=worker_id, detail=f"waiting: {reason}")
    )


def executions_release_waiting(*, task_id: uuid.UUID | str) -> int:
    """Make the earliest executions of a task that wait for a slot due now, as many as its
    ``max_concurrency`` leaves free; called after a run of the task ended. Returns how many.

    Due time only (no status change): the claim decides again under the task lock, so a release
    that races another one, or a run that starts meanwhile, can only make a waiter ask again.
    """
    cap = Task.objects.filter(pk=task_id).values_list("max_concurrency", flat=True).first()
    if cap is None:
        return 0
    running = Execution.objects.filter(task_id=task_id, status=S.RUNNING).count()
    free = cap - running
    if free <= 0:
        return 0
    waiters = list(
        Execution.objects.filter(task_id=task_id, status=S.SCHEDULED)
        .exclude(waiting="")
        .order_by("scheduled_for", "id")
        .values_list("id", flat=True)[:free]
    )
    if not waiters:
        return 0
    return write_quiet(states.RELEASE_WAITING, Q(id__in=waiters) & ~Q(waiting=""), {"due_at": Now()})


def executions_release_limit_waiters(*, free: Mapping[int, int]) -> int:
    """Make the earliest runs waiting on each named-limit bucket due now, as many as ``free``
    gives for that bucket (:func:`executions.limits.limits_release`); called after a run ended.
    Due time only (no status change): the claim decides again under the bucket lock."""
    released = 0
    for bucket_id, count in free.items():
        waiters = list(
            Execution.objects.filter(status=S.SCHEDULED, waiting_on=bucket_id)
            .order_by("scheduled_for", "id")
            .values_list("id", flat=True)[:count]
        )
        if waiters:
            released += write_quiet(states.RELEASE_WAITING, Q(id__in=waiters, waiting_on=bucket_id), {"due_at": Now()})
    return released


def _skip_for_overlap(execution_id: int, attempt: int, row: Mapping, worker_id: str, detail: str) -> ExclusiveClaim:
    won = skip_occurrence(
        execution_id=execution_id,
        attempt=attempt,
        from_status=S.PENDING,
        reason=SkipReason.OVERLAP,
        detail=detail,
        actor=worker_id,
        occurrence=row,
    )
    if not won:  # pragma: no cover - the row is locked PENDING
        return ExclusiveClaim("lost")
    return ExclusiveClaim("skipped", detail=detail)
