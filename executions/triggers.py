"""The status trigger: what the database writes, in the transaction of a status change, for the
executions whose status a statement changed.

One trigger on the execution table does it all, so that a status write (which only
:mod:`executions.transitions` makes) pays for one trigger call whatever listens to it. On
PostgreSQL it is a statement-level ``AFTER UPDATE`` trigger over the statement's transition tables:
it joins the old and new rows once, into the relation ``changed`` (the rows whose status changed,
superseded rows excepted: those never ran), and each *part* writes from that relation in one
set-based statement. PostgreSQL refuses a column list (``UPDATE OF status``) beside transition
tables, so it is called after every UPDATE of the table: a statement that leaves no row in a
status some part may write for (the monitor's take) returns after a look at its new rows; one
that changes no status joins its rows, finds none, and writes nothing.

A part writes its rows in a stable order (its rows' key, or the execution id): two statements
that end runs at the same time then lock the rows they share (a minute's rollup row) in the same
order, and wait for each other instead of deadlocking. So a worker's several-row success needs no
lock of its own (executions.transitions.worker.executions_succeed).

The parts come from the apps that listen, this one's (:data:`ROLLUP`, the per-minute and per-task
counts of finished attempts) and those of apps above it (notifications' outbox): this module
knows none of them but its own, and the app highest in the layers that contributes a part
installs the trigger from all of them (notifications.triggers, notifications' migration 0007).
A migration of this app that changes its own part installs the trigger again with the parts the
apps above registered when Django started (:func:`register_part`, :func:`status_parts`; migration
0029), still without importing them.
Status names come from :class:`~executions.models.ExecutionStatus`, never typed here. The SQL is
built from this module when a migration installs it: a change here needs a new migration that
installs it again (the install statements replace what is there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from executions.histogram import EDGES
from executions.models import (
    COUNTER_COLUMNS,
    DURATION_COLUMNS,
    LATENESS_COLUMNS,
    MAX_COLUMNS,
    MERGED_COLUMNS,
    MIN_COLUMNS,
    OUTCOME_COLUMNS,
    ROLLUP_SHARDS,
    TERMINAL_STATUSES,
    Execution,
    ExecutionStatus,
    RunRollup,
    TaskRollup,
)
from tasks_app.models import Task

S = ExecutionStatus
EXECUTION = Execution._meta.db_table
NAME = "tms_status_changed"

#: The columns of ``changed``: the new row's, and (``old_`` prefixed) what the statement changed.
_NEW = (
    *("id", "task_id", "owner_id", "status", "attempt", "due_at", "started_at", "finished_at", "error"),
    "workflow_run",  # the outbox's part for workflow steps (notifications.triggers)
    "team_id",  # the outbox's part: a team's rules speak for the team's runs
)
_OLD = ("status", "attempt", "due_at", "started_at")


def literal(value: str) -> str:
    """``value`` as an SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def among(expression: str, values: Iterable[str]) -> str:
    """The SQL test that ``expression`` is one of ``values`` (literals, in a stable order)."""
    return f"{expression} IN ({', '.join(literal(v) for v in sorted(values))})"


#: When a status part's rows are written (the statement's time, as ``now()`` is the transaction's).
NOW = "statement_timestamp()"


def seconds(later: str, earlier: str) -> str:
    """The seconds from ``earlier`` to ``later`` (two timestamps), as a float."""
    return f"extract(epoch FROM {later} - {earlier})::float8"


def exceeds(later: str, earlier: str, duration: str) -> str:
    """``later - earlier > duration`` for a duration (interval) column."""
    return f"({later} - {earlier}) > {duration}"


def bucket(seconds: str) -> str:
    """The histogram bucket (executions.histogram) of ``seconds``."""
    return f"width_bucket({seconds}, '{{{','.join(repr(e) for e in EDGES)}}}'::float8[])"


def truncate(unit: str, when: str) -> str:
    """``when`` down to its ``unit`` ('minute' or 'hour'), in UTC."""
    return f"date_trunc({literal(unit)}, {when}, 'UTC')"


def flag(test: str) -> str:
    """1 if ``test`` holds, else 0."""
    return f"({test})::int"


def extreme(function: str, a: str, b: str) -> str:
    """The smaller (``function`` 'min') or larger ('max') of ``a`` and ``b``, either NULL for
    none (LEAST and GREATEST skip NULLs)."""
    return f"{'least' if function == 'min' else 'greatest'}({a}, {b})"


@dataclass(frozen=True)
class StatusPart:
    """What one listener writes for the rows of ``changed``: ``statements()`` gives its INSERTs,
    each reading ``changed`` where it says ``{changed}`` and writing in a stable order.
    ``targets``: the new statuses it may write anything for (a statement that moves no row to one
    of any part's targets, the monitor's take, returns before the join)."""

    name: str
    targets: frozenset[str]
    statements: Callable[[], Sequence[str]]


def _add_on_conflict(table: str, columns: Iterable[str]) -> str:
    return ", ".join(f"{c} = {table}.{c} + EXCLUDED.{c}" for c in columns)


def merged_aggregates() -> str:
    """The aggregates of ``MERGED_COLUMNS`` over rows merged into one, in that order."""
    return ", ".join(
        [f"SUM({c})" for c in COUNTER_COLUMNS] + [f"MIN({c})" for c in MIN_COLUMNS] + [f"MAX({c})" for c in MAX_COLUMNS]
    )


def merged_set(table: str) -> str:
    """An upsert's SET merging the new values of ``MERGED_COLUMNS`` into ``table``'s row: the
    counters added, the extremes widened (the smallest of the ``*_min``, the largest of the ``*_max``)."""
    widened = [f"{c} = {extreme('min', f'{table}.{c}', f'EXCLUDED.{c}')}" for c in MIN_COLUMNS]
    widened += [f"{c} = {extreme('max', f'{table}.{c}', f'EXCLUDED.{c}')}" for c in MAX_COLUMNS]
    return ", ".join([_add_on_conflict(table, COUNTER_COLUMNS), *widened])


def _rollup() -> list[str]:
    """The rollup's two upserts (executions.rollup reads them back). Counted: an execution
    reaching a terminal status, and a failed attempt going back to SCHEDULED for its retry (its
    outcome RETRIED); lateness and duration only of an attempt that ran (left RUNNING: a retry
    cancelled while SCHEDULED still carries the previous attempt's start). An attempt lands in
    the minute of the statement that ends it (its ``finished_at`` is set by that statement):
    the dashboard keeps minutes :data:`executions.rollup.SETTLE` old between renders on that.

    The rows are kept by the execution's team (``team_id``, since migration 0029). The shard of a
    minute's row is the writing transaction's (its id, since migration 0030): all the runs one
    transaction ends go in one row, and concurrent transactions (whose ids follow each other) in
    different ones. With a shard per run, as before, a statement that ended a chunk of runs took
    every shard row of its minute, and a worker that ends workflow steps held them to the commit
    of the transaction that also creates the next steps: the other workers' ends queued behind it.

    Each row also keeps its smallest and largest lateness and duration (the columns of
    ``MIN_COLUMNS`` and ``MAX_COLUMNS``, since migration 0031), which bound the percentiles read
    off its histograms. A task's hour is sharded the same way (since migration 0039): the items
    of a workflow's map step are runs of one task, and the workers' transactions that end them
    (each also starting what follows) took turns on that task's hour row until they committed.
    The earlier forms, which going back through those migrations installs, are frozen in
    migrations 0029 and 0039."""
    retried = f"c.old_status = {literal(S.RUNNING)} AND c.status = {literal(S.SCHEDULED)}"
    counted = f"({among('c.status', TERMINAL_STATUSES)} OR ({retried}))"
    ended = f"CASE WHEN c.status = {literal(S.SCHEDULED)} THEN {NOW} ELSE coalesce(c.finished_at, {NOW}) END"
    outcome = f"CASE WHEN c.status = {literal(S.SCHEDULED)} THEN {literal('RETRIED')} ELSE c.status END"
    ran = f"c.old_status = {literal(S.RUNNING)} AND c.old_started_at IS NOT NULL"
    late_s = seconds("c.old_started_at", "c.old_due_at")
    took_s = seconds("c.ended", "c.old_started_at")
    # Three steps: the buckets need the end time, and the seconds are kept for the extremes.
    rows = (
        f"(SELECT s.*, CASE WHEN s.late_s IS NULL THEN -1 ELSE {bucket('s.late_s')} END AS late,"  # noqa: S608
        f" CASE WHEN s.took_s IS NULL THEN -1 ELSE {bucket('s.took_s')} END AS took"
        f" FROM (SELECT c.*, CASE WHEN {ran} THEN {late_s} END AS late_s, CASE WHEN {ran} THEN {took_s} END AS took_s"
        f" FROM (SELECT c.*, {ended} AS ended, {outcome} AS outcome FROM {{changed}} c WHERE {counted}) c) s) r"
    )
    counters = [f"sum({flag(f'r.outcome = {literal(status)}')})" for status in OUTCOME_COLUMNS]
    for variable, columns in (("late", LATENESS_COLUMNS), ("took", DURATION_COLUMNS)):
        counters += [f"sum({flag(f'r.{variable} = {i}')})" for i in range(len(columns))]
    # The extremes, in MIN_COLUMNS then MAX_COLUMNS order (lateness, duration).
    runs, tasks, task = RunRollup._meta.db_table, TaskRollup._meta.db_table, Task._meta.db_table
    counters += ["min(r.late_s)", "min(r.took_s)", "max(r.late_s)", "max(r.took_s)"]
    shard = f"(txid_current() % {ROLLUP_SHARDS})::smallint"
    failed = among("r.outcome", (S.FAILED, "RETRIED"))
    # The team is the execution's own column (its task's, copied when it was made or moved): no
    # lookup per row; the runner is the task's. Each upsert in its key's order (see the module's
    # docstring).
    return [
        f"INSERT INTO {runs} (minute, team_id, runner, shard, {', '.join(MERGED_COLUMNS)})"  # noqa: S608 - our names
        f" SELECT {truncate('minute', 'r.ended')}, r.team_id, t.runner, {shard}, {', '.join(counters)}"
        f" FROM {rows} JOIN {task} t ON t.id = r.task_id GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
        f" ON CONFLICT (minute, team_id, runner, shard) DO UPDATE SET {merged_set(runs)}",
        f"INSERT INTO {tasks} (hour, task_id, team_id, shard, attempts, failures)"  # noqa: S608 - our names
        f" SELECT {truncate('hour', 'r.ended')}, r.task_id, r.team_id, {shard}, count(*), sum({flag(failed)})"
        f" FROM {rows} GROUP BY 1, 2, 3, 4 ORDER BY 2, 1, 4"
        f" ON CONFLICT (task_id, hour, shard) DO UPDATE SET {_add_on_conflict(tasks, ('attempts', 'failures'))}",
    ]


#: This app's part: the per-minute and per-task rollups of finished attempts, by team, with the
#: extremes of their histograms.
ROLLUP = StatusPart("rollup", frozenset({*TERMINAL_STATUSES, S.SCHEDULED}), _rollup)


#: The parts of the apps above this one (notifications' outbox), each registered by its app when
#: Django starts (its ``AppConfig.ready``), in the order they write after this app's own.
_ABOVE: list[StatusPart] = []


def register_part(part: StatusPart) -> None:
    """Have this app's migrations install ``part`` beside the rollup when they install the status
    trigger again (call from ``AppConfig.ready``; registering a part of the same name again
    replaces it)."""
    for i, known in enumerate(_ABOVE):
        if known.name == part.name:
            _ABOVE[i] = part
            return
    _ABOVE.append(part)


def status_parts(rollup: StatusPart = ROLLUP) -> tuple[StatusPart, ...]:
    """Every part of the status trigger: ``rollup`` (this app's, by default the current one), then
    the parts the apps above registered."""
    return (rollup, *_ABOVE)


def _statements(parts: Sequence[StatusPart], changed: str) -> list[str]:
    return [statement.replace("{changed}", changed) for part in parts for statement in part.statements()]


def install(parts: Sequence[StatusPart]) -> str:
    """The function and statement-level trigger that run ``parts``: one statement,
    ``changed`` computed once and each part's INSERTs a data-modifying CTE of it (the last the
    main statement)."""
    columns = ", ".join([*(f"n.{c}" for c in _NEW), *(f"o.{c} AS old_{c}" for c in _OLD)])
    changed = (
        f"changed AS (SELECT {columns} FROM tms_new n JOIN tms_old o ON o.id = n.id"  # noqa: S608 - our names
        " WHERE o.status IS DISTINCT FROM n.status AND NOT n.superseded)"
    )
    *ctes, main = _statements(parts, "changed")
    with_ = ", ".join([changed, *(f"part_{i} AS ({sql})" for i, sql in enumerate(ctes))])
    targets = among("status", {status for part in parts for status in part.targets})
    return f"""
CREATE OR REPLACE FUNCTION {NAME}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tms_new WHERE {targets}) THEN
        RETURN NULL;
    END IF;
    WITH {with_}
    {main};
    RETURN NULL;
END
$fn$;
CREATE OR REPLACE TRIGGER {NAME} AFTER UPDATE ON {EXECUTION}
REFERENCING OLD TABLE AS tms_old NEW TABLE AS tms_new
FOR EACH STATEMENT EXECUTE FUNCTION {NAME}();
"""  # noqa: S608 - our names


UNINSTALL = f"DROP TRIGGER IF EXISTS {NAME} ON {EXECUTION}; DROP FUNCTION IF EXISTS {NAME}();"
