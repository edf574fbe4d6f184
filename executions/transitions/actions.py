"""What users and the platform do to executions: cancel (``SCHEDULED | PENDING | RUNNING →
CANCELLED``), trigger a run now and retry a failed one (new SCHEDULED executions)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Now

from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.transitions import states
from executions.transitions.create import stamp_trace
from executions.transitions.sql import EXECUTIONS, Event, key_share, with_events, write
from tasks_app.models import OverlapPolicy, Task, TaskStatus
from tms_core.clock import db_now


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
    sources = states.CANCEL.sources
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
        condition = Q(pk=execution_id, attempt=row["attempt"])
        if supersede:
            condition &= Q(started_at__isnull=True)
        won = write(
            states.CANCEL,
            condition,
            {
                "finished_at": Now(),
                "lease_owner": "",
                "lease_expires_at": None,
                "next_poll_at": None,
                "error": reason[:1000],
                "superseded": supersede,
            },
            actor=actor,
            detail=reason,
            source=row["status"],
        )
        if not won:  # pragma: no cover - the row lock makes this unreachable
            return CancelOutcome(False, row["status"])
    return CancelOutcome(True, row["status"], row["external_run_id"], row["run_handle"], row["attempt"])


#: The columns a run created on request sets; the others take their database defaults.
_COLUMNS = (
    "task_id, scheduled_for, due_at, priority, exclusive, origin, status, attempt, retry_of_id,"
    " lease_owner, external_run_id, run_handle, message_id, output, error, owner_id, team_id, workflow_run, upstream,"
    " input, config_override, replay_of_id"
)
#: Whether a run of task ``t`` is exclusive (see ``Execution.exclusive``).
_EXCLUSIVE = "(t.overlap_policy <> %s OR t.max_concurrency IS NOT NULL OR t.has_limits)"


def _insert_now(
    select_sql: str, params: list[object], *, actor: str, detail: str, columns: str = _COLUMNS
) -> int | None:
    """Run ``INSERT INTO execution (…) SELECT …`` for one SCHEDULED row due now, with its event.

    The SELECT carries the conditions (it yields no row when they do not hold) and the unique
    constraints decide races (``ON CONFLICT DO NOTHING``); it locks the task's row as a foreign
    key's check would (:func:`~executions.transitions.sql.key_share`). Returns the new id, or None if lost.
    """
    statement = f"INSERT INTO {EXECUTIONS} ({columns}) {select_sql} ON CONFLICT DO NOTHING"
    rows = with_events(statement, params, Event("", S.SCHEDULED, actor, detail))
    if rows:
        stamp_trace([rows[0][0]])
    return rows[0][0] if rows else None


def _now_param(delay: timedelta | None = None) -> object:
    when = db_now() if delay is None else db_now() + delay
    return Execution._meta.get_field("scheduled_for").get_db_prep_value(when, connection)


def _json_param(value: object) -> object:
    return Execution._meta.get_field("input").get_db_prep_value(value, connection)


def execution_trigger(
    *,
    task_id: object,
    actor: str,
    detail: str = "",
    delay: timedelta | None = None,
    run_input: Mapping[str, object] | None = None,
) -> int | None:
    """Create a SCHEDULED execution of a live (not DELETED) task, due now (or ``delay`` from now:
    a debounced trigger), outside its schedule, given ``run_input`` (its ``input``; checked by the
    caller).

    Returns its id, or None if the task is gone or deleted (or, vanishingly rarely, an
    occurrence of the task exists at this very microsecond).
    """
    now = _now_param(delay)
    task_pk = Task._meta.pk.get_db_prep_value(task_id, connection)
    select_sql = (
        f"SELECT t.id, %s, %s, t.priority, {_EXCLUSIVE}, %s, %s, 1, NULL, '', '', '{{}}', '', '', '', t.owner_id,"  # noqa: S608
        " t.team_id, NULL, NULL, %s, NULL, NULL"
        f" FROM {Task._meta.db_table} t WHERE t.id = %s AND t.status <> %s{key_share('t')}"
    )
    params = [now, now, OverlapPolicy.ALLOW, "trigger", S.SCHEDULED]
    params += [None if run_input is None else _json_param(dict(run_input)), task_pk, TaskStatus.DELETED]
    return _insert_now(select_sql, params, actor=actor, detail=detail or "triggered: run now")


def execution_join_trigger(*, execution_id: int, run_input: Mapping[str, object] | None) -> bool:
    """A later debounced trigger joins a triggered run that still waits for its due time: the run
    takes that trigger's input (the last trigger's input wins; None clears it). Conditional on the
    run being still SCHEDULED and not yet due (a monitor may take it meanwhile); returns whether
    it won (if not, the trigger needs a run of its own)."""
    value = None if run_input is None else dict(run_input)
    return bool(
        Execution.objects.filter(pk=execution_id, origin="trigger", status=S.SCHEDULED, due_at__gt=Now()).update(
            input=value
        )
    )


#: The statuses an execution must have to be run again by :func:`execution_retry`.
RETRYABLE_STATUSES: frozenset[str] = frozenset({S.FAILED, S.CANCELLED})


def execution_retry(*, execution_id: int, actor: str, run_input: Mapping[str, object] | None = None) -> int | None:
    """Run a FAILED or CANCELLED execution again: a new SCHEDULED execution of the same task, due
    now, with ``retry_of`` = the old one and attempt = its attempt + 1. The old row stays terminal.
    A workflow step's retry stays in its workflow run, with the same upstream and input: when it
    ends, what follows it runs as after the first end (the steps that already ran are not run
    again: a task runs once per workflow run, retries aside).

    Conditional on the old execution being FAILED or CANCELLED and its task not DELETED; the
    unique ``retry_of`` makes a second retry of the same execution lose. Returns the new id, or
    None if it lost. ``run_input`` replaces the old run's input (a workflow run's retry with an
    edited input); None keeps it.
    """
    now = _now_param()
    given_input = "e.input" if run_input is None else "%s"
    select_sql = (
        f"SELECT e.task_id, %s, %s, t.priority, {_EXCLUSIVE}, %s, %s, e.attempt + 1, e.id,"  # noqa: S608
        f" '', '', '{{}}', '', '', '', t.owner_id, t.team_id, e.workflow_run, e.upstream, {given_input},"
        " e.config_override, NULL, e.map_index"
        f" FROM {EXECUTIONS} e JOIN {Task._meta.db_table} t ON t.id = e.task_id"
        f" WHERE e.id = %s AND e.status IN (%s, %s) AND t.status <> %s{key_share('t')}"
    )
    params: list[object] = [now, now, OverlapPolicy.ALLOW, "retry", S.SCHEDULED]
    if run_input is not None:
        params.append(_json_param(dict(run_input)))
    params.append(execution_id)
    params += [*sorted(RETRYABLE_STATUSES), TaskStatus.DELETED]
    # A map step's item stays the same item (its index) when retried.
    return _insert_now(
        select_sql, params, actor=actor, detail=f"retry of execution {execution_id}", columns=_COLUMNS + ", map_index"
    )


@dataclass(frozen=True)
class Replay:
    """One execution to run again by a replay, and what its new run is given."""

    execution_id: int
    #: The new run's input; None keeps the replayed execution's.
    run_input: Mapping[str, object] | None = None
    #: The new run's config (stored form, secrets sealed); None keeps the replayed execution's
    #: (its own override, or its task's config).
    config_override: Mapping[str, object] | None = None


def executions_replay(*, replays: Sequence[Replay], actor: str) -> list[int | None]:
    """Run executions again: for each, a new SCHEDULED execution of the same task, due now,
    attempt 1, ``origin`` replay, ``replay_of`` = the old one, with the old one's input and
    config unless the replay gives others. Its own run: not in a workflow run (when it ends, what
    follows its task starts from it, as from a root). The old rows are left as they are.

    Conditional on each task not being DELETED: returns the new ids in order, None for each one
    lost (the caller rolls back or keeps the others). Each new run's ``scheduled_for`` is now plus
    its place in ``replays`` in microseconds, so that several runs of one task stay distinct
    occurrences (unique on task and time)."""
    base = db_now()
    created: list[int | None] = []
    field = Execution._meta.get_field("scheduled_for")
    for place, replay in enumerate(replays):
        when = field.get_db_prep_value(base + timedelta(microseconds=place), connection)
        given_input = "e.input" if replay.run_input is None else "%s"
        given_config = "e.config_override" if replay.config_override is None else "%s"
        select_sql = (
            f"SELECT e.task_id, %s, %s, t.priority, {_EXCLUSIVE}, %s, %s, 1, NULL,"  # noqa: S608
            f" '', '', '{{}}', '', '', '', t.owner_id, t.team_id, NULL, NULL, {given_input}, {given_config}, e.id"
            f" FROM {EXECUTIONS} e JOIN {Task._meta.db_table} t ON t.id = e.task_id"
            f" WHERE e.id = %s AND t.status <> %s{key_share('t')}"
        )
        params: list[object] = [when, _now_param(), OverlapPolicy.ALLOW, "replay", S.SCHEDULED]
        if replay.run_input is not None:
            params.append(_json_param(dict(replay.run_input)))
        if replay.config_override is not None:
            params.append(_json_param(dict(replay.config_override)))
        params += [replay.execution_id, TaskStatus.DELETED]
        created.append(
            _insert_now(select_sql, params, actor=actor, detail=f"replay of execution {replay.execution_id}")
        )
    return created
