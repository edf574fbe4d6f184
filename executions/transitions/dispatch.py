"""The monitor's writes: take due executions for publishing (``SCHEDULED → PENDING``), publish
unclaimed ones again (``PENDING → PENDING``), undo takes it could not publish (``PENDING →
SCHEDULED``), and take RUNNING executions that need a poll or a new worker."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import groupby
from typing import Any

from django.db import connection, transaction
from django.db.models import BooleanField, CharField, DateTimeField, DurationField, ExpressionWrapper, F, Min, Q, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast, Concat, Now

from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.transitions import states
from executions.transitions.misfire import drop_misfires, on_time
from executions.transitions.sql import EXECUTIONS, db_now_plus, pg_array, write, write_quiet
from tms_core import tracing


@dataclass(frozen=True)
class Dispatch:
    """An execution taken by a monitor, to be published as a message."""

    execution_id: int
    attempt: int
    priority: int
    message_id: str
    #: "run" (SCHEDULED → PENDING), "republish" (PENDING again) or "poll" (RUNNING).
    kind: str = "run"
    #: When the run is due (runs only): one taken ahead of it goes out with this as its ETA.
    due_at: datetime | None = None
    #: With tracing on, the run's (traceparent, tracestate, workflow_run), read by the monitor's
    #: take for its spans (executions/traces.py); None: not read.
    trace: tuple[str, str, int | None] | None = field(default=None, compare=False, repr=False)


#: What the take reads for the monitor's spans with tracing on (:attr:`Dispatch.trace`).
_TRACE_COLUMNS = ("traceparent", "tracestate", "workflow_run")


@transaction.atomic
def _take(base: Q, edge: states.Edge, *, limit: int, actor: str, detail: str) -> list[Dispatch]:
    (from_status,) = edge.sources
    locked_rows = list(
        Execution.objects.filter(base, status=from_status)
        .order_by("due_at" if from_status == S.SCHEDULED else "enqueued_at")
        .select_for_update(skip_locked=True, of=("self",))
        .annotate(maybe_stale=ExpressionWrapper(~on_time(), output_field=BooleanField()))
        .values_list("id", "attempt", "priority", "maybe_stale", "due_at", *_TRACE_COLUMNS if tracing.ON else ())[
            :limit
        ]
    )
    if not locked_rows:
        return []
    # The misfire policy, decided where the run is dispatched: stale rows it drops are cancelled
    # and recorded instead of being published. Only rows past their task's misfire grace (or
    # max_age) are looked at one by one: a herd's later batches are seconds late, yet on time,
    # and the annotation above (the task's columns read only for rows over a second late)
    # answers for them in the same statement instead of a query and a commit per row.
    dropped = drop_misfires([(i, a, stale) for i, a, _, stale, *_ in locked_rows], from_status=from_status, actor=actor)
    priorities = {row[0]: row[2] for row in locked_rows if row[0] not in dropped}
    due = {row[0]: row[4] for row in locked_rows}
    trace: dict[int, tuple[str, str, int | None]] = (
        {row[0]: (row[5], row[6], row[7]) for row in locked_rows} if tracing.ON else {}
    )
    if not priorities:
        return []
    token = uuid.uuid4().hex[:12]
    won = write(
        edge,
        Q(id__in=list(priorities)),
        {"enqueued_at": Now(), "message_id": Concat(Cast("id", output_field=CharField()), Value(f"-{token}"))},
        actor=actor,
        detail=detail,
    )
    kind = "run" if from_status == S.SCHEDULED else "republish"
    order = {i: n for n, i in enumerate(priorities)}
    taken = sorted(won, key=lambda row: order[row[0]])  # in the order they were locked (due first)
    if kind != "run":
        return [Dispatch(i, a, priorities[i], f"{i}-{token}", kind, trace=trace.get(i)) for i, a in taken]
    return [Dispatch(i, a, priorities[i], f"{i}-{token}", kind, due[i], trace.get(i)) for i, a in taken]


def executions_take_due(
    *, limit: int, actor: str, among: Collection[int] | None = None, ahead: float = 0.0
) -> list[Dispatch]:
    """Move up to ``limit`` due SCHEDULED executions to PENDING (``FOR UPDATE SKIP LOCKED``) and
    commit, before the caller publishes them: a worker always finds the row PENDING when the
    message reaches it. What cannot be published goes back through :func:`executions_untake`;
    if the monitor dies first, the rows are published again once PENDING for too long.

    ``among``: only these ids (the fair share's pick, :mod:`executions.fairness`); each is still
    taken only if it is SCHEDULED, due and not locked by another monitor. ``ahead``: rows due
    within that many seconds count as due (the monitor's lookahead; each Dispatch carries its
    due time, the message's ETA).
    """
    base = Q(due_at__lte=db_now_plus(ahead) if ahead else Now())
    if among is not None:
        base &= Q(id__in=list(among))
    return _take(base, states.TAKE, limit=limit, actor=actor, detail="")


def executions_take_steps(ids: Collection[int], *, teams: Collection[int], actor: str) -> list[Dispatch]:
    """In the caller's transaction (the one that ends their upstreams and creates them): move the
    workflow steps ``ids`` (runs of the tasks of ``teams``) to PENDING for the ending worker to
    publish when it commits. See :func:`executions.transitions.follow.publishing_steps`.

    Not when another team's run is due and waiting: fair share between teams is the monitor's
    (:mod:`executions.fairness`), and the steps then wait their turn with the rest. A step may go
    ahead of its own team's waiting runs (a workflow run under way is finished first), of
    fewer than :data:`STEPS_AHEAD_OF_AT_MOST` (so that the check is one bounded read of the due
    index, and exact: another team's run due later than that many of the steps' teams' is
    behind a backlog the steps leave to the monitor too). Nor when :data:`STEPS_QUEUED_AT_MOST`
    runs or more are published and not started: that bounds how long a run of another team that
    comes due meanwhile waits behind the steps already sent, as the monitor's pacer bounds it.
    The check and the take are one statement (the rows are this transaction's own: no other
    monitor or worker can see them, nothing to skip or lock).

    Returns the steps taken; nothing if the monitor is to take them.
    """
    chosen = list(ids)
    if not chosen:
        return []
    token = uuid.uuid4().hex[:12]
    may_go = RawSQL(  # noqa: S611 - our statement; every value is a parameter
        _STEPS_MAY_GO,
        [
            S.SCHEDULED,
            pg_array(chosen),
            STEPS_AHEAD_OF_AT_MOST,
            STEPS_AHEAD_OF_AT_MOST,
            pg_array(sorted(teams)),
            S.PENDING,
            STEPS_QUEUED_AT_MOST,
            STEPS_QUEUED_AT_MOST,
        ],
        output_field=BooleanField(),
    )
    won = write(
        states.TAKE,
        Q(id__in=chosen) & Q(may_go),
        {"enqueued_at": Now(), "message_id": Concat(Cast("id", output_field=CharField()), Value(f"-{token}"))},
        actor=actor,
        detail=STEP_DETAIL,
        returning="id, attempt, priority, due_at",
        # Counted for the monitors' pacers (executions.fairness.steps_published), in the statement.
        select=f"SELECT id, attempt, priority, due_at, nextval('{STEPS_PUBLISHED}') FROM done",  # noqa: S608
    )
    order = {execution_id: index for index, execution_id in enumerate(chosen)}
    return [
        Dispatch(i, a, p, f"{i}-{token}", "run", due) for i, a, p, due, _ in sorted(won, key=lambda row: order[row[0]])
    ]


#: Whether workflow steps may go out at once (:func:`executions_take_steps`), as the take's
#: condition (PostgreSQL runs these uncorrelated subqueries once for the statement): fewer due
#: runs waiting than the bound and none of another team among them, fewer queued than the bound.
_STEPS_MAY_GO = (
    f"(NOT EXISTS (SELECT 1 FROM (SELECT team_id FROM {EXECUTIONS} WHERE status = %s"  # noqa: S608 - our table
    " AND due_at <= statement_timestamp() AND NOT (id = ANY(%s::bigint[])) ORDER BY due_at LIMIT %s) AS ahead"
    " HAVING count(*) >= %s OR bool_or(NOT (team_id = ANY(%s::integer[]))))"
    f" AND (SELECT count(*) FROM (SELECT 1 FROM {EXECUTIONS} WHERE status = %s LIMIT %s) AS queued) < %s)"
)


#: Of how many due runs of their own teams a worker's workflow steps may go ahead.
STEPS_AHEAD_OF_AT_MOST = 4096
#: With this many runs published and not started, workflow steps wait for the monitor.
STEPS_QUEUED_AT_MOST = 1024
#: The sequence counting the steps workers published (migration executions 0027).
STEPS_PUBLISHED = "executions_steps_published"
#: The detail of a step's take by the worker that ended its upstream.
STEP_DETAIL = "published by the worker that ended its upstream"


def executions_take_stale_pending(*, limit: int, older_than: float, actor: str) -> list[Dispatch]:
    """Re-take PENDING executions nobody claimed for ``older_than`` seconds (message lost)."""
    cutoff = ExpressionWrapper(Now() - Value(timedelta(seconds=older_than)), output_field=DateTimeField())
    return _take(
        Q(enqueued_at__lt=cutoff),
        states.REPUBLISH,
        limit=limit,
        actor=actor,
        detail=f"unclaimed for {older_than:g}s: published again",
    )


def next_due_in() -> float | None:
    """Seconds until the earliest SCHEDULED execution is due (0 if overdue), or None if none.
    One query on the due index, against the database clock."""
    wait = Execution.objects.filter(status=S.SCHEDULED).aggregate(
        wait=ExpressionWrapper(Min("due_at") - Now(), output_field=DurationField())
    )["wait"]
    return None if wait is None else max(0.0, wait.total_seconds())


@dataclass(frozen=True)
class Outlook:
    """What a monitor pass would find to do, read by :func:`dispatch_outlook`."""

    #: Seconds until the earliest SCHEDULED execution is due (0: due now), None if there is none.
    runs_in: float | None
    #: Some execution is PENDING: published and not yet started, or its message lost.
    pending: bool
    #: Some RUNNING execution is due for a poll or has an expired lease (a poll message to send).
    polls: bool

    @property
    def idle(self) -> bool:
        """Nothing to publish now and nothing in flight to watch: a pass would only look."""
        return self.runs_in != 0.0 and not self.pending and not self.polls


#: Seconds until an execution is due, on the database clock.
_DUE_IN = ExpressionWrapper(F("due_at") - Now(), output_field=DurationField())
#: A RUNNING execution that :func:`executions_take_polls` takes.
_POLL_DUE = Q(lease_owner="", next_poll_at__lte=Now()) | Q(lease_expires_at__lt=Now())


_OUTLOOK: list[tuple[str, list[Any]]] = []


def _outlook_statement() -> tuple[str, list[Any]]:
    """The outlook's statement, compiled once per process: it has no parameter that changes (the
    time is the database's), and compiling its three querysets cost an idle monitor more CPU than
    running it."""
    if not _OUTLOOK:
        parts = [
            Execution.objects.filter(status=S.SCHEDULED).order_by("due_at").values_list(_DUE_IN)[:1],
            Execution.objects.filter(status=S.PENDING).values("id")[:1],
            Execution.objects.filter(_POLL_DUE, status=S.RUNNING).values("id")[:1],
        ]
        compiled = [part.query.sql_with_params() for part in parts]
        statement = "SELECT ({}), EXISTS ({}), EXISTS ({})".format(*(sql for sql, _ in compiled))
        _OUTLOOK.append((statement, [param for _, params in compiled for param in params]))
    return _OUTLOOK[0]


def dispatch_outlook() -> Outlook:
    """One read-only statement (no lock, no transaction of its own) telling an idle monitor
    whether a pass has anything to do: each part is a probe of one partial index (the due,
    PENDING and poll indexes), so it costs the same however many executions wait. An idle
    monitor makes this its whole pass, instead of a transaction of three statements, two more
    for its housekeeping and two broker channels, every second."""
    statement, params = _outlook_statement()
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        wait, pending, polls = cursor.fetchone()
    if wait is not None:  # an interval: a timedelta
        wait = max(0.0, wait.total_seconds())
    return Outlook(runs_in=wait, pending=bool(pending), polls=bool(polls))


def executions_untake(*, dispatches: Sequence[Dispatch], actor: str, reason: str) -> int:
    """Undo takes whose messages could not be published: PENDING → SCHEDULED (still due), and
    polls due again at once. Rows a worker already moved on (it got the message after all) are
    left alone. Returns how many executions went back to SCHEDULED.
    """
    runs = [d.message_id for d in dispatches if d.kind == "run"]
    polls = [d.execution_id for d in dispatches if d.kind == "poll"]
    with transaction.atomic():
        back = (
            write(
                states.UNTAKE,
                Q(message_id__in=runs),
                {"message_id": "", "enqueued_at": None},
                actor=actor,
                detail=reason,
            )
            if runs
            else []
        )
        if polls:
            write_quiet(states.LEASE, Q(id__in=polls, lease_owner=""), {"next_poll_at": Now()})
    return len(back)


#: Polls and resumptions of work already running go ahead of starting new work.
POLL_PRIORITY = 9


@transaction.atomic
def executions_take_polls(*, limit: int, in_flight_for: float, actor: str) -> list[Dispatch]:
    """Take RUNNING executions that need a worker's attention, for a short poll message:
    an asynchronous run whose ``next_poll_at`` came, or a run whose lease expired (its worker
    died), which is handed back so another worker resumes the same attempt.

    ``next_poll_at`` moves ``in_flight_for`` seconds ahead, so a lost poll message is sent again.
    """
    taken = list(
        Execution.objects.filter(_POLL_DUE, status=S.RUNNING)
        .order_by("next_poll_at")
        .select_for_update(skip_locked=True, of=("self",))
        .values_list("id", "attempt", "priority", "lease_owner")[:limit]
    )
    if not taken:
        return []
    token = uuid.uuid4().hex[:12]
    polls = [i for i, _, _, owner in taken if not owner]
    in_flight = db_now_plus(in_flight_for)
    if polls:
        write_quiet(states.LEASE, Q(id__in=polls), {"next_poll_at": in_flight})
    expired = sorted((owner, i) for i, _, _, owner in taken if owner)
    for owner, group in groupby(expired, key=lambda pair: pair[0]):
        write(
            states.HANDBACK,
            Q(id__in=[i for _, i in group], lease_owner=owner),
            {
                "lease_owner": "",
                "lease_expires_at": None,
                "next_poll_at": in_flight,
                "handbacks": F("handbacks") + 1,
                "orphaned": True,
            },
            actor=actor,
            detail=f"lease of {owner} expired: handed back",
        )
    return [Dispatch(i, a, POLL_PRIORITY, f"{i}-poll-{token}", "poll") for i, a, _, _ in taken]


def executions_expire_leases(*, owners: Sequence[str]) -> int:
    """End the leases held by ``owners`` (processes known to be dead) now, so the monitor hands
    their executions to another worker without waiting for the leases to run out."""
    if not owners:
        return 0
    return write_quiet(states.LEASE, Q(lease_owner__in=list(owners)), {"lease_expires_at": Now()})
