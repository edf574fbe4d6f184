"""The operator dashboard's data: one call, a fixed number of queries, whatever the table sizes.

:func:`dashboard_snapshot` is the whole contract with the pages: frozen dataclasses of plain
values. Aggregates over time come from the rollup (:mod:`executions.rollup`); counts of live
states come from the execution table's partial indexes (SCHEDULED by due time, PENDING,
RUNNING), so no view scans the executions. A user sees the figures of the teams they are a member
of (every task of those teams, whoever made it), staff everything, as in the API; a team named
(the page's switcher) narrows them to that team's. Workers are the platform's, counted for all.

Definitions (times are the database's, UTC):

* a *run* is a finished attempt: SUCCEEDED, FAILED, CANCELLED, or RETRIED (failed, scheduled
  again); an execution superseded by a schedule change never ran and is not one;
* ``success_rate`` = SUCCEEDED / (SUCCEEDED + FAILED) over the last hour (final outcomes;
  cancelled runs and retried attempts are left out), None when there were none;
* the last hour / 24 h are the last 60 / 1440 whole minutes including the current one; the
  tasks failing most are counted over the last 24 hourly buckets;
* lateness = ``started_at - due_at`` of the attempt; duration = end - ``started_at``;
  percentiles are estimated from fixed log-spaced buckets, interpolated linearly within the
  bucket that holds them, and clamped to the smallest and largest value observed (kept per
  rollup row), so no p99 exceeds the longest run (see :func:`executions.histogram.percentile`);
* ``upcoming`` lists the next runs due within the hour, from the schedules: materialised
  SCHEDULED executions and, beyond the materialisation horizon, each active task's fire times
  from its cursor on (the tasks with the earliest cursors, each expanded up to the list's
  length). ``upcoming_count`` counts every run due within the hour the same way: executions,
  plus each interval task's fire times from its cursor to the hour's end computed in SQL (end_at
  and max_runs respected), plus each cron task's expanded in Python; bounded to the
  :data:`UPCOMING_TASKS_COUNTED` tasks with the earliest cursors (``upcoming_exact`` False: the
  count is a lower bound);
* ``workers_dead`` counts workers marked dead whose last heartbeat is within 24 h.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from django.db import connection
from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum

from executions.histogram import NO_EXTREMES, Extremes, percentile, widen
from executions.models import (
    OUTCOME_COLUMNS,
    Execution,
    ExecutionStatus,
    SkippedOccurrence,
    TaskRollup,
    Worker,
    WorkerStatus,
)
from executions.rollup import Teams, floor_hour, floor_minute, rollup_series, rollup_series_settled
from tasks_app.models import Task, TaskStatus, Team
from tasks_app.teams import member_team_ids, sees_all
from tms_core.clock import db_now

#: The outcomes a run is counted under, in display order.
OUTCOMES: tuple[str, ...] = tuple(OUTCOME_COLUMNS)
MINUTES_PER_DAY = 24 * 60
UPCOMING_LIMIT = 20
#: Tasks whose fire times within the hour are counted (those with the earliest cursors).
UPCOMING_TASKS_COUNTED = 5_000
#: Cron tasks among them expanded in Python to count their fire times.
UPCOMING_CRON_EXPANDED = 200
TOP_FAILING_LIMIT = 10


@dataclass(frozen=True)
class MinutePoint:
    minute: datetime
    #: Runs that ended in this minute, by outcome (every key of :data:`OUTCOMES`).
    counts: dict[str, int]
    #: Lateness histogram (:data:`executions.histogram.BUCKETS` counts) of those that had started.
    lateness: tuple[int, ...] = ()
    #: Minutes the point covers from ``minute`` on (a point of a binned chart covers several).
    span: int = 1
    #: The smallest and largest lateness of those runs, which bound its percentiles.
    lateness_extremes: Extremes = NO_EXTREMES

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class LatenessPoint:
    minute: datetime
    #: Runs that ended in this minute and had started (and so have a lateness).
    count: int
    p50: float | None
    p99: float | None


@dataclass(frozen=True)
class RunnerDuration:
    runner: str
    count: int
    p50: float | None
    p99: float | None


@dataclass(frozen=True)
class FailingTask:
    task_id: str
    name: str
    #: Attempts that failed (final failures and failed attempts that were retried).
    failures: int
    #: Every counted attempt of the task over the same hours.
    runs: int


@dataclass(frozen=True)
class UpcomingRun:
    task_id: str
    name: str
    due_at: datetime
    #: The SCHEDULED execution, or None for a fire time not yet materialised.
    execution_id: int | None


@dataclass(frozen=True)
class DashboardSnapshot:
    now: datetime
    runs_last_hour: dict[str, int]
    success_rate: float | None
    running_now: int
    #: SCHEDULED runs past due: those the monitor has yet to publish and those held back
    #: (``held_back``), whose due time moved on to their next re-check.
    due_backlog: int
    #: SCHEDULED runs held back although due: a task's max_concurrency or a named limit.
    held_back: int
    pending_depth: int
    workers_alive: int
    workers_dead: int
    skipped_by_reason: dict[str, int]
    #: The last minute of the day's charts (the current one, whole minutes of UTC).
    last_minute: datetime
    #: Minutes of the last 24 h in which runs ended: minute -> (runs by outcome in
    #: :data:`OUTCOMES` order, lateness histogram). Read through :attr:`runs_per_minute` or
    #: :meth:`points`.
    by_minute: dict[datetime, tuple[tuple[int, ...], tuple[int, ...]]]
    duration_by_runner: list[RunnerDuration]
    top_failing_tasks: list[FailingTask]
    upcoming: list[UpcomingRun]
    upcoming_count: int
    #: False when ``upcoming_count`` is a lower bound (more tasks or cron tasks than counted).
    upcoming_exact: bool = True
    #: The smallest and largest lateness of each minute of ``by_minute`` (bounds of its percentiles).
    lateness_extremes: dict[datetime, Extremes] = field(default_factory=dict)

    @cached_property
    def runs_per_minute(self) -> list[MinutePoint]:
        """Each of the last 1,440 minutes, oldest first (those without runs too)."""
        return self.points(MINUTES_PER_DAY, 1)

    @cached_property
    def lateness_per_minute(self) -> list[LatenessPoint]:
        """p50/p99 lateness of each of the last 1,440 minutes."""
        return [lateness_point(point) for point in self.runs_per_minute]

    def points(self, minutes: int, per: int) -> list[MinutePoint]:
        """The last ``minutes`` minutes in bins of ``per`` minutes, each starting at a multiple of
        ``per`` past the hour (the first may start later and the current one is still filling:
        a bin's ``minute`` and ``span`` say which minutes it holds). Runs are added by outcome
        and lateness histograms bucket by bucket, so a bin's percentiles are those of all its
        runs, not an average of its minutes'. Only the minutes with runs are read: a day in
        5-minute bins is 288 points, not 1,440 objects summed."""
        first = self.last_minute - timedelta(minutes=minutes - 1)
        step, width = timedelta(minutes=1), timedelta(minutes=per)
        origin = first - timedelta(minutes=(first.hour * 60 + first.minute) % per)
        # One pass over the minutes with runs, each to its bin (walking all 1,440 minutes of a day
        # and looking each one up: a day in 5-minute bins 4.4 -> 2.8 ms, loaded machine).
        bins: dict[int, list[tuple[tuple[int, ...], tuple[int, ...]]]] = {}
        extremes: dict[int, Extremes] = {}
        for minute, row in self.by_minute.items():
            if first <= minute <= self.last_minute:
                index = (minute - origin) // width
                bins.setdefault(index, []).append(row)
                extremes[index] = widen(
                    extremes.get(index, NO_EXTREMES), self.lateness_extremes.get(minute, NO_EXTREMES)
                )
        result = []
        start, index = origin, 0
        while start <= self.last_minute:
            begin, end = max(start, first), min(start + width - step, self.last_minute)
            rows = bins.get(index, ())
            span = int((end - begin) / step) + 1
            if not rows:
                result.append(MinutePoint(begin, dict.fromkeys(OUTCOMES, 0), (), span))
            elif len(rows) == 1:
                counts = dict(zip(OUTCOMES, rows[0][0], strict=True))
                result.append(MinutePoint(begin, counts, rows[0][1], span, extremes[index]))
            else:
                counts = dict(zip(OUTCOMES, map(sum, zip(*(row[0] for row in rows), strict=True)), strict=True))
                lateness = tuple(map(sum, zip(*(row[1] for row in rows), strict=True)))
                result.append(MinutePoint(begin, counts, lateness, span, extremes[index]))
            index += 1
            start += width
        return result


def lateness_point(point: MinutePoint) -> LatenessPoint:
    """The lateness percentiles of ``point`` (a minute or a bin of minutes), from its histogram,
    clamped to the lateness its runs had."""
    started = sum(point.lateness)
    if not started:
        return LatenessPoint(point.minute, 0, None, None)
    bounds = point.lateness_extremes
    return LatenessPoint(
        point.minute, started, percentile(point.lateness, 0.5, bounds), percentile(point.lateness, 0.99, bounds)
    )


@dataclass(frozen=True)
class _Scope:
    """Whose figures: ``teams`` None for every team's (staff); else the rollup's
    :class:`~executions.rollup.Teams` (a team asked for, or the ids of ``user``'s teams)."""

    user: Any
    teams: Teams | None

    @classmethod
    def of(cls, user: Any, team: Team | None) -> _Scope:
        if team is not None:
            return cls(user, Teams(ids=(team.pk,)))
        if sees_all(user):
            return cls(user, None)
        # The ids themselves, read once: every read below names them as values, which PostgreSQL
        # plans from its statistics (a subquery of them it could not: it read an owner's upcoming
        # runs along every team's tasks due within the hour).
        return cls(user, Teams(ids=tuple(member_team_ids(user).values_list("team_id", flat=True))))

    def rows(self, queryset: QuerySet, field: str = "team_id") -> QuerySet:
        """``queryset`` narrowed to these teams' rows; ``field`` holds a row's team id."""
        if self.teams is None:
            return queryset
        return queryset.filter(**{f"{field}__in": self.teams.ids})


def dashboard_snapshot(*, user: Any, team: Team | None = None, now: datetime | None = None) -> DashboardSnapshot:
    """Everything the dashboard shows, as seen by ``user``, at ``now`` (default: the database's):
    the figures of the teams ``user`` is a member of (staff: of every team), or of ``team`` alone,
    which must be one of theirs (the caller resolves it: :func:`tasks_app.teams.team_resolve`).

    Nine queries at most (one to read the database clock when ``now`` is not given): the rollup by
    (minute, runner), the tasks failing most, the live counts, skipped occurrences by reason, the
    upcoming executions, the tasks whose fire times come next, and the hour's count from the
    schedules (interval tasks in SQL, the others, if any, expanded). Without ``now`` the rollup's
    statement reads only the live tail, the settled hours coming from the process's cache
    (:func:`executions.rollup.rollup_series_settled`): one more statement when the window moved
    on a minute (the minutes before its first whole hour), two on a cold cache (and the hours).
    """
    # Settled hours of the rollup are kept between renders only at the database's own time: a
    # ``now`` given (a test, a report of a past moment) is read whole.
    settled = now is None
    now = now or db_now()
    scope = _Scope.of(user, team)
    live = _live_counts(scope, now)
    by_minute, late_extremes, durations, last_hour = _from_rollup(scope, now, settled=settled)
    succeeded, failed = last_hour["SUCCEEDED"], last_hour["FAILED"]
    upcoming = _upcoming(scope, now)
    from_schedules, exact = _upcoming_from_schedules(scope, now)
    return DashboardSnapshot(
        now=now,
        runs_last_hour=last_hour,
        success_rate=succeeded / (succeeded + failed) if succeeded + failed else None,
        running_now=live["running"],
        due_backlog=live["backlog"] - live["held_due"] + live["held"],
        held_back=live["held"],
        pending_depth=live["pending"],
        workers_alive=live["alive"],
        workers_dead=live["dead"],
        skipped_by_reason=_skipped_by_reason(scope, now),
        last_minute=floor_minute(now),
        by_minute=by_minute,
        duration_by_runner=durations,
        top_failing_tasks=_top_failing(scope, now),
        upcoming=upcoming,
        upcoming_count=live["upcoming_executions"] + from_schedules,
        upcoming_exact=exact,
        lateness_extremes=late_extremes,
    )


def _from_rollup(
    scope: _Scope, now: datetime, *, settled: bool = False
) -> tuple[
    dict[datetime, tuple[tuple[int, ...], tuple[int, ...]]],
    dict[datetime, Extremes],
    list[RunnerDuration],
    dict[str, int],
]:
    last = floor_minute(now)
    first = last - timedelta(minutes=MINUTES_PER_DAY - 1)
    if settled:
        series = rollup_series_settled(since=first, until=last, teams=scope.teams, now=now)
    else:
        series = rollup_series(since=first, until=last, teams=scope.teams)
    hour_start = last - timedelta(minutes=59)
    last_hour = [sum(column) for column in zip(*(
        outcomes for minute, (outcomes, _) in series.by_minute.items() if minute >= hour_start
    ), strict=True)] or [0] * len(OUTCOMES)  # fmt: skip
    durations = []
    for runner, counts in sorted(series.duration_by_runner.items()):
        if sum(counts):
            bounds = series.duration_extremes.get(runner, NO_EXTREMES)
            durations.append(
                RunnerDuration(runner, sum(counts), percentile(counts, 0.5, bounds), percentile(counts, 0.99, bounds))
            )
    return series.by_minute, series.lateness_extremes, durations, dict(zip(OUTCOMES, last_hour, strict=True))


def _top_failing(scope: _Scope, now: datetime) -> list[FailingTask]:
    """The tasks with the most failed attempts over the last 24 hourly buckets, in one query:
    the top ten from the hours that had failures (a partial index), then each one's failures
    and attempts summed over the window on the (task, hour) key."""
    since = floor_hour(now) - timedelta(hours=23)
    window = TaskRollup.objects.filter(hour__gte=since, hour__lte=now)
    top = (
        scope.rows(window.filter(failures__gt=0))
        .order_by()
        .values("task_id")
        .annotate(failed=Sum("failures"))
        .order_by("-failed", "task_id")
        .values("task_id")[:TOP_FAILING_LIMIT]
    )

    def summed(column: str) -> Subquery:
        per_task = window.filter(task_id=OuterRef("pk")).order_by().values("task_id")
        return Subquery(per_task.annotate(n=Sum(column)).values("n"))

    rows = (
        Task.objects.filter(pk__in=top)
        .order_by()
        .values_list("pk", "name")
        .annotate(failed=summed("failures"), runs=summed("attempts"))
    )
    failing = [FailingTask(str(pk), name, int(failed or 0), int(runs or 0)) for pk, name, failed, runs in rows]
    return sorted(failing, key=lambda task: (-task.failures, task.task_id))


def _count_sql(queryset: QuerySet) -> tuple[str, tuple]:
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    return f"(SELECT COUNT(*) FROM ({sql}) AS counted)", params  # noqa: S608 - compiled by Django


def _live_counts(scope: _Scope, now: datetime) -> dict[str, int]:
    """Counts of live states in one query, each a subquery on its own partial index."""
    # An execution carries its task's team: no join to the tasks.
    executions = scope.rows(Execution.objects.all())
    in_an_hour = now + timedelta(hours=1)
    held = executions.filter(status=ExecutionStatus.SCHEDULED).exclude(waiting="")
    parts = {
        "running": executions.filter(status=ExecutionStatus.RUNNING),
        "backlog": executions.filter(status=ExecutionStatus.SCHEDULED, due_at__lte=now),
        # Held runs (execution_held_idx): all of them are past due, whatever their due time says.
        "held": held,
        "held_due": held.filter(due_at__lte=now),
        "pending": executions.filter(status=ExecutionStatus.PENDING),
        "upcoming_executions": executions.filter(
            status=ExecutionStatus.SCHEDULED, due_at__gt=now, due_at__lte=in_an_hour
        ),
        "alive": Worker.objects.filter(status=WorkerStatus.ALIVE),
        "dead": Worker.objects.filter(status=WorkerStatus.DEAD, last_heartbeat__gte=now - timedelta(hours=24)),
    }
    columns: list[str] = []
    params: list[Any] = []
    for name, queryset in parts.items():
        sql, part_params = _count_sql(queryset)
        columns.append(f"{sql} AS {name}")
        params += part_params
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(columns), params)
        return dict(zip(parts, cursor.fetchone(), strict=True))


def _skipped_by_reason(scope: _Scope, now: datetime) -> dict[str, int]:
    skipped = SkippedOccurrence.objects.filter(recorded_at__gt=now - timedelta(hours=24), recorded_at__lte=now)
    # Counting ``reason`` (in the index with recorded_at) lets staff's count read the index only.
    rows = scope.rows(skipped, "task__team_id").order_by().values("reason").annotate(n=Count("reason"))
    return {row["reason"]: row["n"] for row in sorted(rows, key=lambda row: row["reason"])}


def _upcoming(scope: _Scope, now: datetime) -> list[UpcomingRun]:
    in_an_hour = now + timedelta(hours=1)
    executions = scope.rows(
        Execution.objects.filter(status=ExecutionStatus.SCHEDULED, due_at__gt=now, due_at__lte=in_an_hour)
    )
    tasks = scope.rows(Task.objects.filter(status=TaskStatus.ACTIVE, next_run_at__gt=now, next_run_at__lte=in_an_hour))
    runs = [
        UpcomingRun(str(task_id), name, due_at, execution_id)
        for execution_id, task_id, name, due_at in executions.order_by("due_at", "id").values_list(
            "id", "task_id", "task__name", "due_at"
        )[:UPCOMING_LIMIT]
    ]
    # Not materialised yet: the fire times of the tasks with the earliest cursors, each expanded
    # from its cursor up to the list's length (no later task can have an earlier one).
    for task in tasks.order_by("next_run_at", "id")[:UPCOMING_LIMIT]:
        for when in _fire_times_within(task, in_an_hour, UPCOMING_LIMIT):
            runs.append(UpcomingRun(str(task.pk), task.name, when, None))
    runs.sort(key=lambda run: (run.due_at, run.execution_id is None, run.task_id))
    return runs[:UPCOMING_LIMIT]


def _fire_times_within(task: Task, until: datetime, most: int) -> list[datetime]:
    """``task``'s fire times from its cursor up to ``until`` (at most ``most``; its end_at and
    its runs left respected)."""
    from executions.materialiser import task_schedule

    left = None if task.max_runs is None else max(0, task.max_runs - task.runs_materialised)
    cursor = task.next_run_at
    if cursor is None or cursor > until or left == 0:
        return []
    # The cursor is the next fire time not materialised yet, by definition; the schedule's after it.
    times = [cursor]
    for when in task_schedule(task).fire_times(since=cursor):
        if when <= cursor:
            continue
        if when > until or len(times) >= most or (left is not None and len(times) >= left):
            break
        times.append(when)
    return times


def _upcoming_from_schedules(scope: _Scope, now: datetime) -> tuple[int, bool]:
    """Fire times within the hour not materialised yet, and whether the count is exact, in two
    queries: each interval task's from its cursor, computed in SQL; each other
    task's (cron, one-shot) expanded here. Bounded to the :data:`UPCOMING_TASKS_COUNTED` tasks
    with the earliest cursors, and :data:`UPCOMING_CRON_EXPANDED` other tasks among them."""
    in_an_hour = now + timedelta(hours=1)
    due = scope.rows(Task.objects.filter(status=TaskStatus.ACTIVE, next_run_at__gt=now, next_run_at__lte=in_an_hour))
    interval_runs, tasks, others = _interval_runs_sql(scope.teams, now, in_an_hour)
    # Read only when there are such tasks: finding none walks every task due within the hour.
    expanded = (
        list(due.filter(interval__isnull=True).order_by("next_run_at", "id")[:UPCOMING_CRON_EXPANDED]) if others else []
    )
    count = interval_runs + sum(len(_fire_times_within(task, in_an_hour, 60 * 60)) for task in expanded)
    return count, tasks <= UPCOMING_TASKS_COUNTED and others <= UPCOMING_CRON_EXPANDED


def _interval_runs_sql(teams: Teams | None, now: datetime, until: datetime) -> tuple[int, int, int]:
    """Over the :data:`UPCOMING_TASKS_COUNTED` + 1 active tasks of ``teams`` (None: all) with the
    earliest cursors within ``(now, until]``: the interval tasks' fire times up to ``until``
    (end_at and max_runs respected), how many tasks, how many without an interval."""
    team, team_params = teams.where("team_id") if teams is not None else ("TRUE", [])
    sql = f"""
        WITH t AS (
            SELECT interval, next_run_at, LEAST(%s, end_at) AS last, max_runs - runs_materialised AS left_runs
            FROM {Task._meta.db_table}
            WHERE status = 'ACTIVE' AND next_run_at > %s AND next_run_at <= %s AND {team}
            ORDER BY next_run_at LIMIT %s
        )
        SELECT
            COALESCE(SUM(LEAST(
                floor(extract(epoch FROM last - next_run_at) / extract(epoch FROM interval)) + 1,
                COALESCE(left_runs, 2147483647)
            )) FILTER (WHERE interval IS NOT NULL AND next_run_at <= last), 0),
            COUNT(*),
            COUNT(*) FILTER (WHERE interval IS NULL)
        FROM t
    """  # noqa: S608 - the table name is the model's; values are parameters
    with connection.cursor() as cursor:
        cursor.execute(sql, [until, now, until, *team_params, UPCOMING_TASKS_COUNTED + 1])
        runs, tasks, others = cursor.fetchone()
    return int(runs), int(tasks), int(others)
