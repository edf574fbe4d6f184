"""The per-minute rollup of finished attempts: pruning, rebuilding, and reading it back.

The rollup rows (:class:`~executions.models.RunRollup`, :class:`~executions.models.TaskRollup`)
are written by a database trigger on the execution table (migration 0006), in the transaction
of the status change they count, so no Python on the hot path writes them and they are correct
whichever process ends an attempt: a worker, a callback, a user's cancel, or the worker that
resumed a run after the first one died. An attempt is counted exactly once because the write
that ends it is a conditional UPDATE that wins once and terminal states are final; a worker
that dies mid-run has counted nothing (its run is still RUNNING), and its execution is counted
when some process brings it to an end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import Sum

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
class RollupTotals:
    """Summed counters of some rollup rows: counts by outcome and the two histograms."""

    outcomes: dict[str, int]
    lateness: tuple[int, ...]
    duration: tuple[int, ...]

    @classmethod
    def from_row(cls, row: dict[str, int | None]) -> RollupTotals:
        return cls(
            outcomes={status: int(row[column] or 0) for status, column in OUTCOME_COLUMNS.items()},
            lateness=tuple(int(row[c] or 0) for c in LATENESS_COLUMNS),
            duration=tuple(int(row[c] or 0) for c in DURATION_COLUMNS),
        )


def add_counts(first: Sequence[int], second: Sequence[int]) -> tuple[int, ...]:
    return tuple(a + b for a, b in zip(first, second, strict=True))


def rollup_by_minute_and_runner(*, since: datetime, until: datetime, owner_id: int | None) -> Iterable[dict]:
    """Rollup counters summed over owners and shards, one row per (minute, runner) with
    ``since <= minute <= until`` (``owner_id`` narrows to one owner). One query on the
    (minute, …) key."""
    rows = RunRollup.objects.filter(minute__gte=since, minute__lte=until)
    if owner_id is not None:
        rows = rows.filter(owner_id=owner_id)
    return rows.order_by().values("minute", "runner").annotate(**{c: Sum(c) for c in COUNTER_COLUMNS})


def rollup_prune(*, now: datetime | None = None) -> tuple[int, int]:
    """Delete minute rows older than ``ROLLUP_RETENTION`` and task-hour rows older than
    ``TASK_ROLLUP_RETENTION``; returns how many of each went. Beat runs it hourly."""
    conf = tms_settings()
    now = now or db_now()
    minutes, _ = RunRollup.objects.filter(minute__lt=now - timedelta(seconds=conf.ROLLUP_RETENTION)).delete()
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
