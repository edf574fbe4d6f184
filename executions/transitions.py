"""The only module that writes an execution's status.

Every transition is one conditional UPDATE (``WHERE id = … AND status IN (allowed sources)``,
plus the attempt number and the lease owner for a worker's writes) that reports whether it won,
and it writes its :class:`~executions.models.ExecutionEvent` in the same transaction. A caller
that loses changes nothing and must stop working on that execution. Time always comes from the
database clock (``now()``), never from the host.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import connection, transaction
from django.db.models import (
    BooleanField,
    CharField,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Field,
    Min,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    sql,
)
from django.db.models.functions import Cast, Concat, Now
from django.db.models.lookups import IsNull

from executions.models import TERMINAL_STATUSES, Execution, ExecutionEvent, SkippedOccurrence, SkipReason
from executions.models import ExecutionStatus as S
from tasks_app.models import MisfirePolicy, OverlapPolicy, Task, TaskStatus
from tms_core.clock import db_now

#: For each target status, the statuses an execution may come from.
ALLOWED_SOURCES: Mapping[str, frozenset[str]] = {
    S.PENDING: frozenset({S.SCHEDULED, S.PENDING}),  # published (again) by a monitor
    S.RUNNING: frozenset({S.PENDING}),  # claimed by a worker
    S.SUCCEEDED: frozenset({S.RUNNING}),
    S.FAILED: frozenset({S.RUNNING}),
    S.SCHEDULED: frozenset({S.RUNNING, S.PENDING}),  # an attempt failed; or a take could not be published
    S.CANCELLED: frozenset({S.SCHEDULED, S.PENDING, S.RUNNING}),
}
assert not any(ALLOWED_SOURCES[target] & TERMINAL_STATUSES for target in ALLOWED_SOURCES), "terminal is final"


def _db_now_plus(seconds: float) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField())


def _bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = f"\n… [{len(text) - limit} characters cut]"
    return text[: max(0, limit - len(marker))] + marker


def _event(
    execution_id: int, from_status: str, to_status: str, attempt: int, actor: str, detail: str = ""
) -> ExecutionEvent:
    return ExecutionEvent(
        execution_id=execution_id,
        from_status=from_status,
        to_status=to_status,
        attempt=attempt,
        actor=actor[:200],
        detail=detail,
    )


def _update_sql(queryset: QuerySet, values: dict[str, Any]) -> tuple[str, tuple]:
    """Compile ``queryset.update(**values)`` to SQL without running it."""
    query = queryset.query.chain(sql.UpdateQuery)
    assert isinstance(query, sql.UpdateQuery)  # chain(klass) returns a copy of that class
    query.add_update_values(values)
    return query.get_compiler(connection=connection).as_sql()


def _transition(queryset: QuerySet, values: dict[str, Any], event: ExecutionEvent) -> bool:
    """Apply one conditional UPDATE and, if it won, its audit event, atomically.

    On PostgreSQL both go in one statement (``WITH done AS (UPDATE … RETURNING id) INSERT …``):
    one round trip and one commit on the worker's hot path. Elsewhere, UPDATE then INSERT in a
    transaction.
    """
    if connection.vendor != "postgresql":
        with transaction.atomic():
            won = queryset.update(**values)
            if won:
                event.save()
        return bool(won)
    update, params = _update_sql(queryset, values)
    events = ExecutionEvent._meta.db_table
    statement = (
        f"WITH done AS ({update} RETURNING id) "  # noqa: S608 - compiled by Django, values are params
        f"INSERT INTO {events} (execution_id, from_status, to_status, attempt, at, actor, detail) "
        "SELECT id, %s, %s, %s, statement_timestamp(), %s, %s FROM done RETURNING execution_id"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            statement, (*params, event.from_status, event.to_status, event.attempt, event.actor, event.detail)
        )
        return cursor.fetchone() is not None


# --- creation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewExecution:
    task_id: object
    scheduled_for: datetime
    priority: int
    #: When the monitor should publish it; ``scheduled_for`` unless the task has jitter.
    due_at: datetime | None = None
    #: The task's overlap policy is not "allow": claims go through :func:`execution_claim_exclusive`.
    exclusive: bool = False


def executions_create(
    *, rows: Sequence[NewExecution], actor: str, detail: str = "", origin: str = "schedule"
) -> list[int]:
    """Insert SCHEDULED executions, skipping occurrences that already exist; return the new ids.

    ``INSERT … ON CONFLICT DO NOTHING RETURNING id`` on the unique (task, scheduled_for) of
    non-superseded rows makes materialising the same occurrence twice, or in two processes at
    once, create it exactly once. ``origin`` other than ``schedule`` (a backfill) is set in the
    same transaction, before any other process can see the rows.
    """
    if not rows:
        return []
    ids: list[int] = []
    with transaction.atomic():
        for start in range(0, len(rows), _INSERT_CHUNK):
            ids += _insert_executions(rows[start : start + _INSERT_CHUNK], actor=actor, detail=detail)
        if origin != "schedule" and ids:
            Execution.objects.filter(pk__in=ids).update(origin=origin)
    return ids


#: Rows per INSERT statement.
_INSERT_CHUNK = 5000


def _quoted(value: object) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


#: How an array element of each type is written: text is quoted; numbers, booleans, UUIDs and
#: timestamps (ISO 8601: digits and -:.+T) need not be.
_ELEMENT_FORMATS: Mapping[type, Callable[[Any], str]] = {
    datetime: datetime.isoformat,
    bool: lambda value: "t" if value else "f",
    int: int.__repr__,
    uuid.UUID: uuid.UUID.__str__,
}


def pg_array(values: Iterable[object]) -> str:
    """A PostgreSQL array literal (``{"a","b",NULL}``) for a ``%s::type[]`` parameter; the
    values are of one type, or None.

    Bulk writes pass one such text per column and ``unnest`` them server-side: the statement
    stays a few hundred bytes whatever the row count, where a VALUES list of thousands of rows
    costs the client its quoting and the server its parsing.
    """
    values = list(values)
    kind = next((type(value) for value in values if value is not None), str)
    write = _ELEMENT_FORMATS.get(kind, _quoted)
    return "{" + ",".join(["NULL" if value is None else write(value) for value in values]) + "}"


def _insert_executions(rows: Sequence[NewExecution], *, actor: str, detail: str) -> list[int]:
    """Insert one chunk with its creation events: on PostgreSQL one statement (columns as
    arrays, the events written by a data-modifying CTE); elsewhere a VALUES insert, then the events."""
    if connection.vendor != "postgresql":
        return _insert_executions_portable(rows, actor=actor, detail=detail)
    # Table names are ours; every value goes through params. No conflict target: the occurrence
    # uniqueness is a partial index (superseded rows leave it).
    sql = f"""
        WITH created AS (
            INSERT INTO {Execution._meta.db_table} (task_id, scheduled_for, due_at, priority, exclusive, status,
                attempt, lease_owner, external_run_id, run_handle, message_id, output, error)
            SELECT v.task_id, v.scheduled_for, v.due_at, v.priority, v.exclusive, %s, 1, '', '', '{{}}', '', '', ''
            FROM unnest(%s::uuid[], %s::timestamptz[], %s::timestamptz[], %s::smallint[], %s::boolean[])
                AS v (task_id, scheduled_for, due_at, priority, exclusive)
            ON CONFLICT DO NOTHING
            RETURNING id
        )
        INSERT INTO {ExecutionEvent._meta.db_table} (execution_id, from_status, to_status, attempt, at, actor, detail)
        SELECT id, '', %s, 1, statement_timestamp(), %s, %s FROM created
        RETURNING execution_id
    """  # noqa: S608
    params = [
        S.SCHEDULED,
        pg_array(row.task_id for row in rows),
        pg_array(row.scheduled_for for row in rows),
        pg_array(row.due_at or row.scheduled_for for row in rows),
        pg_array(row.priority for row in rows),
        pg_array(row.exclusive for row in rows),
        S.SCHEDULED,
        actor[:200],
        detail,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def _insert_executions_portable(rows: Sequence[NewExecution], *, actor: str, detail: str) -> list[int]:
    """The embedded (SQLite) default: a VALUES insert in chunks within SQLite's parameter limit,
    then the events."""
    columns = (
        "task_id, scheduled_for, status, attempt, due_at, priority, lease_owner,"
        " external_run_id, run_handle, message_id, output, error, exclusive"
    )
    task_field = Execution._meta.get_field("task")
    time_field = Execution._meta.get_field("scheduled_for")
    ids: list[int] = []
    for start in range(0, len(rows), 1000):
        chunk = rows[start : start + 1000]
        placeholders = ", ".join(["(%s, %s, %s, 1, %s, %s, '', '', '{}', '', '', '', %s)"] * len(chunk))
        params: list[Any] = []
        for row in chunk:
            params += [
                task_field.get_db_prep_value(row.task_id, connection),
                time_field.get_db_prep_value(row.scheduled_for, connection),
                S.SCHEDULED,
                time_field.get_db_prep_value(row.due_at or row.scheduled_for, connection),
                row.priority,
                row.exclusive,
            ]
        sql = (
            f"INSERT INTO {Execution._meta.db_table} ({columns}) VALUES {placeholders} "  # noqa: S608
            "ON CONFLICT DO NOTHING RETURNING id"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            ids += [row[0] for row in cursor.fetchall()]
    ExecutionEvent.objects.bulk_create([_event(i, "", S.SCHEDULED, 1, actor, detail) for i in ids])
    return ids


# --- misfire policy at dispatch and claim ------------------------------------------------------

#: No task's misfire grace is shorter (``tasks_app.models.MIN_MISFIRE_GRACE``): a row less late
#: than this is on time whatever its task says, and is dispatched or claimed without looking.
_NEVER_STALE = timedelta(seconds=1)


def _of_task(column: str) -> Subquery:
    return Subquery(Task.objects.filter(pk=OuterRef("task_id")).values(column)[:1])


def _ago(amount: Subquery) -> ExpressionWrapper:
    return ExpressionWrapper(Now() - amount, output_field=DateTimeField())


def _on_time_cheap() -> Q:
    """Rows certainly on time for the misfire policy, known from the row alone: not a scheduled
    first attempt (triggers, retries by request and retry backoffs are not misfires), or due less
    than a second ago."""
    return (
        Q(due_at__gte=ExpressionWrapper(Now() - Value(_NEVER_STALE), output_field=DateTimeField()))
        | ~Q(origin="schedule")
        | Q(attempt__gt=1)
    )


def _on_time() -> Q:
    """The rows the misfire policy and the maximum age have nothing to say about now:
    :func:`_on_time_cheap`, or due less than the task's ``misfire_grace`` ago and fired less than
    its ``max_age`` ago. The cheap tests come first: PostgreSQL evaluates an OR left to right and
    stops at the first true one, so the task is looked up (primary-key reads) only for a row over a
    second late. (A row due less than a second ago is never expired: ``max_age`` is at least the
    task's jitter plus one second.)"""
    fresh = Q(due_at__gte=_ago(_of_task("misfire_grace"))) & (
        Q(scheduled_for__gte=_ago(_of_task("max_age"))) | Q(IsNull(_of_task("max_age"), True))
    )
    return _on_time_cheap() | fresh


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
    a catch-up run (the README's 10:09 catch-up runs beside the on-time 10:10).

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


def execution_skip_misfire(*, execution_id: int, attempt: int, from_status: str, misfire: Misfire, actor: str) -> bool:
    """SCHEDULED | PENDING → CANCELLED because its task's misfire policy drops it (see
    :func:`misfire_decision`), recorded as a skipped occurrence with the reason; conditional on
    the status and attempt the caller saw. Returns whether it won."""
    assert from_status in (S.SCHEDULED, S.PENDING)
    with transaction.atomic():
        won = _transition(
            Execution.objects.filter(pk=execution_id, status=from_status, attempt=attempt),
            {
                "status": S.CANCELLED,
                "finished_at": Now(),
                "error": misfire.detail,
                "lease_owner": "",
                "lease_expires_at": None,
            },
            _event(execution_id, from_status, S.CANCELLED, attempt, actor, misfire.detail),
        )
        if won:
            row = Execution.objects.filter(pk=execution_id).values("task_id", "scheduled_for").get()
            SkippedOccurrence.objects.bulk_create(
                [SkippedOccurrence(**row, reason=misfire.reason, detail=misfire.detail, execution_id=execution_id)],
                ignore_conflicts=True,
            )
    return won


def _drop_misfires(rows: Sequence[tuple[int, int, bool]], *, from_status: str, actor: str) -> set[int]:
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


# --- monitor ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dispatch:
    """An execution taken by a monitor, to be published as a message."""

    execution_id: int
    attempt: int
    priority: int
    message_id: str
    #: "run" (SCHEDULED → PENDING), "republish" (PENDING again) or "poll" (RUNNING).
    kind: str = "run"


@transaction.atomic
def _take(base: Q, *, limit: int, actor: str, detail: str, from_status: str) -> list[Dispatch]:
    locked = (
        Execution.objects.filter(base)
        .order_by("due_at" if from_status == S.SCHEDULED else "enqueued_at")
        .select_for_update(skip_locked=True, of=("self",))
        .annotate(maybe_stale=ExpressionWrapper(~_on_time_cheap(), output_field=BooleanField()))
        .values_list("id", "attempt", "priority", "maybe_stale")[:limit]
    )
    locked_rows = list(locked)
    if not locked_rows:
        return []
    # The misfire policy, decided where the run is dispatched: stale rows it drops are cancelled
    # and recorded instead of being published (the common case, nothing over a second late, costs
    # nothing more than the annotation above).
    dropped = _drop_misfires([(i, a, stale) for i, a, _, stale in locked_rows], from_status=from_status, actor=actor)
    taken = [(i, a, p) for i, a, p, _ in locked_rows if i not in dropped]
    if not taken:
        return []
    token = uuid.uuid4().hex[:12]
    ids = [row[0] for row in taken]
    Execution.objects.filter(base, id__in=ids).update(
        status=S.PENDING,
        enqueued_at=Now(),
        message_id=Concat(Cast("id", output_field=CharField()), Value(f"-{token}")),
    )
    ExecutionEvent.objects.bulk_create([_event(i, from_status, S.PENDING, a, actor, detail) for i, a, _ in taken])
    kind = "run" if from_status == S.SCHEDULED else "republish"
    return [Dispatch(i, a, p, f"{i}-{token}", kind) for i, a, p in taken]


def executions_take_due(*, limit: int, actor: str) -> list[Dispatch]:
    """Move up to ``limit`` due SCHEDULED executions to PENDING (``FOR UPDATE SKIP LOCKED``) and
    commit, before the caller publishes them: a worker always finds the row PENDING when the
    message reaches it. What cannot be published goes back through :func:`executions_untake`;
    if the monitor dies first, the rows are published again once PENDING for too long.
    """
    return _take(Q(status=S.SCHEDULED, due_at__lte=Now()), limit=limit, actor=actor, detail="", from_status=S.SCHEDULED)


def executions_take_stale_pending(*, limit: int, older_than: float, actor: str) -> list[Dispatch]:
    """Re-take PENDING executions nobody claimed for ``older_than`` seconds (message lost)."""
    cutoff = ExpressionWrapper(Now() - Value(timedelta(seconds=older_than)), output_field=DateTimeField())
    return _take(
        Q(status=S.PENDING, enqueued_at__lt=cutoff),
        limit=limit,
        actor=actor,
        detail=f"unclaimed for {older_than:g}s: published again",
        from_status=S.PENDING,
    )


def next_due_in() -> float | None:
    """Seconds until the earliest SCHEDULED execution is due (0 if overdue), or None if none.
    One query on the due index, against the database clock."""
    wait = Execution.objects.filter(status=S.SCHEDULED).aggregate(
        wait=ExpressionWrapper(Min("due_at") - Now(), output_field=DurationField())
    )["wait"]
    return None if wait is None else max(0.0, wait.total_seconds())


# --- worker -----------------------------------------------------------------------------------


def _fenced(execution_id: int, attempt: int, worker_id: str | None) -> Q:
    """The row a worker may write: RUNNING, this attempt, and its lease. ``worker_id=None`` is a
    job reporting through its callback URL: fenced by the attempt only, whoever polls it."""
    condition = Q(pk=execution_id, status=S.RUNNING, attempt=attempt)
    return condition if worker_id is None else condition & Q(lease_owner=worker_id)


#: The actor recorded for outcomes a job reported itself.
CALLBACK_ACTOR = "callback"


def _claim(
    execution_id: int,
    attempt: int,
    worker_id: str,
    lease_seconds: float,
    *,
    exclusive: bool = False,
    checked: bool = False,
) -> tuple[QuerySet, dict, ExecutionEvent]:
    # An exclusive execution (overlap policy other than "allow") is claimed only through
    # execution_claim_exclusive, which looks at its siblings first; so is a stale one (its misfire
    # policy may drop it), unless the caller (``checked``) already applied the policy under lock.
    queryset = Execution.objects.filter(pk=execution_id, status=S.PENDING, attempt=attempt, exclusive=exclusive)
    if not checked:
        queryset = queryset.filter(_on_time())
    values = {
        "status": S.RUNNING,
        "lease_owner": worker_id,
        "lease_expires_at": _db_now_plus(lease_seconds),
        "started_at": Now(),
    }
    if checked:  # a checked claim may start an execution that waited for a slot
        values["waiting"] = ""
    return queryset, values, _event(execution_id, S.PENDING, S.RUNNING, attempt, worker_id)


def execution_claim(*, execution_id: int, attempt: int, worker_id: str, lease_seconds: float) -> bool:
    """PENDING → RUNNING for ``attempt``, leased to ``worker_id``. False if another claim won, or
    if the execution is exclusive or stale (see :func:`execution_claim_exclusive`)."""
    return _transition(*_claim(execution_id, attempt, worker_id, lease_seconds))


def execution_claim_loaded(
    *,
    execution_id: int,
    attempt: int,
    worker_id: str,
    lease_seconds: float,
    exclusive: bool = False,
    checked: bool = False,
) -> Execution | None:
    """:func:`execution_claim`, returning the claimed execution with its task loaded (None if
    the claim lost). On PostgreSQL the claim, its event and the load are one statement.

    ``exclusive=True`` claims an exclusive execution and ``checked=True`` a stale one: only
    :func:`execution_claim_exclusive` passes them, holding the task's lock after applying the
    misfire and overlap policies."""
    queryset, values, event = _claim(
        execution_id, attempt, worker_id, lease_seconds, exclusive=exclusive, checked=checked
    )
    if connection.vendor != "postgresql":
        if not _transition(queryset, values, event):
            return None
        return Execution.objects.select_related("task").filter(pk=execution_id).first()
    update, params = _update_sql(queryset, values)
    from tasks_app.models import Task

    execution_fields, task_fields = Execution._meta.concrete_fields, Task._meta.concrete_fields
    columns = ", ".join([f'claimed."{f.column}"' for f in execution_fields] + [f't."{f.column}"' for f in task_fields])
    statement = (
        f"WITH claimed AS ({update} RETURNING *), "  # noqa: S608 - compiled by Django, values are params
        f"logged AS (INSERT INTO {ExecutionEvent._meta.db_table} "
        "(execution_id, from_status, to_status, attempt, at, actor, detail) "
        "SELECT id, %s, %s, %s, statement_timestamp(), %s, %s FROM claimed) "
        f"SELECT {columns} FROM claimed JOIN {Task._meta.db_table} t ON t.id = claimed.task_id"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, (*params, event.from_status, event.to_status, event.attempt, event.actor, ""))
        row = cursor.fetchone()
    if row is None:
        return None
    execution = _from_row(Execution, execution_fields, row[: len(execution_fields)])
    execution.task = _from_row(Task, task_fields, row[len(execution_fields) :])
    return execution


_M = TypeVar("_M", bound=Model)


def _from_row(model: type[_M], fields: Sequence[Field], values: Sequence[Any]) -> _M:
    """A model instance from raw column values, through the same converters a query applies."""
    converted = []
    for field, value in zip(fields, values, strict=True):
        column = field.get_col(model._meta.db_table)
        for converter in connection.ops.get_db_converters(column) + field.get_db_converters(connection):
            value = converter(value, column, connection)
        converted.append(value)
    return model.from_db(connection.alias, [f.attname for f in fields], converted)


#: How long a queue_one execution waits before asking again whether the previous run ended.
QUEUE_RETRY_SECONDS = 1.0


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
    misfire policy (:func:`misfire_decision`), which may drop it (PENDING → CANCELLED, recorded
    as a skipped occurrence: ``missed`` or ``coalesced``) before the overlap policy is looked at.

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
    claimable = Execution.objects.filter(pk=execution_id, status=S.PENDING, attempt=attempt)
    with transaction.atomic():
        # Unlocked first: a duplicate or stale delivery loses without waiting for the task lock.
        task_id = claimable.values_list("task_id", flat=True).first()
        if task_id is None:
            return ExclusiveClaim("lost")
        task = Task.objects.select_for_update().filter(pk=task_id).values("overlap_policy", "max_concurrency").first()
        if task is None:  # pragma: no cover - executions go with their task
            return ExclusiveClaim("lost")
        # Task, then execution: the order task_update, task_pause and task_delete lock them in.
        row = claimable.select_for_update().values("task_id", "scheduled_for", "exclusive").first()
        if row is None:  # moved on (cancelled, untaken, claimed) since the first read
            return ExclusiveClaim("lost")
        # The misfire policy, decided where the run is claimed (the rows stayed PENDING while no
        # worker ran: it may be stale now, or a later occurrence may be).
        misfire = misfire_decision(execution_id=execution_id)
        if misfire is not None and misfire.dropped:
            if execution_skip_misfire(
                execution_id=execution_id, attempt=attempt, from_status=S.PENDING, misfire=misfire, actor=worker_id
            ):
                return ExclusiveClaim("skipped", detail=misfire.detail)
            return ExclusiveClaim("lost")  # pragma: no cover - the row is locked PENDING
        if not row["exclusive"]:
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
        policy = task["overlap_policy"]
        siblings = Execution.objects.filter(task_id=row["task_id"]).exclude(pk=execution_id)
        running = list(siblings.filter(status=S.RUNNING).order_by("id").values_list("id", flat=True))
        cancelled: list[tuple[int, CancelOutcome]] = []
        if running and policy != OverlapPolicy.ALLOW:
            names = ", ".join(str(i) for i in running)
            if policy == OverlapPolicy.CANCEL_PREVIOUS:
                for previous in running:
                    outcome = execution_cancel(
                        execution_id=previous, actor=worker_id, reason=f"cancelled by the next run ({execution_id})"
                    )
                    if outcome.won:
                        cancelled.append((previous, outcome))
            else:
                waiting = (
                    siblings.filter(status__in=(S.SCHEDULED, S.PENDING), exclusive=True)
                    .filter(
                        Q(scheduled_for__lt=row["scheduled_for"])
                        | Q(scheduled_for=row["scheduled_for"], pk__lt=execution_id)
                    )
                    .order_by("scheduled_for")
                    .values_list("id", flat=True)
                    .first()
                )
                if policy == OverlapPolicy.QUEUE_ONE and waiting is None:
                    detail = f"overlap: queued behind running execution {names}"
                    queued = _transition(
                        Execution.objects.filter(pk=execution_id, status=S.PENDING, attempt=attempt),
                        {
                            "status": S.SCHEDULED,
                            "due_at": _db_now_plus(QUEUE_RETRY_SECONDS),
                            "message_id": "",
                            "enqueued_at": None,
                        },
                        _event(execution_id, S.PENDING, S.SCHEDULED, attempt, worker_id, detail),
                    )
                    return ExclusiveClaim("queued" if queued else "lost", detail=detail)
                if policy == OverlapPolicy.QUEUE_ONE:
                    detail = f"overlap: execution {waiting} is already waiting behind running execution {names}"
                else:
                    detail = f"overlap: previous run {names} still running"
                return _skip_for_overlap(execution_id, attempt, row, worker_id, detail)
        cap = task["max_concurrency"]
        if cap is not None and policy == OverlapPolicy.ALLOW:
            held = _wait_for_slot(execution_id, attempt, row, worker_id, cap=cap, running=len(running))
            if held is not None:
                return held
        claimed = execution_claim_loaded(
            execution_id=execution_id,
            attempt=attempt,
            worker_id=worker_id,
            lease_seconds=lease_seconds,
            exclusive=True,
            checked=True,
        )
    if claimed is None:  # pragma: no cover - the row is locked PENDING
        return ExclusiveClaim("lost")
    return ExclusiveClaim("claimed", claimed, tuple(cancelled))


#: A run held by its task's ``max_concurrency`` is released by the end of a running sibling
#: (:func:`executions_release_waiting`); this is only the backstop, if that release was lost (its
#: worker died between the two writes), so the wait is re-checked this often, not every second.
WAIT_RECHECK_SECONDS = 30.0


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
    queued = _transition(
        Execution.objects.filter(pk=execution_id, status=S.PENDING, attempt=attempt),
        {
            "status": S.SCHEDULED,
            "due_at": _db_now_plus(WAIT_RECHECK_SECONDS),
            "message_id": "",
            "enqueued_at": None,
            "waiting": reason,
        },
        _event(execution_id, S.PENDING, S.SCHEDULED, attempt, worker_id, f"waiting: {reason} ({running} running)"),
    )
    return ExclusiveClaim("waiting" if queued else "lost", detail=f"waiting: {reason}")


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
    return Execution.objects.filter(id__in=waiters, status=S.SCHEDULED).exclude(waiting="").update(due_at=Now())


def _skip_for_overlap(execution_id: int, attempt: int, row: Mapping, worker_id: str, detail: str) -> ExclusiveClaim:
    won = _transition(
        Execution.objects.filter(pk=execution_id, status=S.PENDING, attempt=attempt),
        {"status": S.CANCELLED, "finished_at": Now(), "error": detail, "lease_owner": "", "lease_expires_at": None},
        _event(execution_id, S.PENDING, S.CANCELLED, attempt, worker_id, detail),
    )
    if not won:  # pragma: no cover - the row is locked PENDING
        return ExclusiveClaim("lost")
    SkippedOccurrence.objects.bulk_create(
        [
            SkippedOccurrence(
                task_id=row["task_id"],
                scheduled_for=row["scheduled_for"],
                reason=SkipReason.OVERLAP,
                detail=detail,
                execution_id=execution_id,
            )
        ],
        ignore_conflicts=True,
    )
    return ExclusiveClaim("skipped", detail=detail)


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
        values |= {"next_poll_at": _db_now_plus(poll_in), "lease_owner": "", "lease_expires_at": None}
    return bool(Execution.objects.filter(_fenced(execution_id, attempt, worker_id)).update(**values))


def execution_succeed(
    *,
    execution_id: int,
    attempt: int,
    worker_id: str | None,
    output: str,
    max_chars: int,
    external_run_id: str | None = None,
) -> bool:
    """RUNNING → SUCCEEDED; fenced by lease and attempt."""
    extra = {"external_run_id": external_run_id[:255]} if external_run_id else {}
    values = extra | {
        "status": S.SUCCEEDED,
        "finished_at": Now(),
        "output": _bounded(output, max_chars),
        "lease_owner": "",
        "lease_expires_at": None,
        "next_poll_at": None,
    }
    event = _event(execution_id, S.RUNNING, S.SUCCEEDED, attempt, worker_id or CALLBACK_ACTOR)
    return _transition(Execution.objects.filter(_fenced(execution_id, attempt, worker_id)), values, event)


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
) -> str | None:
    """End a failed attempt: RUNNING → SCHEDULED (attempt + 1, due in ``retry_in`` seconds), or,
    with ``retry_in=None``, RUNNING → FAILED. Returns the new status, or None if the write lost.
    """
    common: dict[str, object] = {
        "error": _bounded(error, max_chars),
        "output": _bounded(output, max_chars),
        "lease_owner": "",
        "lease_expires_at": None,
        "next_poll_at": None,
    }
    if external_run_id:
        common["external_run_id"] = external_run_id[:255]
    if retry_in is None:
        target, detail = S.FAILED, f"permanently failed after attempt {attempt}: {error[:500]}"
        values = common | {"status": S.FAILED, "finished_at": Now()}
        event_attempt = attempt
    else:
        target, detail = S.SCHEDULED, f"attempt {attempt} failed, retry in {retry_in:.3g}s: {error[:500]}"
        values = common | {
            "status": S.SCHEDULED,
            "attempt": F("attempt") + 1,
            "due_at": _db_now_plus(retry_in),
            "external_run_id": "",
            "run_handle": {},
            "poll_count": 0,
            "handbacks": 0,
            "orphaned": False,
        }
        event_attempt = attempt + 1
    event = _event(execution_id, S.RUNNING, target, event_attempt, worker_id or CALLBACK_ACTOR, detail)
    won = _transition(Execution.objects.filter(_fenced(execution_id, attempt, worker_id)), values, event)
    return target if won else None


#: Polls and resumptions of work already running go ahead of starting new work.
POLL_PRIORITY = 9


@transaction.atomic
def executions_take_polls(*, limit: int, in_flight_for: float, actor: str) -> list[Dispatch]:
    """Take RUNNING executions that need a worker's attention, for a short poll message:
    an asynchronous run whose ``next_poll_at`` came, or a run whose lease expired (its worker
    died), which is handed back so another worker resumes the same attempt.

    ``next_poll_at`` moves ``in_flight_for`` seconds ahead, so a lost poll message is sent again.
    """
    due = Q(status=S.RUNNING) & (Q(lease_owner="", next_poll_at__lte=Now()) | Q(lease_expires_at__lt=Now()))
    taken = list(
        Execution.objects.filter(due)
        .order_by("next_poll_at")
        .select_for_update(skip_locked=True, of=("self",))
        .values_list("id", "attempt", "priority", "lease_owner")[:limit]
    )
    if not taken:
        return []
    token = uuid.uuid4().hex[:12]
    polls = [i for i, _, _, owner in taken if not owner]
    expired = [(i, a, owner) for i, a, _, owner in taken if owner]
    in_flight = _db_now_plus(in_flight_for)
    if polls:
        Execution.objects.filter(id__in=polls).update(next_poll_at=in_flight)
    if expired:
        Execution.objects.filter(id__in=[i for i, _, _ in expired]).update(
            lease_owner="", lease_expires_at=None, next_poll_at=in_flight, handbacks=F("handbacks") + 1, orphaned=True
        )
        ExecutionEvent.objects.bulk_create(
            [
                _event(i, S.RUNNING, S.RUNNING, a, actor, f"lease of {owner} expired: handed back")
                for i, a, owner in expired
            ]
        )
    return [Dispatch(i, a, POLL_PRIORITY, f"{i}-poll-{token}", "poll") for i, a, _, _ in taken]


def executions_untake(*, dispatches: Sequence[Dispatch], actor: str, reason: str) -> int:
    """Undo takes whose messages could not be published: PENDING → SCHEDULED (still due), and
    polls due again at once. Rows a worker already moved on (it got the message after all) are
    left alone. Returns how many executions went back to SCHEDULED.
    """
    runs = {d.message_id: d for d in dispatches if d.kind == "run"}
    polls = [d.execution_id for d in dispatches if d.kind == "poll"]
    with transaction.atomic():
        back = list(
            Execution.objects.select_for_update()
            .filter(status=S.PENDING, message_id__in=list(runs))
            .values_list("id", "message_id")
        )
        if back:
            Execution.objects.filter(id__in=[i for i, _ in back], status=S.PENDING).update(
                status=S.SCHEDULED, message_id="", enqueued_at=None
            )
            ExecutionEvent.objects.bulk_create(
                [_event(i, S.PENDING, S.SCHEDULED, runs[m].attempt, actor, reason) for i, m in back]
            )
        if polls:
            Execution.objects.filter(id__in=polls, status=S.RUNNING, lease_owner="").update(next_poll_at=Now())
    return len(back)


def execution_acquire(*, execution_id: int, attempt: int, worker_id: str, lease_seconds: float) -> bool:
    """Lease a RUNNING execution nobody holds (a poll is due, or it was handed back).

    Taking over a handed-back execution writes a "resumed" event, so the timeline shows who
    resumed it and when.
    """
    free = Execution.objects.filter(pk=execution_id, status=S.RUNNING, attempt=attempt, lease_owner="")
    lease = {
        "lease_owner": worker_id,
        "lease_expires_at": _db_now_plus(lease_seconds),
        "poll_count": F("poll_count") + 1,
    }
    if free.filter(orphaned=False).update(**lease):
        return True
    with transaction.atomic():
        if not free.filter(orphaned=True).update(**lease, orphaned=False):
            return False
        _event(
            execution_id, S.RUNNING, S.RUNNING, attempt, worker_id, "resumed after the previous lease expired"
        ).save()
    return True


def execution_release(*, execution_id: int, attempt: int, worker_id: str, poll_in: float) -> bool:
    """Give up the lease of a still-running asynchronous run until its next poll is due."""
    return bool(
        Execution.objects.filter(_fenced(execution_id, attempt, worker_id)).update(
            lease_owner="", lease_expires_at=None, next_poll_at=_db_now_plus(poll_in)
        )
    )


def execution_extend_lease(*, execution_id: int, attempt: int, worker_id: str, lease_seconds: float) -> bool:
    """Push the lease expiry of an execution this worker is working on; False if the lease is lost."""
    return bool(
        Execution.objects.filter(_fenced(execution_id, attempt, worker_id)).update(
            lease_expires_at=_db_now_plus(lease_seconds)
        )
    )


def execution_report_progress(*, execution_id: int, attempt: int, progress: str) -> bool:
    """A job's heartbeat or progress report through its callback URL (no status change)."""
    return bool(
        Execution.objects.filter(_fenced(execution_id, attempt, None)).update(
            progress=progress[:500], reported_at=Now()
        )
    )


def executions_expire_leases(*, owners: Sequence[str]) -> int:
    """End the leases held by ``owners`` (processes known to be dead) now, so the monitor hands
    their executions to another worker without waiting for the leases to run out."""
    if not owners:
        return 0
    return Execution.objects.filter(status=S.RUNNING, lease_owner__in=list(owners)).update(lease_expires_at=Now())


# --- users and the platform -------------------------------------------------------------------


@dataclass(frozen=True)
class CancelOutcome:
    won: bool
    #: Status before the cancel (the current one if it lost).
    from_status: str | None
    external_run_id: str = ""
    run_handle: Mapping[str, object] | None = None
    attempt: int = 0


def execution_cancel(
    *,
    execution_id: int,
    actor: str,
    reason: str = "",
    only_from: Collection[str] | None = None,
    supersede: bool = False,
) -> CancelOutcome:
    """SCHEDULED | PENDING | RUNNING → CANCELLED. A worker still on it loses its next write.

    ``only_from`` narrows the statuses it may leave (a schedule change cancels only executions
    that have not started). ``supersede`` marks a never-started execution as replaced: it leaves
    the (task, scheduled_for) uniqueness, so the same occurrence can be materialised again; it
    loses if the execution ever started.

    The row is locked first only to learn the status it is leaving (for the audit event and so
    the caller can stop a RUNNING external run); the UPDATE itself is still conditional.
    """
    sources = ALLOWED_SOURCES[S.CANCELLED]
    if only_from is not None:
        sources = sources & frozenset(only_from)
    with transaction.atomic():
        row = (
            Execution.objects.select_for_update()
            .filter(pk=execution_id)
            .values("status", "attempt", "external_run_id", "run_handle", "started_at")
            .first()
        )
        if row is None or row["status"] not in sources or (supersede and row["started_at"] is not None):
            return CancelOutcome(False, row["status"] if row else None)
        condition = Q(pk=execution_id, status=row["status"], attempt=row["attempt"])
        if supersede:
            condition &= Q(started_at__isnull=True)
        won = Execution.objects.filter(condition).update(
            status=S.CANCELLED,
            finished_at=Now(),
            lease_owner="",
            lease_expires_at=None,
            next_poll_at=None,
            error=reason[:1000],
            superseded=supersede,
        )
        if not won:  # pragma: no cover - the row lock makes this unreachable
            return CancelOutcome(False, row["status"])
        _event(execution_id, row["status"], S.CANCELLED, row["attempt"], actor, reason).save()
    return CancelOutcome(True, row["status"], row["external_run_id"], row["run_handle"], row["attempt"])


def _insert_now(select_sql: str, params: list[Any], *, actor: str, detail: str) -> int | None:
    """Run ``INSERT INTO execution (…) SELECT …`` for one SCHEDULED row due now; write its event.

    The SELECT carries the conditions (it yields no row when they do not hold) and the unique
    constraints decide races (``ON CONFLICT DO NOTHING``). Returns the new id, or None if lost.
    """
    table = Execution._meta.db_table
    columns = (
        "task_id, scheduled_for, status, attempt, due_at, priority, lease_owner, external_run_id,"
        " run_handle, poll_count, message_id, output, error, origin, retry_of_id, superseded, exclusive"
    )
    sql = f"INSERT INTO {table} ({columns}) {select_sql} ON CONFLICT DO NOTHING RETURNING id, attempt"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
        if row is None:
            return None
        new_id, attempt = row
        _event(new_id, "", S.SCHEDULED, attempt, actor, detail).save()
    return new_id


def _now_param() -> object:
    return Execution._meta.get_field("scheduled_for").get_db_prep_value(db_now(), connection)


def execution_trigger(*, task_id: object, actor: str, detail: str = "") -> int | None:
    """Create a SCHEDULED execution of a live (not DELETED) task, due now, outside its schedule.

    Returns its id, or None if the task is gone or deleted (or, vanishingly rarely, an
    occurrence of the task exists at this very microsecond).
    """
    task_table = Task._meta.db_table
    now = _now_param()
    task_pk = Task._meta.pk.get_db_prep_value(task_id, connection)
    select_sql = (
        f"SELECT t.id, %s, %s, 1, %s, t.priority, '', '', '{{}}', 0, '', '', '', %s, NULL, %s,"  # noqa: S608
        f" (t.overlap_policy <> %s OR t.max_concurrency IS NOT NULL) FROM {task_table} t"
        f" WHERE t.id = %s AND t.status <> %s"
    )
    params = [now, S.SCHEDULED, now, "trigger", False, OverlapPolicy.ALLOW, task_pk, TaskStatus.DELETED]
    return _insert_now(select_sql, params, actor=actor, detail=detail or "triggered: run now")


#: The statuses an execution must have to be run again by :func:`execution_retry`.
RETRYABLE_STATUSES: frozenset[str] = frozenset({S.FAILED, S.CANCELLED})


def execution_retry(*, execution_id: int, actor: str) -> int | None:
    """Run a FAILED or CANCELLED execution again: a new SCHEDULED execution of the same task, due
    now, with ``retry_of`` = the old one and attempt = its attempt + 1. The old row stays terminal.

    Conditional on the old execution being FAILED or CANCELLED and its task not DELETED; the
    unique ``retry_of`` makes a second retry of the same execution lose. Returns the new id, or
    None if it lost.
    """
    table, task_table = Execution._meta.db_table, Task._meta.db_table
    now = _now_param()
    select_sql = (
        f"SELECT e.task_id, %s, %s, e.attempt + 1, %s, t.priority, '', '', '{{}}', 0, '', '', '', %s, e.id, %s,"  # noqa: S608
        f" (t.overlap_policy <> %s OR t.max_concurrency IS NOT NULL) FROM {table} e"
        f" JOIN {task_table} t ON t.id = e.task_id"
        f" WHERE e.id = %s AND e.status IN (%s, %s) AND t.status <> %s"
    )
    params = [now, S.SCHEDULED, now, "retry", False, OverlapPolicy.ALLOW, execution_id]
    params += [*sorted(RETRYABLE_STATUSES), TaskStatus.DELETED]
    return _insert_now(select_sql, params, actor=actor, detail=f"retry of execution {execution_id}")
