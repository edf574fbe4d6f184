"""A worker's writes (and a job's, through its callback URL): claim (``PENDING → RUNNING``), the
lease, the external run, and the end of an attempt (``RUNNING → SUCCEEDED | FAILED |
SCHEDULED``). Every write after the claim is fenced by the attempt and the lease (:func:`fenced`):
a worker that lost the execution changes nothing."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from executions.models import Execution
from executions.transitions import states
from executions.transitions.follow import ENDED_RETURNING, UNFOLLOWED_SQL, ended_rows, follow_ended, unfollowed
from executions.transitions.misfire import on_time
from executions.transitions.sql import (
    EXECUTIONS,
    Event,
    bounded,
    db_now_after,
    db_now_plus,
    from_row,
    pg_array,
    with_events,
    write,
    write_prepared,
    write_quiet,
)
from tasks_app.models import Task

#: The actor recorded for outcomes a job reported itself.
CALLBACK_ACTOR = "callback"


def fenced(execution_id: int, attempt: int, worker_id: str | None) -> Q:
    """The row a worker may write (besides its RUNNING status, from the edge): this attempt, and
    its lease. ``worker_id=None`` is a job reporting through its callback URL: fenced by the
    attempt only, whoever polls it."""
    condition = Q(pk=execution_id, attempt=attempt)
    return condition if worker_id is None else condition & Q(lease_owner=worker_id)


_EXECUTION_FIELDS = Execution._meta.concrete_fields
_TASK_FIELDS = Task._meta.concrete_fields
#: The claimed row and its task, from the claim's own statement.
_CLAIMED = "SELECT {} FROM done JOIN {} t ON t.id = done.task_id".format(  # noqa: S608 - our names
    ", ".join([f'done."{f.column}"' for f in _EXECUTION_FIELDS] + [f't."{f.column}"' for f in _TASK_FIELDS]),
    Task._meta.db_table,
)
#: The same, and whether a task follows the run's task (an index probe a row): read as
#: ``Execution.followed`` by :func:`executions_succeed`, which then writes the end with what follows
#: it at once, instead of first as a run that nothing follows (a statement that would lose).
_CLAIMED_SEVERAL = _CLAIMED.replace(
    " FROM done ",
    ", NOT ({}) FROM done ".format(
        UNFOLLOWED_SQL.replace("e.task_id", "done.task_id").replace("e.map_index", "done.map_index")
    ),
)


def claim_write(
    execution_id: int, attempt: int, worker_id: str, lease: timedelta, *, exclusive: bool, checked: bool
) -> tuple[Q, dict[str, Any]]:
    """The claim's condition and values (for :func:`~executions.transitions.sql.write_prepared`)."""
    condition = Q(pk=execution_id, attempt=attempt, exclusive=exclusive)
    if not checked:
        condition &= on_time()
    return condition, _claim_values(worker_id, lease, checked=checked)


def _claim_values(worker_id: str, lease: timedelta, *, checked: bool) -> dict[str, Any]:
    values: dict[str, Any] = {
        "lease_owner": worker_id,
        "lease_expires_at": db_now_after(lease),
        "started_at": Now(),
    }
    if checked:  # a checked claim may start an execution that waited for a slot or a limit
        values["waiting"] = ""
        values["waiting_on"] = None
    return values


def execution_claim_loaded(
    *,
    execution_id: int,
    attempt: int,
    worker_id: str,
    lease_seconds: float,
    exclusive: bool = False,
    checked: bool = False,
) -> Execution | None:
    """PENDING → RUNNING for ``attempt``, leased to ``worker_id``; returns the claimed execution
    with its task loaded, or None if another claim won, or if the execution is exclusive or stale
    (see :func:`~executions.transitions.overlap.execution_claim_exclusive`). On PostgreSQL the
    claim, its event and the load are one statement.

    ``exclusive=True`` claims an exclusive execution and ``checked=True`` a stale one: only
    ``execution_claim_exclusive`` passes them, holding the task's lock after applying the
    misfire and overlap policies."""
    build = partial(claim_write, exclusive=exclusive, checked=checked)
    binds = {
        "execution_id": execution_id,
        "attempt": attempt,
        "worker_id": worker_id,
        "lease": timedelta(seconds=lease_seconds),
    }
    rows = write_prepared(
        states.CLAIM, (exclusive, checked), build, binds, actor=worker_id, returning="*", select=_CLAIMED
    )
    if not rows:
        return None
    (row,) = rows
    return _loaded(row)


#: The event a taken-back claim writes (RUNNING → RUNNING): the timeline says why the lease was renewed.
TAKE_BACK_DETAIL = "claim taken back: its answer was lost with the connection"


def take_back_write(execution_id: int, attempt: int, worker_id: str, lease: timedelta) -> tuple[Q, dict[str, Any]]:
    """The take-back's condition and values: this attempt, leased to this very claimant by its
    claim, and nothing recorded since (no external run, not handed back)."""
    condition = Q(pk=execution_id, attempt=attempt, lease_owner=worker_id, external_run_id="", orphaned=False)
    return condition, {"lease_expires_at": db_now_after(lease)}


def execution_take_back(*, execution_id: int, attempt: int, worker_id: str, lease_seconds: float) -> Execution | None:
    """Take back a claim whose answer was lost: RUNNING, leased to ``worker_id`` for ``attempt``
    with no external run recorded, its lease renewed; returns the execution with its task loaded
    (as :func:`execution_claim_loaded` does), or None if the row is not that (the claim never
    committed, or the lease ran out and the run was handed back: then the fenced claim or the
    resume path is the way).

    Only the claimant that sent the claim and never got its answer calls it (the connection
    dropped after the commit: a PostgreSQL failover), and only while it does not work on the
    execution: the lease owner names one process, so nobody else can be running it. Without it
    the claimant's retry lost its own claim and the run stayed RUNNING, launched by nobody, until
    its lease ran out (``WORKER_TIMEOUT``) and another worker resumed it."""
    binds = {
        "execution_id": execution_id,
        "attempt": attempt,
        "worker_id": worker_id,
        "lease": timedelta(seconds=lease_seconds),
    }
    detail = TAKE_BACK_DETAIL
    rows = write_prepared(
        states.TAKE_BACK, (), take_back_write, binds, actor=worker_id, detail=detail, returning="*", select=_CLAIMED
    )
    if not rows:
        return None
    (row,) = rows
    return _loaded(row)


def _loaded(row: Sequence[Any]) -> Execution:
    execution = from_row(Execution, _EXECUTION_FIELDS, row[: len(_EXECUTION_FIELDS)])
    task_end = len(_EXECUTION_FIELDS) + len(_TASK_FIELDS)
    execution.task = from_row(Task, _TASK_FIELDS, row[len(_EXECUTION_FIELDS) : task_end])
    if len(row) > task_end:  # _CLAIMED_SEVERAL: whether a task follows it (a hint: see Success)
        execution.followed = bool(row[task_end])
    return execution


def executions_claim_loaded(
    *, items: Sequence[tuple[int, int]], worker_id: str, lease_seconds: float
) -> dict[int, Execution]:
    """The fast claim of :func:`execution_claim_loaded` for several (execution id, attempt)
    pairs at once: one statement, with its events, per attempt number among them (a herd's runs
    are all first attempts). Returns what it claimed, by id, with the tasks loaded; the rest
    (taken, cancelled, gone, exclusive or stale) is left as it was, for the one-by-one path."""
    by_attempt: defaultdict[int, list[int]] = defaultdict(list)
    for execution_id, attempt in items:
        by_attempt[attempt].append(execution_id)
    lease = timedelta(seconds=lease_seconds)
    claimed: dict[int, Execution] = {}
    for attempt, ids in by_attempt.items():
        binds: dict[str, Any] = {"attempt": attempt, "worker_id": worker_id, "lease": lease}
        binds |= {f"id{index}": execution_id for index, execution_id in enumerate(ids)}
        # Compiled once per process and count of ids (a message holds at most TMS_DISPATCH_BATCH).
        shape = ("several", len(ids))
        rows = write_prepared(
            states.CLAIM, shape, claim_several_write, binds, actor=worker_id, returning="*", select=_CLAIMED_SEVERAL
        )
        for row in rows:
            execution = _loaded(row)
            claimed[execution.pk] = execution
    return claimed


def claim_several_write(attempt: int, worker_id: str, lease: timedelta, **ids: int) -> tuple[Q, dict[str, Any]]:
    """The condition and values of :func:`executions_claim_loaded`'s fast claim of ``ids``."""
    condition = Q(pk__in=list(ids.values()), attempt=attempt, exclusive=False) & on_time()
    return condition, _claim_values(worker_id, lease, checked=False)


def execution_record_run(
    *,
    execution_id: int,
    attempt: int,
    worker_id: str,
    external_run_id: str,
    run_handle: Mapping[str, object],
    poll_in: float | None,
) -> bool:
    """Store the external run id (before anything waits on it); fenced by lease and attempt.

    With ``poll_in`` the worker also releases its lease: the run is asynchronous and the monitor
    dispatches a short poll message when ``next_poll_at`` comes.
    """
    values: dict[str, object] = {"external_run_id": external_run_id[:255], "run_handle": dict(run_handle)}
    if poll_in is not None:
        values |= {"next_poll_at": db_now_plus(poll_in), "lease_owner": "", "lease_expires_at": None}
    return bool(write_quiet(states.LEASE, fenced(execution_id, attempt, worker_id), values))


#: What ending an attempt clears.
_ENDED: Mapping[str, object] = {"lease_owner": "", "lease_expires_at": None, "next_poll_at": None}


def succeed_write(execution_id: int, attempt: int, output: str, **bound: str) -> tuple[Q, dict[str, Any]]:
    """The success's condition and values; ``bound`` may hold ``worker_id`` (else a callback's
    report, fenced by the attempt only) and ``external_run_id``."""
    extra = {"external_run_id": bound["external_run_id"]} if "external_run_id" in bound else {}
    values = extra | {"finished_at": Now(), "output": output, **_ENDED}
    return fenced(execution_id, attempt, bound.get("worker_id")), values


def succeed_alone_write(execution_id: int, attempt: int, output: str, **bound: str) -> tuple[Q, dict[str, Any]]:
    """:func:`succeed_write` on the condition that no task follows the run's task."""
    condition, values = succeed_write(execution_id, attempt, output, **bound)
    return condition & unfollowed(), values


def execution_succeed(
    *,
    execution_id: int,
    attempt: int,
    worker_id: str | None,
    output: str,
    max_chars: int,
    external_run_id: str | None = None,
    actor: str | None = None,
) -> bool:
    """RUNNING → SUCCEEDED; fenced by lease and attempt. The runs that follow it (its task's
    followers, :mod:`.follow`) are created in the same transaction. ``actor`` names who ended a
    run without a worker (a person's decision on an approval step; default: the callback)."""
    binds: dict[str, Any] = {"execution_id": execution_id, "attempt": attempt, "output": bounded(output, max_chars)}
    if worker_id is not None:
        binds["worker_id"] = worker_id
    if external_run_id:
        binds["external_run_id"] = external_run_id[:255]
    shape = (worker_id is None, bool(external_run_id))
    actor = worker_id or actor or CALLBACK_ACTOR
    # Most runs start nothing: their end is one statement. One that lost the first write is
    # either followed or lost for good (then the second write loses too).
    if write_prepared(states.SUCCEED, (*shape, "alone"), succeed_alone_write, binds, actor=actor):
        return True
    return _succeed_followed(binds, shape, actor)


def _succeed_followed(binds: Mapping[str, Any], shape: tuple, actor: str) -> bool:
    """RUNNING → SUCCEEDED and the runs that follow, in one transaction."""
    with transaction.atomic():
        rows = write_prepared(states.SUCCEED, shape, succeed_write, binds, actor=actor, returning=ENDED_RETURNING)
        if rows:
            follow_ended(ended_rows(rows))
    return bool(rows)


@dataclass(frozen=True)
class Success:
    """One run's success, for :func:`executions_succeed`."""

    execution_id: int
    attempt: int
    output: str
    external_run_id: str = ""
    #: A task followed the run's task when it was claimed (``Execution.followed``): its end is
    #: written with what follows it at once. Only a hint: each write checks in SQL, and a run
    #: whose first write loses for it goes the other way.
    followed: bool = False


#: RUNNING → SUCCEEDED for the rows of the arrays, each fenced by its attempt and the lease; the
#: same values as :func:`succeed_write` (the output and, if given, the run id per row).
_SUCCEED_ANY = (
    f"UPDATE {EXECUTIONS} AS e SET status = %s, finished_at = STATEMENT_TIMESTAMP(), output = v.output, "  # noqa: S608 - our table name only
    "external_run_id = CASE WHEN v.run_id = '' THEN e.external_run_id ELSE v.run_id END, "
    "lease_owner = '', lease_expires_at = NULL, next_poll_at = NULL "
    "FROM unnest(%s::bigint[], %s::integer[], %s::text[], %s::text[]) AS v(id, attempt, output, run_id) "
    "WHERE e.id = v.id AND e.attempt = v.attempt AND e.lease_owner = %s AND e.status = ANY(%s::text[])"
)
#: The same for runs that no task follows (the common case: one statement, nothing more).
_SUCCEED_MANY = _SUCCEED_ANY + " AND " + UNFOLLOWED_SQL
#: What :data:`_SUCCEED_ANY` returns for :func:`follow_ended` (its columns named through ``e``:
#: ``v`` has an id, attempt and output too).
_ENDED_RETURNING_E = ", ".join(f"e.{column.strip()}" for column in ENDED_RETURNING.split(","))


def executions_succeed(*, successes: Sequence[Success], worker_id: str, max_chars: int) -> set[int]:
    """:func:`execution_succeed` for several runs of this worker in one statement (with their
    events), each row fenced by its attempt and this worker's lease; returns the ids it won."""
    edge = states.SUCCEED

    def params(rows: Sequence[Success]) -> list[Any]:
        """The arrays of :data:`_SUCCEED_ANY` (and :data:`_SUCCEED_MANY`) for ``rows``."""
        return [
            edge.target,
            pg_array(success.execution_id for success in rows),
            pg_array(success.attempt for success in rows),
            pg_array(bounded(success.output, max_chars) for success in rows),
            pg_array(success.external_run_id[:255] for success in rows),
            worker_id,
            pg_array(sorted(edge.sources)),
        ]

    # Concurrent statements share rollup rows (the status trigger's, executions/triggers.py),
    # which it writes in their key's order: they wait for each other, never deadlock.
    (source,) = edge.sources
    event = Event(source, edge.target, worker_id)
    alone = [success for success in successes if not success.followed]
    rows = with_events(_SUCCEED_MANY, params(alone), event, returning="e.id, e.attempt") if alone else []
    won = {row[0] for row in rows}
    rest = [success for success in successes if success.execution_id not in won]
    if rest:
        # The runs of followed tasks (and those lost for good, which lose again): in one
        # statement too, in a transaction that also creates what follows them (workflow steps
        # are otherwise each an end of their own: a chain's steps went out a few per message and
        # were ended one by one).
        with transaction.atomic():
            ended = with_events(_SUCCEED_ANY, params(rest), event, returning=_ENDED_RETURNING_E)
            if ended:
                follow_ended(ended_rows(ended))
        won.update(row[0] for row in ended)
    return won


def execution_fail(
    *,
    execution_id: int,
    attempt: int,
    worker_id: str | None,
    error: str,
    output: str,
    retry_in: float | None,
    max_chars: int,
    external_run_id: str | None = None,
    actor: str | None = None,
) -> str | None:
    """End a failed attempt: RUNNING → SCHEDULED (attempt + 1, due in ``retry_in`` seconds), or,
    with ``retry_in=None``, RUNNING → FAILED. Returns the new status, or None if the write lost.
    ``actor``: as for :func:`execution_succeed`.
    """
    values: dict[str, object] = {"error": bounded(error, max_chars), "output": bounded(output, max_chars), **_ENDED}
    if external_run_id:
        values["external_run_id"] = external_run_id[:255]
    if retry_in is None:
        edge, detail = states.FAIL, f"permanently failed after attempt {attempt}: {error[:500]}"
        values["finished_at"] = Now()
    else:
        edge, detail = states.RETRY_LATER, f"attempt {attempt} failed, retry in {retry_in:.3g}s: {error[:500]}"
        values |= {
            "attempt": F("attempt") + 1,
            "due_at": db_now_plus(retry_in),
            "external_run_id": "",
            "run_handle": {},
            "poll_count": 0,
            "handbacks": 0,
            "orphaned": False,
        }
    actor, condition = worker_id or actor or CALLBACK_ACTOR, fenced(execution_id, attempt, worker_id)
    if edge is states.RETRY_LATER:
        won = write(edge, condition, values, actor=actor, detail=detail)
    # Ended for good: alone if nothing follows its task (see execution_succeed), else with the
    # runs that follow, in one transaction.
    elif not (won := write(edge, condition & unfollowed(), values, actor=actor, detail=detail)):
        with transaction.atomic():
            won = write(edge, condition, values, actor=actor, detail=detail, returning=ENDED_RETURNING)
            if won:
                follow_ended(ended_rows(won))
    return edge.target if won else None


def execution_acquire(*, execution_id: int, attempt: int, worker_id: str, lease_seconds: float) -> bool:
    """Lease a RUNNING execution nobody holds (a poll is due, or it was handed back).

    Taking over a handed-back execution writes a "resumed" event, so the timeline shows who
    resumed it and when.
    """
    free = Q(pk=execution_id, attempt=attempt, lease_owner="")
    lease = {
        "lease_owner": worker_id,
        "lease_expires_at": db_now_plus(lease_seconds),
        "poll_count": F("poll_count") + 1,
    }
    if write_quiet(states.LEASE, free & Q(orphaned=False), lease):
        return True
    return bool(
        write(
            states.RESUME,
            free & Q(orphaned=True),
            {**lease, "orphaned": False},
            actor=worker_id,
            detail="resumed after the previous lease expired",
        )
    )


def execution_release(*, execution_id: int, attempt: int, worker_id: str, poll_in: float) -> bool:
    """Give up the lease of a still-running asynchronous run until its next poll is due."""
    values = {"lease_owner": "", "lease_expires_at": None, "next_poll_at": db_now_plus(poll_in)}
    return bool(write_quiet(states.LEASE, fenced(execution_id, attempt, worker_id), values))


def execution_extend_lease(*, execution_id: int, attempt: int, worker_id: str, lease_seconds: float) -> bool:
    """Push the lease expiry of an execution this worker is working on; False if the lease is lost."""
    values = {"lease_expires_at": db_now_plus(lease_seconds)}
    return bool(write_quiet(states.LEASE, fenced(execution_id, attempt, worker_id), values))


def execution_report_progress(*, execution_id: int, attempt: int, progress: str) -> bool:
    """A job's heartbeat or progress report through its callback URL (no status change)."""
    values = {"progress": progress[:500], "reported_at": Now()}
    return bool(write_quiet(states.LEASE, fenced(execution_id, attempt, None), values))
