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

import hashlib
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.cache import caches
from django.db import connection, transaction

from executions.histogram import BUCKETS, EDGES, Extremes, widen
from executions.models import (
    COUNTER_COLUMNS,
    DURATION_COLUMNS,
    LATENESS_COLUMNS,
    MERGED_COLUMNS,
    OUTCOME_COLUMNS,
    ROLLUP_SHARDS,
    Execution,
    RollupEpoch,
    RunRollup,
    TaskRollup,
)
from executions.triggers import merged_aggregates, merged_set
from tasks_app.models import Task
from tms_core.clock import db_now
from tms_core.conf import tms_settings


def floor_minute(when: datetime) -> datetime:
    return when.replace(second=0, microsecond=0)


def floor_hour(when: datetime) -> datetime:
    return when.replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Teams:
    """Whose rollup rows a read sums: the teams ``ids`` (a user's: read by the caller, once per
    render, so a change of membership is seen at the next one). Where a read takes ``None``
    instead, every team's rows (staff)."""

    ids: tuple[int, ...] = ()

    def where(self, column: str = "team_id") -> tuple[str, list[Any]]:
        """The SQL test that ``column`` holds one of these teams, and its parameters."""
        if not self.ids:
            return "1 = 0", []
        return f"{column} IN ({', '.join(['%s'] * len(self.ids))})", list(self.ids)


def _scope_key(teams: Teams | None) -> str:
    """The cache's name for the rows ``teams`` reads: 'all', or the team ids (a digest of them
    when many). Never a user: the figures kept are a set of teams', whoever asks for them."""
    if teams is None:
        return "all"
    text = ",".join(str(pk) for pk in sorted(set(teams.ids)))
    return f"t{text}" if len(text) <= 100 else "h" + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class RollupSeries:
    """Rollup counters over a window, summed over teams and shards: per minute, the runs by
    outcome (in :data:`OUTCOME_COLUMNS` order) and the lateness histogram; per runner, the
    duration histogram; and the extremes of each histogram's values (the smallest and largest
    observed, (None, None) where no row of it kept them), which bound its percentiles."""

    by_minute: dict[datetime, tuple[tuple[int, ...], tuple[int, ...]]]
    duration_by_runner: dict[str, tuple[int, ...]]
    lateness_extremes: dict[datetime, Extremes] = field(default_factory=dict)
    duration_extremes: dict[str, Extremes] = field(default_factory=dict)


def _series_sql(where: str) -> str:
    """One statement over the rows matching ``where``: one row per minute (outcomes and lateness
    summed) and one per runner (durations summed), told apart by the first column."""
    outcomes, lateness, durations = list(OUTCOME_COLUMNS.values()), list(LATENESS_COLUMNS), list(DURATION_COLUMNS)
    table = RunRollup._meta.db_table
    # Each grouping sums only the columns it is read for (outcomes and lateness by minute, duration
    # by runner): a GROUPING SETS over every column summed all of them twice, 45 sums per row and
    # set, most of the statement's CPU at a day of 1,000,000 runs.
    # The last two columns: the extremes of the histogram the row sums.
    per_minute = ", ".join([f"SUM({c})" for c in outcomes + lateness] + ["MIN(lateness_min)", "MAX(lateness_max)"])
    per_runner = ", ".join(f"SUM({c})" for c in durations)
    by_minute_sql = f"SELECT 1, minute, NULL, {per_minute} FROM {table} WHERE {where} GROUP BY minute"  # noqa: S608
    pad = ", ".join(["NULL"] * (len(outcomes) + len(lateness) - len(durations)))
    by_runner_sql = (
        f"SELECT 0, NULL, runner, {per_runner}{', ' + pad if pad else ''}, MIN(duration_min), MAX(duration_max) "  # noqa: S608
        f"FROM {table} WHERE {where} GROUP BY runner"
    )
    return f"{by_minute_sql} UNION ALL {by_runner_sql}"


def _series_rows(rows: Iterable[Sequence[Any]]) -> RollupSeries:
    """The rows of :func:`_series_sql` as a series."""
    outcomes, lateness, durations = len(OUTCOME_COLUMNS), len(LATENESS_COLUMNS), len(DURATION_COLUMNS)
    split, width = 3 + outcomes, 3 + outcomes + lateness
    by_minute: dict[datetime, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    by_runner: dict[str, tuple[int, ...]] = {}
    late: dict[datetime, Extremes] = {}
    took: dict[str, Extremes] = {}
    for row in rows:
        if row[0]:
            # SUM of an integer column is a bigint: Python ints already, no conversion per value.
            minute = row[1]  # aware (UTC): the connection's time zone
            by_minute[minute] = (tuple(row[3:split]), tuple(row[split:width]))
            late[minute] = (row[width], row[width + 1])
        else:
            by_runner[row[2]] = tuple(row[3 : 3 + durations])
            took[row[2]] = (row[width], row[width + 1])
    return RollupSeries(by_minute, by_runner, late, took)


def _window(since: datetime, until: datetime, teams: Teams | None, *, before: bool = False) -> tuple[str, list[Any]]:
    """The test of a window of minutes (``since`` to ``until``, or to just ``before`` it) and of
    ``teams`` (None: every team), and its parameters."""
    prep = RunRollup._meta.get_field("minute").get_db_prep_value
    where = "minute >= %s AND minute " + ("<" if before else "<=") + " %s"
    params = [prep(since, connection), prep(until, connection)]
    if teams is not None:
        test, more = teams.where()
        where, params = f"{where} AND {test}", params + more
    return where, params


def rollup_series(*, since: datetime, until: datetime, teams: Teams | None) -> RollupSeries:
    """Read the window ``since <= minute <= until`` of ``teams`` (None: every team's) in one
    statement: one row per minute and one per runner, summed by the database, so the work in
    Python stays at one small row per minute whatever the volume."""
    where, params = _window(since, until, teams)
    with connection.cursor() as cursor:
        cursor.execute(_series_sql(where), params + params)
        return _series_rows(cursor.fetchall())


#: How long after a minute ends its rollup rows may still change. The status trigger counts an
#: attempt in the minute of its ending statement (``finished_at`` is set by that statement, or the
#: statement's own time for a retry), so rows of a past minute change only when a transaction
#: commits after the minute ended: its statement's time to its commit, which for the short
#: transactions that end attempts is far below this. Minutes older than that are *settled*;
#: anything else that rewrites them (a rebuild, a prune) bumps the epoch (:class:`RollupEpoch`).
SETTLE = timedelta(minutes=5)
_HOUR = timedelta(hours=1)
_MINUTE = timedelta(minutes=1)
#: The cache (settings.CACHES) holding settled hours between renders.
CACHE_ALIAS = "dashboard"


def _bump_epoch(cursor: Any) -> None:
    """Tell every process that settled minutes changed (in the caller's transaction)."""
    table = RollupEpoch._meta.db_table
    cursor.execute(
        f"INSERT INTO {table} (id, epoch) VALUES (1, 1) "  # noqa: S608 - our table name only
        f"ON CONFLICT (id) DO UPDATE SET epoch = {table}.epoch + 1"
    )


def rollup_series_settled(*, since: datetime, until: datetime, teams: Teams | None, now: datetime) -> RollupSeries:
    """:func:`rollup_series`, with the settled part of the window (up to the last whole hour that
    ended :data:`SETTLE` before ``now``, the database's time) kept between calls in the
    ``dashboard`` cache, per set of teams (``None``: all teams) and :class:`RollupEpoch`: what is
    kept is named by the teams it counts, not by a user, so members of the same teams share it.

    Each call reads from the database, in one statement, the live tail (the minutes from that
    hour on: at most about an hour) with the epoch. The settled part is kept whole for the
    window's first minute (it moves on each minute); when that moved, it is rebuilt from whole
    settled hours kept in the cache (read, the ones missing, in one statement) and the minutes
    before the first whole hour (read in one more). The figures are those of
    :func:`rollup_series` over the same window: settled minutes do not change under the same
    epoch, and the tail is read afresh.
    """
    first = floor_hour(since) if since == floor_hour(since) else floor_hour(since) + _HOUR
    end = floor_hour(min(until + _MINUTE, now - SETTLE))
    if end <= first:
        return rollup_series(since=since, until=until, teams=teams)
    where, params = _window(end, until, teams)
    nulls = ", ".join(["NULL"] * (len(OUTCOME_COLUMNS) + len(LATENESS_COLUMNS) + 2 - 1))
    epoch_sql = (
        f"SELECT 2, NULL, NULL, "  # noqa: S608
        f"COALESCE((SELECT epoch FROM {RollupEpoch._meta.db_table} WHERE id = 1), 0), {nulls}"
    )
    with connection.cursor() as cursor:
        cursor.execute(f"{_series_sql(where)} UNION ALL {epoch_sql}", params + params)
        rows = cursor.fetchall()
    epoch = next(row[3] for row in rows if row[0] == 2)
    tail = _series_rows(row for row in rows if row[0] != 2)
    cache = caches[CACHE_ALIAS]
    scope = _scope_key(teams)
    # One entry per scope, overwritten as the window moves: what it holds is named in its value.
    # ("rollup2": the series kept the extremes from executions 0031 on; an older entry is not one.)
    stamp = (epoch, since, end)
    kept = cache.get(f"rollup2:{scope}")
    if kept is not None and kept[0] == stamp:
        settled = kept[1]
    else:
        settled = _settled_part(since, first, end, teams, epoch, scope)
        cache.set(f"rollup2:{scope}", (stamp, settled))
    return RollupSeries(
        settled.by_minute | tail.by_minute,
        _add_runners(settled.duration_by_runner, tail.duration_by_runner),
        settled.lateness_extremes | tail.lateness_extremes,
        _widen_runners(settled.duration_extremes, tail.duration_extremes),
    )


def _add_runners(*parts: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    total: dict[str, tuple[int, ...]] = {}
    for part in parts:
        for runner, counts in part.items():
            have = total.get(runner)
            total[runner] = counts if have is None else tuple(map(operator.add, have, counts))
    return total


def _widen_runners(*parts: dict[str, Extremes]) -> dict[str, Extremes]:
    total: dict[str, Extremes] = {}
    for part in parts:
        for runner, extremes in part.items():
            have = total.get(runner)
            total[runner] = extremes if have is None else widen(have, extremes)
    return total


def _settled_part(
    since: datetime, first: datetime, end: datetime, teams: Teams | None, epoch: int, scope: str
) -> RollupSeries:
    """The window's minutes before ``end``: those before the first whole hour ``first`` read
    here, the whole hours from the cache (one entry per hour, scope and epoch; the missing ones
    read in one statement and kept)."""
    cache = caches[CACHE_ALIAS]
    starts = [first + n * _HOUR for n in range((end - first) // _HOUR)]
    keys = {f"rollup2:{epoch}:{scope}:{hour:%Y%m%d%H}": hour for hour in starts}
    hours = cache.get_many(list(keys))
    missing = [hour for key, hour in keys.items() if key not in hours]
    if missing:
        read = _settled_hours(missing[0], missing[-1] + _HOUR, teams)
        fresh = {key: read.get(hour, RollupSeries({}, {})) for key, hour in keys.items() if key not in hours}
        cache.set_many(fresh)
        hours |= fresh
    head = rollup_series(since=since, until=first - _MINUTE, teams=teams) if since < first else None
    parts = ([head] if head else []) + list(hours.values())
    by_minute: dict[datetime, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    late: dict[datetime, Extremes] = {}
    for part in parts:
        by_minute.update(part.by_minute)
        late.update(part.lateness_extremes)
    return RollupSeries(
        by_minute,
        _add_runners(*(part.duration_by_runner for part in parts)),
        late,
        _widen_runners(*(part.duration_extremes for part in parts)),
    )


def _settled_hours(since: datetime, before: datetime, teams: Teams | None) -> dict[datetime, RollupSeries]:
    """The hours in ``[since, before)`` as :func:`rollup_series_settled` keeps them: per hour,
    its minutes (outcomes, lateness) and its durations by runner, with their extremes; one
    statement grouped by minute and runner, summed per hour here (a cold cache only: once an
    hour per set of teams after)."""
    outcomes, lateness = len(OUTCOME_COLUMNS), len(LATENESS_COLUMNS)
    counters = len(COUNTER_COLUMNS)
    table = RunRollup._meta.db_table
    where, params = _window(since, before, teams, before=True)
    result: dict[datetime, RollupSeries] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT minute, runner, {merged_aggregates()} FROM {table} WHERE {where} GROUP BY minute, runner",  # noqa: S608
            params,
        )
        for row in cursor.fetchall():
            minute = row[0]
            hour = result.setdefault(floor_hour(minute), RollupSeries({}, {}, {}, {}))
            minutes, runners = hour.by_minute, hour.duration_by_runner
            counts = tuple(row[2 : 2 + outcomes])
            late = tuple(row[2 + outcomes : 2 + outcomes + lateness])
            took = tuple(row[2 + outcomes + lateness : 2 + counters])
            # MERGED_COLUMNS order: lateness_min, duration_min, lateness_max, duration_max.
            late_min, took_min, late_max, took_max = row[2 + counters : 2 + counters + 4]
            hour.lateness_extremes[minute] = widen(
                hour.lateness_extremes.get(minute, (None, None)), (late_min, late_max)
            )
            hour.duration_extremes[row[1]] = widen(
                hour.duration_extremes.get(row[1], (None, None)), (took_min, took_max)
            )
            have = minutes.get(minute)
            minutes[minute] = (
                (counts, late)
                if have is None
                else (tuple(map(operator.add, have[0], counts)), tuple(map(operator.add, have[1], late)))
            )
            runner = runners.get(row[1])
            runners[row[1]] = took if runner is None else tuple(map(operator.add, runner, took))
    return result


def rollup_compact(*, older_than: float = 120.0) -> int:
    """Fold the shards of every minute that ended ``older_than`` seconds ago into shard 0.

    Shards keep a herd of finishes off one row lock while the minute is current; afterwards
    they only multiply what the dashboard reads (by up to ``ROLLUP_SHARDS``). On PostgreSQL the
    fold is one statement (``DELETE … RETURNING`` feeding an upsert), so a finish counted
    concurrently into a folded shard is never lost: it lands in a new row, folded next time.
    Counters are added, the extremes kept (the smallest minimum, the largest maximum). The
    task-hour rows (:class:`~executions.models.TaskRollup`, sharded alike) of every hour that
    ended ``older_than`` seconds ago are folded the same way.
    Returns the number of shard rows folded. Beat runs it every minute.
    """
    prep = RunRollup._meta.get_field("minute").get_db_prep_value
    ended = db_now() - timedelta(seconds=older_than)
    cutoff = prep(floor_minute(ended), connection)
    tasks = TaskRollup._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        minutes = _fold(
            cursor,
            picked="shard > 0 AND minute < %s",
            minute="minute",
            group_by="minute, team_id, runner",
            params=[cutoff],
        )
        cursor.execute(
            f"WITH folded AS (DELETE FROM {tasks} WHERE shard > 0 AND hour < %s RETURNING *)"  # noqa: S608
            f" , merged AS (INSERT INTO {tasks} (hour, task_id, team_id, shard, attempts, failures)"
            " SELECT hour, task_id, max(team_id), 0, sum(attempts), sum(failures) FROM folded GROUP BY hour, task_id"
            f" ON CONFLICT (task_id, hour, shard) DO UPDATE SET attempts = {tasks}.attempts + EXCLUDED.attempts,"
            f" failures = {tasks}.failures + EXCLUDED.failures) SELECT count(*) FROM folded",
            [prep(floor_hour(ended), connection)],
        )
        return minutes + cursor.fetchone()[0]


def _fold(cursor: Any, *, picked: str, minute: str, group_by: str, params: list[Any]) -> int:
    """Delete the rollup rows ``picked`` (a condition) and add them up, grouped by ``group_by``,
    into the shard 0 rows of ``minute`` (a column or a placeholder), created when missing, in
    one statement; returns how many rows went. ``params`` fill the placeholders of ``picked``,
    then of ``minute``."""
    table = RunRollup._meta.db_table
    columns = ", ".join(MERGED_COLUMNS)
    cursor.execute(
        f"WITH folded AS (DELETE FROM {table} WHERE {picked} RETURNING *), "  # noqa: S608 - names are ours
        f"merged AS (INSERT INTO {table} (minute, team_id, runner, shard, {columns}) "
        f"SELECT {minute}, team_id, runner, 0, {merged_aggregates()} FROM folded WHERE true GROUP BY {group_by} "
        f"ON CONFLICT (minute, team_id, runner, shard) DO UPDATE SET {merged_set(table)}) "
        "SELECT count(*) FROM folded",
        params,
    )
    return cursor.fetchone()[0]


#: The minute of the carry rows: what minutes past the retention counted, one row per team and
#: runner, so all-time totals (the counters at /metrics) never go back when minutes are pruned.
#: No window the dashboard reads reaches it.
CARRY_MINUTE = datetime(1970, 1, 1, tzinfo=UTC)


def rollup_prune(*, now: datetime | None = None) -> tuple[int, int]:
    """Fold minute rows older than ``ROLLUP_RETENTION`` into the carry rows (:data:`CARRY_MINUTE`)
    and delete task-hour rows older than ``TASK_ROLLUP_RETENTION``; returns how many of each
    went. Beat runs it hourly."""
    conf = tms_settings()
    now = now or db_now()
    prep = RunRollup._meta.get_field("minute").get_db_prep_value
    cutoff = prep(now - timedelta(seconds=conf.ROLLUP_RETENTION), connection)
    carry = prep(CARRY_MINUTE, connection)
    with transaction.atomic(), connection.cursor() as cursor:
        minutes = _fold(
            cursor,
            picked="minute > %s AND minute < %s",
            minute="%s",
            group_by="team_id, runner",
            params=[carry, cutoff, carry],
        )
        if minutes:  # the carry rows and the folded minutes changed: settled figures kept elsewhere go
            _bump_epoch(cursor)
    hours, _ = TaskRollup.objects.filter(hour__lt=now - timedelta(seconds=conf.TASK_ROLLUP_RETENTION)).delete()
    return minutes, hours


def rollup_rebuild(*, since: datetime) -> int:
    """Recount the rollup from ``since`` on from the execution table, in one transaction.

    For a fresh install over existing history, or after a restore; also how the benchmark fills
    the rollup for a million executions it inserted directly. It sees what the rows say now:
    executions in a terminal state, by ``finished_at``; attempts that failed and were retried
    left no row of their own, so ``retried`` stays as the trigger counted it (zero for minutes
    it never saw), and a task's hours count final failures only. Each run counts in its
    execution's team as it is now (a task moved since: in its new team). ``since`` is taken to
    the start of its hour. Scans the executions finished since then: an operator's tool, never
    part of a page view. Returns the number of executions counted.
    """
    since = floor_hour(since)
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
    # The extremes, in MERGED_COLUMNS order: lateness_min, duration_min, lateness_max, duration_max.
    for function, expression in (
        ("min", "e.started_at - e.due_at"),
        ("min", "e.finished_at - e.started_at"),
        ("max", "e.started_at - e.due_at"),
        ("max", "e.finished_at - e.started_at"),
    ):
        counters.append(f"{function}(extract(epoch FROM {expression})::float8) FILTER (WHERE {ran})")
    finished = (
        f"FROM {execution} e JOIN {task} t ON t.id = e.task_id"
        " WHERE e.finished_at >= %(since)s AND e.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND NOT e.superseded"
    )
    retried_keep = (
        f"SELECT minute, team_id, runner, shard, retried FROM {runs} WHERE minute >= date_trunc('minute', %(since)s)"  # noqa: S608
    )
    with transaction.atomic(), connection.cursor() as cursor:
        # Keep the retried counts the trigger made (no other record of them survives).
        cursor.execute(f"CREATE TEMP TABLE tms_rollup_retried ON COMMIT DROP AS {retried_keep}", {"since": since})
        cursor.execute(f"DELETE FROM {runs} WHERE minute >= date_trunc('minute', %(since)s)", {"since": since})  # noqa: S608
        cursor.execute(f"DELETE FROM {tasks} WHERE hour >= date_trunc('hour', %(since)s)", {"since": since})  # noqa: S608
        columns = ", ".join(MERGED_COLUMNS)
        cursor.execute(
            f"INSERT INTO {runs} (minute, team_id, runner, shard, {columns}) "
            f"SELECT date_trunc('minute', e.finished_at, 'UTC'), e.team_id, t.runner, (e.id %% {ROLLUP_SHARDS}),"
            f" {', '.join(counters)} {finished} GROUP BY 1, 2, 3, 4",
            {"since": since},
        )
        cursor.execute(
            f"INSERT INTO {runs} AS r (minute, team_id, runner, shard, retried) "  # noqa: S608
            "SELECT minute, team_id, runner, shard, retried FROM tms_rollup_retried WHERE retried > 0 "
            "ON CONFLICT (minute, team_id, runner, shard) DO UPDATE SET retried = EXCLUDED.retried"
        )
        cursor.execute(
            f"INSERT INTO {tasks} (hour, task_id, team_id, attempts, failures) "
            "SELECT date_trunc('hour', e.finished_at, 'UTC'), e.task_id, e.team_id, count(*),"
            f" count(*) FILTER (WHERE e.status = 'FAILED') {finished} GROUP BY 1, 2, 3",
            {"since": since},
        )
        _bump_epoch(cursor)  # settled minutes were recounted: no process may serve what it kept of them
        cursor.execute(f"SELECT count(*) {finished}", {"since": since})
        return cursor.fetchone()[0]
