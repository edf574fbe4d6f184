"""The per-minute rollup of finished attempts: pruning, rebuilding, and reading it back.

The rollup rows (:class:`~executions.models.RunRollup`, :class:`~executions.models.TaskRollup`)
are written by the execution table's status trigger (executions/triggers.py), in the transaction
of the status change they count, so no Python on the hot path writes them and they are correct
whichever process ends an attempt: a worker, a callback, a user's cancel, or the worker that
resumed a run after the first one died. An attempt is counted exactly once because the write
that ends it is a conditional UPDATE that wins once and terminal states are final; a worker
that dies mid-run has counted nothing (its run is still RUNNING), and its execution is counted
when some process brings it to an end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.utils.dateparse import parse_datetime

from executions.histogram import BUCKETS, EDGES
from executions.models import (
    DURATION_COLUMNS,
    LATENESS_COLUMNS,
    OUTCOME_COLUMNS,
    ROLLUP_SHARDS,
    Execution,
    RunRollup,
    TaskRollup,
)
from tasks_app.models import Task
from tms_core.clock import db_now
from tms_core.conf import tms_settings

#: Every counter column of RunRollup, in a fixed order.
COUNTER_COLUMNS: tuple[str, ...] = (*OUTCOME_COLUMNS.values(), *LATENESS_COLUMNS, *DURATION_COLUMNS)


def floor_minute(when: datetime) -> datetime:
    return when.replace(second=0, microsecond=0)


def floor_hour(when: datetime) -> datetime:
    return when.replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class RollupSeries:
    """Rollup counters over a window, summed over owners and shards: per minute, the runs by
    outcome (in :data:`OUTCOME_COLUMNS` order) and the lateness histogram; per runner, the
    duration histogram."""

    by_minute: dict[datetime, tuple[tuple[int, ...], tuple[int, ...]]]
    duration_by_runner: dict[str, tuple[int, ...]]


def _as_utc(value: datetime | str) -> datetime:
    # PostgreSQL hands back aware datetimes; SQLite the text Django stored (UTC).
    if isinstance(value, str):
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError(f"not a date-time: {value!r}")
        value = parsed
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def rollup_series(*, since: datetime, until: datetime, owner_id: int | None) -> RollupSeries:
    """Read the window ``since <= minute <= until`` (``owner_id`` narrows it to one owner) in one
    statement: one row per minute and one per runner, summed by the database, so the work in
    Python stays at one small row per minute whatever the volume."""
    outcomes, lateness = list(OUTCOME_COLUMNS.values()), list(LATENESS_COLUMNS)
    durations = list(DURATION_COLUMNS)
    prep = RunRollup._meta.get_field("minute").get_db_prep_value
    where = "minute >= %s AND minute <= %s" + ("" if owner_id is None else " AND owner_id = %s")
    params = [prep(since, connection), prep(until, connection)] + ([] if owner_id is None else [owner_id])
    table = RunRollup._meta.db_table
    # Each grouping sums only the columns it is read for (outcomes and lateness by minute, duration
    # by runner): a GROUPING SETS over every column summed all of them twice, 45 sums per row and
    # set, most of the statement's CPU at a day of 1,000,000 runs.
    per_minute = ", ".join(f"SUM({c})" for c in outcomes + lateness)
    per_runner = ", ".join(f"SUM({c})" for c in durations)
    by_minute_sql = f"SELECT 1, minute, NULL, {per_minute} FROM {table} WHERE {where} GROUP BY minute"  # noqa: S608
    pad = ", ".join(["NULL"] * (len(outcomes) + len(lateness) - len(durations)))
    by_runner_sql = (
        f"SELECT 0, NULL, runner, {per_runner}{', ' + pad if pad else ''} FROM {table} "  # noqa: S608
        f"WHERE {where} GROUP BY runner"
    )
    sql = f"{by_minute_sql} UNION ALL {by_runner_sql}"
    by_minute: dict[datetime, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    by_runner: dict[str, tuple[int, ...]] = {}
    split, width = 3 + len(outcomes), 3 + len(outcomes) + len(lateness)
    with connection.cursor() as cursor:
        cursor.execute(sql, params + params)
        for row in cursor.fetchall():
            if row[0]:
                # SUM of an integer column is a bigint: Python ints already, no conversion per value.
                by_minute[_as_utc(row[1])] = (tuple(row[3:split]), tuple(row[split:width]))
            else:
                by_runner[row[2]] = tuple(row[3 : 3 + len(durations)])
    return RollupSeries(by_minute, by_runner)


def rollup_compact(*, older_than: float = 120.0) -> int:
    """Fold the shards of every minute that ended ``older_than`` seconds ago into shard 0.

    Shards keep a herd of finishes off one row lock while the minute is current; afterwards
    they only multiply what the dashboard reads (by up to ``ROLLUP_SHARDS``). On PostgreSQL the
    fold is one statement (``DELETE … RETURNING`` feeding an upsert), so a finish counted
    concurrently into a folded shard is never lost: it lands in a new row, folded next time.
    Returns the number of shard rows folded. Beat runs it every minute.
    """
    table = RunRollup._meta.db_table
    columns = ", ".join(COUNTER_COLUMNS)
    sums = ", ".join(f"SUM({c})" for c in COUNTER_COLUMNS)
    add = ", ".join(f"{c} = {table}.{c} + EXCLUDED.{c}" for c in COUNTER_COLUMNS)
    prep = RunRollup._meta.get_field("minute").get_db_prep_value
    cutoff = prep(floor_minute(db_now() - timedelta(seconds=older_than)), connection)
    upsert = (
        f"INSERT INTO {table} (minute, owner_id, runner, shard, {columns}) "  # noqa: S608 - names are ours
        "SELECT minute, owner_id, runner, 0, {sums} FROM {source} WHERE {where} GROUP BY minute, owner_id, runner "
        f"ON CONFLICT (minute, owner_id, runner, shard) DO UPDATE SET {add}"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"WITH folded AS (DELETE FROM {table} WHERE shard > 0 AND minute < %s RETURNING *), "  # noqa: S608
                f"merged AS ({upsert.format(sums=sums, source='folded', where='true')}) "
                "SELECT count(*) FROM folded",
                [cutoff],
            )
            return cursor.fetchone()[0]
        # SQLite: one writer at a time, so the two statements see the same rows.
        cursor.execute(upsert.format(sums=sums, source=table, where="shard > 0 AND minute < %s"), [cutoff])
        cursor.execute(f"DELETE FROM {table} WHERE shard > 0 AND minute < %s", [cutoff])  # noqa: S608
        return cursor.rowcount


#: The minute of the carry rows: what minutes past the retention counted, one row per owner and
#: runner, so all-time totals (the counters at /metrics) never go back when minutes are pruned.
#: No window the dashboard reads reaches it.
CARRY_MINUTE = datetime(1970, 1, 1, tzinfo=UTC)


def rollup_prune(*, now: datetime | None = None) -> tuple[int, int]:
    """Fold minute rows older than ``ROLLUP_RETENTION`` into the carry rows (:data:`CARRY_MINUTE`)
    and delete task-hour rows older than ``TASK_ROLLUP_RETENTION``; returns how many of each
    went. Beat runs it hourly."""
    conf = tms_settings()
    now = now or db_now()
    table = RunRollup._meta.db_table
    columns = ", ".join(COUNTER_COLUMNS)
    sums = ", ".join(f"SUM({c})" for c in COUNTER_COLUMNS)
    add = ", ".join(f"{c} = {table}.{c} + EXCLUDED.{c}" for c in COUNTER_COLUMNS)
    prep = RunRollup._meta.get_field("minute").get_db_prep_value
    cutoff = prep(now - timedelta(seconds=conf.ROLLUP_RETENTION), connection)
    carry = prep(CARRY_MINUTE, connection)
    upsert = (
        f"INSERT INTO {table} (minute, owner_id, runner, shard, {columns}) "  # noqa: S608 - names are ours
        "SELECT %s, owner_id, runner, 0, {sums} FROM {source} WHERE {where} GROUP BY owner_id, runner "
        f"ON CONFLICT (minute, owner_id, runner, shard) DO UPDATE SET {add}"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"WITH folded AS (DELETE FROM {table} WHERE minute > %s AND minute < %s RETURNING *), "  # noqa: S608
                f"merged AS ({upsert.format(sums=sums, source='folded', where='true')}) "
                "SELECT count(*) FROM folded",
                [carry, cutoff, carry],
            )
            minutes = cursor.fetchone()[0]
        else:
            old = "minute > %s AND minute < %s"
            cursor.execute(upsert.format(sums=sums, source=table, where=old), [carry, carry, cutoff])
            cursor.execute(f"DELETE FROM {table} WHERE {old}", [carry, cutoff])  # noqa: S608
            minutes = cursor.rowcount
    hours, _ = TaskRollup.objects.filter(hour__lt=now - timedelta(seconds=conf.TASK_ROLLUP_RETENTION)).delete()
    return minutes, hours


def rollup_rebuild(*, since: datetime) -> int:
    """Recount the rollup from ``since`` on from the execution table, in one transaction (PostgreSQL).

    For a fresh install over existing history, or after a restore; also how the benchmark fills
    the rollup for a million executions it inserted directly. It sees what the rows say now:
    executions in a terminal state, by ``finished_at``; attempts that failed and were retried
    left no row of their own, so ``retried`` stays as the trigger counted it (zero for minutes
    it never saw), and a task's hours count final failures only. ``since`` is taken to the
    start of its hour. Scans the executions finished since then: an operator's tool, never
    part of a page view. Returns the number of executions counted.
    """
    since = floor_hour(since)
    if connection.vendor != "postgresql":
        raise NotImplementedError("rollup_rebuild runs on PostgreSQL; the embedded default counts from install on")
    execution, task = Execution._meta.db_table, Task._meta.db_table
    runs, tasks = RunRollup._meta.db_table, TaskRollup._meta.db_table
    edges = "'{" + ",".join(repr(e) for e in EDGES) + "}'::float8[]"
    # Whether the last attempt ran: a cancelled row may carry a previous attempt's started_at
    # (cancelled while SCHEDULED for a retry, due after that start); a claim is never before due.
    ran = "e.started_at IS NOT NULL AND (e.status <> 'CANCELLED' OR e.started_at >= e.due_at)"
    counters = []
    for status, column in OUTCOME_COLUMNS.items():
        counters.append(f"count(*) FILTER (WHERE e.status = '{status}') AS {column}")
    for prefix, expression in (
        ("lateness", "e.started_at - e.due_at"),
        ("duration", "e.finished_at - e.started_at"),
    ):
        bucket = f"width_bucket(extract(epoch FROM {expression})::float8, {edges})"
        counters += [f"count(*) FILTER (WHERE {ran} AND {bucket} = {i}) AS {prefix}_{i:02d}" for i in range(BUCKETS)]
    finished = (
        f"FROM {execution} e JOIN {task} t ON t.id = e.task_id"
        " WHERE e.finished_at >= %(since)s AND e.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND NOT e.superseded"
    )
    retried_keep = (
        f"SELECT minute, owner_id, runner, shard, retried FROM {runs} WHERE minute >= date_trunc('minute', %(since)s)"  # noqa: S608
    )
    with transaction.atomic(), connection.cursor() as cursor:
        # Keep the retried counts the trigger made (no other record of them survives).
        cursor.execute(f"CREATE TEMP TABLE tms_rollup_retried ON COMMIT DROP AS {retried_keep}", {"since": since})
        cursor.execute(f"DELETE FROM {runs} WHERE minute >= date_trunc('minute', %(since)s)", {"since": since})  # noqa: S608
        cursor.execute(f"DELETE FROM {tasks} WHERE hour >= date_trunc('hour', %(since)s)", {"since": since})  # noqa: S608
        columns = ", ".join(COUNTER_COLUMNS)
        cursor.execute(
            f"INSERT INTO {runs} (minute, owner_id, runner, shard, {columns}) "
            f"SELECT date_trunc('minute', e.finished_at, 'UTC'), t.owner_id, t.runner, (e.id %% {ROLLUP_SHARDS}),"
            f" {', '.join(counters)} {finished} GROUP BY 1, 2, 3, 4",
            {"since": since},
        )
        cursor.execute(
            f"INSERT INTO {runs} AS r (minute, owner_id, runner, shard, retried) "  # noqa: S608
            "SELECT minute, owner_id, runner, shard, retried FROM tms_rollup_retried WHERE retried > 0 "
            "ON CONFLICT (minute, owner_id, runner, shard) DO UPDATE SET retried = EXCLUDED.retried"
        )
        cursor.execute(
            f"INSERT INTO {tasks} (hour, task_id, owner_id, attempts, failures) "
            "SELECT date_trunc('hour', e.finished_at, 'UTC'), e.task_id, t.owner_id, count(*),"
            f" count(*) FILTER (WHERE e.status = 'FAILED') {finished} GROUP BY 1, 2, 3",
            {"since": since},
        )
        cursor.execute(f"SELECT count(*) {finished}", {"since": since})
        return cursor.fetchone()[0]
