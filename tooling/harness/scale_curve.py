"""``tms_bench --scenario scale``: what a run costs as the number of tasks grows (issue 50).

For each size (``--scale-size``, 10,000, 100,000 and 1,000,000 by default) the tasks are inserted
set-based (``INSERT … SELECT generate_series``, :func:`tooling.harness.fill.insert_tasks`), then the
whole platform runs as in production, each part in processes of its own (the herd's: execution
workers, a materialiser worker fed by beat's DatabaseScheduler, the monitor):

- ``every_minute`` tasks (10,000, or all of a smaller size) of the bench user, each every minute on
  a grid of its own (their starts spread over the minute, to the millisecond);
- the rest of the filler user, on daily (four fifths) or hourly (one fifth) schedules, half cron
  expressions and half intervals, their times spread over the day (the minute of the day is
  ``g * 7919 mod 86,400`` seconds), all in UTC. A cron task fires on the minute, so each minute
  boundary has a small herd of them (about 1,900 at 1,000,000 tasks, 190 at 100,000); they are
  another owner's, as such numbers of tasks would be, and the monitor shares the queue fairly
  between owners.

The daily and hourly tasks go in first, with the platform stopped, 100,000 a statement, each
task's cursor its first fire time after the fill's expected end; the every-minute tasks once the
platform is up, each first due 30 s after its row. Nothing is due before the platform can see it
and nothing is materialised ahead: the materialiser's first passes catch up the horizon (5
minutes), and then run steady.
After a settling wait the window opens: ``minutes`` minutes in which each every-minute task is due
exactly ``minutes`` times (a grid of 60 s has that many points in any half-open window of that
length), and the figures are read over it:

- the every-minute runs' lateness (started minus scheduled) p50/p95/p99/max, every one of them
  counted: lost (not started), duplicated (started twice: a second PENDING→RUNNING event);
- the materialiser's passes (the ``tms.materialise`` successes its worker logs, with
  ``TMS_LOG_HOUSEKEEPING=true``): time p50/p95/max, rows per pass, milliseconds per row created;
- CPU per run over the window, per kind of process, from ``/proc``
  (:class:`tooling.harness.herd.CpuMeter`): PostgreSQL (the backends of this database's other
  connections), the workers, the materialiser, the monitor, beat and RabbitMQ; a run is any
  execution started in the window, the daily and hourly tasks' included;
- each process's resident memory at the window's end (``VmRSS``; a worker's pool processes are
  processes of its own);
- then, the platform stopped, the size on disk: ``pg_total_relation_size`` of the task and execution
  tables, their heap (and TOAST) apart from their indexes, divided by their rows;
- and the p95 of ``GET /api/v1/tasks`` (first page) and of the back office's task list
  (``/ui/tasks/``) through Django's test client, as staff (who sees every task), in process.

The filler is deleted set-based (and vacuumed) before the next size. :func:`write_plot` draws the
curve with matplotlib (Agg), one panel per kind of figure, the tasks on a logarithmic axis.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection

from executions.models import TERMINAL_STATUSES, Execution, ExecutionEvent
from tasks_app.models import Task
from tms_core.clock import db_now
from tooling.harness.fill import insert_tasks
from tooling.harness.herd import CpuMeter, Herd, quantiles
from tooling.harness.processes import ManagedProcess, _session_members

#: Task counts of the curve unless told (``--scale-size``).
SIZES = (10_000, 100_000, 1_000_000)
#: The every-minute tasks among them (all of a smaller size).
EVERY_MINUTE = 10_000
#: Seconds between a row's statement and its task's first fire time.
LEAD_S = 30
#: Tasks per INSERT statement (each with its own ``now()``, so the lead holds for every chunk).
CHUNK = 100_000
#: Seconds from the end of the fill to the window's opening: the materialiser's catch-up passes
#: of the last chunk end in this time (3-6 s at 100,000 tasks a chunk).
SETTLE_S = 30
#: The per-run figures the goal holds flat from 100,000 to 1,000,000 tasks (lower is better).
PER_RUN = (
    ("postgresql CPU ms/run", ("cpu_ms_per_run", "postgresql")),
    ("platform CPU ms/run", ("cpu_ms_per_run", "platform")),
    ("materialiser ms/row", ("materialiser", "ms_per_row")),
    ("task bytes/task", ("bytes", "tasks_per_task")),
    ("execution bytes/execution", ("bytes", "executions_per_execution")),
    ("API list p95 ms", ("requests", "api_tasks", "p95")),
    ("task page p95 ms", ("requests", "ui_tasks", "p95")),
)
_PASS = re.compile(r"tms\.materialise\[[^\]]*\] succeeded in ([0-9.]+)s: (-?\d+)")
#: The platform's own processes (not the servers), summed for the "platform" CPU figure.
_PLATFORM = ("worker", "materialiser", "monitor", "beat")


@dataclass
class CurveConfig:
    sizes: tuple[int, ...] = SIZES
    every_minute: int = EVERY_MINUTE
    #: Whole minutes: each every-minute task is then due exactly this many times in the window.
    minutes: int = 3
    requests: int = 60
    workers: int = 1
    concurrency: int = 4
    monitors: int = 1
    #: Leave the last size's tasks in place (``--keep-history``: a scratch database to be dropped).
    keep_last: bool = False


def _fill_every_minute(owner_id: int, count: int) -> None:
    """``count`` every-minute interval tasks, starts spread over the minute to the millisecond."""
    insert_tasks(
        owner_id=owner_id,
        count=count,
        columns={
            "name": "'minute ' || g",
            "interval": "interval '1 minute'",
            "start_at": "s.start_at",
            "next_run_at": "s.start_at + ceil(extract(epoch FROM now() + %(lead)s * interval '1 second' - s.start_at)"
            " / 60) * interval '1 minute'",
        },
        params={"lead": LEAD_S},
        lateral=", LATERAL (SELECT date_trunc('minute', now()) - interval '1 hour' "
        "+ (g - 1)::bigint * 60000 / %(count)s * interval '1 millisecond' AS start_at) AS s",
    )


def _fill_daily_hourly(owner_id: int, count: int, first: int, *, ahead: float = 0.0) -> None:
    """``count`` daily or hourly tasks (cron or interval), numbered from ``first`` (see the module),
    each first due at its first fire time ``LEAD_S + ahead`` seconds after the statement's start."""
    insert_tasks(
        owner_id=owner_id,
        count=count,
        columns={
            "name": "'scale ' || (g + %(first)s)",
            "interval": "CASE WHEN q.cron THEN NULL ELSE q.period END",
            "cron": "CASE WHEN NOT q.cron THEN '' WHEN q.hourly THEN (p.s / 60 %% 60)::text || ' * * * *' "
            "ELSE (p.s / 60 %% 60)::text || ' ' || (p.s / 3600)::text || ' * * *' END",
            "start_at": "q.grid",
            "next_run_at": "q.grid + ceil(extract(epoch FROM p.t - q.grid) / extract(epoch FROM q.period)) * q.period",
        },
        params={"lead": LEAD_S + ahead, "first": first},
        # s: the task's second of the day; k: its kind (0, 1 hourly; 2-9 daily; even: cron). The
        # grid is its fire times (a cron task's on the minute), from yesterday's midnight.
        lateral=", LATERAL (SELECT (g + %(first)s)::bigint * 7919 %% 86400 AS s, (g + %(first)s) %% 10 AS k, "
        "now() + %(lead)s * interval '1 second' AS t, date_trunc('day', now()) - interval '1 day' AS d0) AS p, "
        "LATERAL (SELECT p.k < 2 AS hourly, p.k %% 2 = 0 AS cron, "
        "CASE WHEN p.k < 2 THEN interval '1 hour' ELSE interval '1 day' END AS period, "
        "p.d0 + CASE WHEN p.k < 2 THEN p.s %% 3600 ELSE p.s END / CASE WHEN p.k %% 2 = 0 THEN 60 ELSE 1 END "
        "* CASE WHEN p.k %% 2 = 0 THEN 60 ELSE 1 END * interval '1 second' AS grid) AS q",
    )


def _rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def resident_memory(procs: Mapping[str, list[ManagedProcess]]) -> dict[str, dict[str, Any]]:
    """Each kind's processes' resident memory (MiB): how many, each one's, the largest."""
    found: dict[str, dict[str, Any]] = {}
    for kind, running in procs.items():
        sizes = [_rss_kib(pid) / 1024 for proc in running for pid in sorted(_session_members(proc.pid))]
        sizes = [round(size, 1) for size in sizes if size]
        found[kind] = {"processes": len(sizes), "max_mib": max(sizes, default=0.0), "each_mib": sizes}
    return found


def table_bytes() -> dict[str, float]:
    """The task and execution tables' size on disk (heap with TOAST, and indexes) per row."""
    out: dict[str, float] = {}
    with connection.cursor() as cursor:
        for name, table in (("tasks", Task._meta.db_table), ("executions", Execution._meta.db_table)):
            cursor.execute(
                f"SELECT count(*), pg_total_relation_size(%s), pg_indexes_size(%s) FROM {table}",  # noqa: S608
                [table, table],
            )
            rows, total, indexes = cursor.fetchone()
            single = name[:-1]
            out[name] = rows
            out[f"{name}_mib"] = round(total / 2**20, 1)
            if rows:
                out[f"{name}_per_{single}"] = round(total / rows)
                out[f"{name}_heap_per_{single}"] = round((total - indexes) / rows)
                out[f"{name}_indexes_per_{single}"] = round(indexes / rows)
    return out


def time_requests(user: Any, paths: Mapping[str, str], times: int) -> dict[str, dict[str, float]]:
    """Each path's server time (ms) through Django's test client as ``user``: p50, p95, max."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    timed: dict[str, dict[str, float]] = {}
    for name, path in paths.items():
        client.get(path)  # warm: the first request pays for imports and caches
        timings = []
        for _ in range(times):
            started = time.perf_counter()
            response = client.get(path)
            timings.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"{path} answered {response.status_code}")
        ordered = sorted(timings)
        timed[name] = {
            "p50": round(ordered[len(ordered) // 2], 1),
            "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
            "max": round(ordered[-1], 1),
        }
    return timed


def every_minute_account(*, owner_id: int, since: datetime, until: datetime, expected: int) -> dict[str, Any]:
    """The bench user's runs due in ``[since, until)``: lateness quantiles (ms) of those started;
    started; coalesced (cancelled unstarted: the misfire policy ran a later occurrence instead, by
    design, when the platform is behind by more than the grace); unfinished (still waiting or
    running when counted: late, not lost); lost (the rest of ``expected``: an occurrence with no
    run, or a run that ended without starting otherwise); duplicated (a run's second start, once
    per extra start)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT extract(epoch FROM e.started_at - e.scheduled_for) * 1000, e.status,
                (SELECT count(*) FROM {ExecutionEvent._meta.db_table} ev
                 WHERE ev.execution_id = e.id AND ev.to_status = 'RUNNING' AND ev.from_status <> 'RUNNING')
            FROM {Execution._meta.db_table} e JOIN {Task._meta.db_table} t ON t.id = e.task_id
            WHERE t.owner_id = %s AND e.scheduled_for >= %s AND e.scheduled_for < %s
            """,  # noqa: S608 - table names are ours
            [owner_id, since, until],
        )
        rows = cursor.fetchall()
    late = [float(ms) for ms, _, starts in rows if ms is not None and starts]
    started = len(late)
    coalesced = sum(1 for _, status, starts in rows if status == "CANCELLED" and not starts)
    unfinished = sum(1 for _, status, starts in rows if status not in TERMINAL_STATUSES and not starts)
    lateness = {k: round(v, 1) for k, v in quantiles(late).items()}
    if late:
        ordered = sorted(late)
        lateness["p95"] = round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1)
    return {
        "expected": expected,
        "runs": len(rows),
        "started": started,
        "coalesced": coalesced,
        "unfinished": unfinished,
        "lost": expected - started - coalesced - unfinished,
        "duplicated": sum(max(0, int(starts) - 1) for _, _, starts in rows),
        "lateness_ms": lateness,
    }


def _runs_started(since: datetime, until: datetime) -> int:
    return Execution.objects.filter(started_at__gte=since, started_at__lt=until).count()


def _passes(log: str) -> dict[str, Any]:
    found = [(float(seconds), int(rows)) for seconds, rows in _PASS.findall(log)]
    if not found:
        return {"passes": 0}
    times = sorted(seconds for seconds, _ in found)
    rows = sum(created for _, created in found)

    def q(p: float) -> float:
        return round(times[min(len(times) - 1, int(p * len(times)))] * 1000, 1)

    return {
        "passes": len(found),
        "pass_ms": {"p50": q(0.5), "p95": q(0.95), "max": round(times[-1] * 1000, 1)},
        "rows": rows,
        "rows_per_pass": round(rows / len(found), 1),
        "ms_per_row": round(sum(times) * 1000 / rows, 3) if rows else None,
    }


class ScaleCurve:
    """Runs the curve (see the module's docstring); ``cleanup`` deletes every bench user's rows."""

    def __init__(
        self,
        *,
        owner_id: int,
        filler_id: int,
        staff: Any,
        config: CurveConfig,
        log_dir: Path,
        env: dict[str, Any],
        progress: Callable[[str], None],
        cleanup: Callable[[], None],
    ) -> None:
        self.owner_id = owner_id
        self.filler_id = filler_id
        self.staff = staff
        self.config = config
        self.log_dir = log_dir
        self.env = env
        self.progress = progress
        self.cleanup = cleanup

    def run(self) -> list[dict[str, Any]]:
        points: list[dict[str, Any]] = []
        for size in self.config.sizes:
            self.cleanup()
            try:
                points.append(self.point(size))
            finally:
                measured = bool(points) and points[-1]["size"] == size
                # --keep-history: no delete of a million rows the caller drops with its database.
                if not (measured and self.config.keep_last and size == self.config.sizes[-1]):
                    self.progress(f"scale {size}: deleting the tasks")
                    started = time.monotonic()
                    self.cleanup()
                    if measured:
                        points[-1]["cleanup_s"] = round(time.monotonic() - started, 1)
        return points

    def point(self, size: int) -> dict[str, Any]:
        every = min(self.config.every_minute, size)
        began = time.monotonic()
        point: dict[str, Any] = {"size": size, "every_minute": every}
        # Beat's jobs logged by the materialiser's worker: its passes' times and rows.
        herd = Herd(
            owner_id=self.owner_id,
            tasks=every,
            workers=self.config.workers,
            concurrency=self.config.concurrency,
            monitors=self.config.monitors,
            log_dir=self.log_dir,
            env={**self.env, "TMS_LOG_HOUSEKEEPING": "true"},
            progress=self.progress,
        )
        # The daily and hourly tasks first, the platform stopped: a fill of 1,000,000 beside the
        # running platform on 2 shared cores (2026-12-07) put it minutes behind before the window.
        point["fill_s"] = self._fill(size, every)
        with herd._platform() as procs:
            started = time.monotonic()
            _fill_every_minute(self.owner_id, every)
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {Task._meta.db_table}")
            point["fill_s"] += round(time.monotonic() - started, 1)
            since = db_now() + timedelta(seconds=SETTLE_S)
            until = since + timedelta(minutes=self.config.minutes)
            point["window"] = {"from": since.isoformat(), "until": until.isoformat()}
            self.progress(
                f"scale {size}: window {since:%H:%M:%S}-{until:%H:%M:%S} ({self.config.minutes:g} min of "
                f"{every} every-minute tasks)"
            )
            meter = CpuMeter(procs)
            meter.start()
            point.update(self._window(procs, meter, since, until, every))
            point["rss_mib"] = resident_memory(procs)
        point["rss_mib"]["bench (this process)"] = {"processes": 1, "max_mib": round(_rss_kib(os.getpid()) / 1024, 1)}
        expected = every * self.config.minutes
        point["every_minute_runs"] = every_minute_account(
            owner_id=self.owner_id, since=since, until=until, expected=expected
        )
        point["bytes"] = table_bytes()
        self.progress(f"scale {size}: timing the API's task list and the back office's task list")
        point["requests"] = time_requests(
            self.staff, {"api_tasks": "/api/v1/tasks", "ui_tasks": "/ui/tasks/"}, self.config.requests
        )
        point["seconds"] = round(time.monotonic() - began, 1)
        return point

    def _fill(self, size: int, every: int) -> float:
        """The daily and hourly tasks, a chunk a statement, each chunk's first fire times far
        enough ahead for the chunks after it (by the last chunk's time): none is due before the
        platform starts, after the fill."""
        started = time.monotonic()
        self.progress(f"scale {size}: inserting {size - every} daily or hourly tasks (then {every} every-minute)")
        chunk_s = 10.0  # a guess for the first chunk; early is better than late (a catch-up, then steady)
        for first in range(0, size - every, CHUNK):
            ahead = chunk_s * len(range(first + CHUNK, size - every, CHUNK))
            began = time.monotonic()
            _fill_daily_hourly(self.filler_id, min(CHUNK, size - every - first), first, ahead=ahead)
            # Statistics as autovacuum keeps them for a table that grows over months, not minutes.
            # Not a cure for what the first 1,000,000 run met (2026-12-07): beat's workflow_timeouts
            # query, started mid-fill, ran for over 10 minutes, holding the system worker (and with
            # it the materialiser) and a core of PostgreSQL; with this it still did in the second
            # run (cancelled by hand after 2 min 19 s). See docs/benchmarks.md, the cost curve.
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {Task._meta.db_table}, {Execution._meta.db_table}")
            chunk_s = time.monotonic() - began
            self.progress(f"scale {size}: {first + min(CHUNK, size - every - first)} daily or hourly tasks inserted")
        return round(time.monotonic() - started, 1)

    def _window(
        self,
        procs: dict[str, list[ManagedProcess]],
        meter: CpuMeter,
        since: datetime,
        until: datetime,
        every: int,
    ) -> dict[str, Any]:
        """Wait through the window, reading the CPU and the materialiser's log at its two ends,
        then until the window's every-minute runs have ended (or a minute more)."""
        materialiser = procs["materialiser"][0]
        due = Execution.objects.filter(task__owner_id=self.owner_id, scheduled_for__gte=since, scheduled_for__lt=until)
        expected = every * self.config.minutes
        opened: tuple[dict[str, float], int] | None = None
        closed: tuple[dict[str, float], int] | None = None
        last_report = 0.0
        while True:
            meter.sample()
            now = db_now()
            if opened is None and now >= since:
                opened = (meter.mark(), len(materialiser.log()))
            if opened is not None and closed is None and now >= until:
                closed = (meter.mark(), len(materialiser.log()))
            for kind, running in procs.items():
                for proc in running:
                    if not proc.alive:
                        raise RuntimeError(f"scale: {kind} {proc.name} exited:\n{proc.log()[-2000:]}")
            if closed is not None:
                done = due.filter(finished_at__isnull=False).count()
                if done >= expected or now > until + timedelta(seconds=60):
                    break
            if time.monotonic() - last_report >= 15:
                self.progress(f"scale: {now:%H:%M:%S}, {due.filter(finished_at__isnull=False).count()} of the window's "
                              f"{expected} every-minute runs done")  # fmt: skip
                last_report = time.monotonic()
            time.sleep(0.5)
        assert opened is not None
        assert closed is not None
        cpu = {kind: closed[0].get(kind, 0.0) - opened[0].get(kind, 0.0) for kind in closed[0]}
        runs = _runs_started(since, until)
        per_run = {kind: round(seconds * 1000 / runs, 3) for kind, seconds in cpu.items()} if runs else {}
        if per_run:
            per_run["platform"] = round(sum(per_run.get(kind, 0.0) for kind in _PLATFORM), 3)
        return {
            "runs_in_window": runs,
            "runs_per_second": round(runs / (until - since).total_seconds(), 1),
            "cpu_s": {kind: round(seconds, 2) for kind, seconds in cpu.items()},
            "cpu_ms_per_run": per_run,
            "materialiser": _passes(materialiser.log()[opened[1] : closed[1]]),
        }


def earlier_points(paths: tuple[Path, ...], *, besides: list[int]) -> list[dict[str, Any]]:
    """The sizes measured in earlier runs' JSON files (``tms_bench --scenario scale --json``),
    each marked with the run it came from; a size of ``besides`` (measured now) or met twice is
    taken from the later source."""
    found: dict[int, dict[str, Any]] = {}
    for path in paths:
        payload = json.loads(Path(path).read_text())
        for row in payload.get("results", []):
            if row.get("scenario") != "scale":
                continue
            for point in row.get("extra", {}).get("points", []):
                found[point["size"]] = {**point, "from": f"{path} ({payload.get('when', '?')})"}
    return [point for size, point in found.items() if size not in besides]


def _get(point: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = point
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, int | float) else None


def goal(points: list[dict[str, Any]], low: int = 100_000, high: int = 1_000_000) -> dict[str, Any]:
    """Issue 50's goal between ``low`` and ``high`` tasks: the every-minute runs' p99 grows by
    less than 20 %, and no per-run figure grows (each figure's ``high / low`` ratio)."""
    by_size = {point["size"]: point for point in points}
    if low not in by_size or high not in by_size:
        return {}
    a, b = by_size[low], by_size[high]
    ratios: dict[str, float | None] = {}
    for name, path in (("every-minute p99", ("every_minute_runs", "lateness_ms", "p99")), *PER_RUN):
        before, after = _get(a, path), _get(b, path)
        ratios[name] = round(after / before, 2) if before and after is not None else None
    p99 = ratios["every-minute p99"]
    return {
        "between": [low, high],
        "ratios": ratios,
        "p99_within_20_percent": p99 is not None and p99 < 1.2,
        "grown": [name for name, _ in PER_RUN if (ratios.get(name) or 0) > 1.0],
    }


def _cells(point: Mapping[str, Any], *paths: tuple[str, ...]) -> str:
    """The values at ``paths`` of ``point``, joined by slashes (``-`` where missing)."""
    shown = []
    for path in paths:
        value: Any = point
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        shown.append("-" if value is None else f"{value:,}" if isinstance(value, int) else str(value))
    return " / ".join(shown)


#: The curve's table: a label, and the paths in a size's point of the values it shows.
_ROWS: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    ("tasks / every-minute ones", (("size",), ("every_minute",))),
    ("fill s / whole size s / deleting s", (("fill_s",), ("seconds",), ("cleanup_s",))),
    ("runs in the window / runs/s", (("runs_in_window",), ("runs_per_second",))),
    (
        "every-minute runs: started / coalesced / unfinished / lost / duplicated",
        tuple(("every_minute_runs", k) for k in ("started", "coalesced", "unfinished", "lost", "duplicated")),
    ),
    (
        "every-minute lateness p50 / p95 / p99 / max (ms)",
        tuple(("every_minute_runs", "lateness_ms", k) for k in ("p50", "p95", "p99", "max")),
    ),
    ("materialiser pass p50 / p95 / max (ms)", tuple(("materialiser", "pass_ms", k) for k in ("p50", "p95", "max"))),
    (
        "materialiser passes / rows a pass / ms a row",
        tuple(("materialiser", k) for k in ("passes", "rows_per_pass", "ms_per_row")),
    ),
    ("PostgreSQL CPU ms/run", (("cpu_ms_per_run", "postgresql"),)),
    (
        "CPU ms/run: workers / monitor / materialiser / beat / RabbitMQ",
        tuple(("cpu_ms_per_run", k) for k in ("worker", "monitor", "materialiser", "beat", "rabbitmq")),
    ),
    ("task bytes/task: heap / indexes", (("bytes", "tasks_heap_per_task"), ("bytes", "tasks_indexes_per_task"))),
    (
        "execution bytes/execution: heap / indexes / rows",
        tuple(
            ("bytes", k) for k in ("executions_heap_per_execution", "executions_indexes_per_execution", "executions")
        ),
    ),
    (
        "RSS MiB, largest: worker / materialiser / monitor / beat",
        tuple(("rss_mib", k, "max_mib") for k in ("worker", "materialiser", "monitor", "beat")),
    ),
    ("GET /api/v1/tasks p50 / p95 (ms)", (("requests", "api_tasks", "p50"), ("requests", "api_tasks", "p95"))),
    ("/ui/tasks/ p50 / p95 (ms)", (("requests", "ui_tasks", "p50"), ("requests", "ui_tasks", "p95"))),
)


def curve_table(points: list[dict[str, Any]]) -> list[str]:
    """The curve as a Markdown table, one column per size."""
    if not points:
        return []
    lines = [
        "| figure | " + " | ".join(f"{p['size']:,} tasks" for p in points) + " |",
        "|---|" + "---|" * len(points),
    ]
    for label, paths in _ROWS:
        lines.append(f"| {label} | " + " | ".join(_cells(point, *paths) for point in points) + " |")
    return lines


def write_plot(points: list[dict[str, Any]], path: Path, *, title: str = "") -> None:
    """The curve as a PNG: six panels against the number of tasks (logarithmic)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [point["size"] for point in points]

    def series(*keys: str) -> list[float | None]:
        return [_get(point, keys) for point in points]

    panels: list[tuple[str, list[tuple[str, list[float | None]]]]] = [
        (
            "every-minute runs' lateness (ms)",
            [
                ("p50", series("every_minute_runs", "lateness_ms", "p50")),
                ("p99", series("every_minute_runs", "lateness_ms", "p99")),
            ],
        ),
        (
            "CPU per run (ms)",
            [
                ("PostgreSQL", series("cpu_ms_per_run", "postgresql")),
                ("workers", series("cpu_ms_per_run", "worker")),
                ("monitor", series("cpu_ms_per_run", "monitor")),
                ("materialiser", series("cpu_ms_per_run", "materialiser")),
            ],
        ),
        (
            "materialiser pass (ms)",
            [
                ("p50", series("materialiser", "pass_ms", "p50")),
                ("p95", series("materialiser", "pass_ms", "p95")),
            ],
        ),
        (
            "bytes per row",
            [
                ("task heap", series("bytes", "tasks_heap_per_task")),
                ("task indexes", series("bytes", "tasks_indexes_per_task")),
                ("execution heap", series("bytes", "executions_heap_per_execution")),
                ("execution indexes", series("bytes", "executions_indexes_per_execution")),
            ],
        ),
        (
            "resident memory, largest process (MiB)",
            [(kind, series("rss_mib", kind, "max_mib")) for kind in ("worker", "materialiser", "monitor", "beat")],
        ),
        (
            "request p95 (ms)",
            [
                ("GET /api/v1/tasks", series("requests", "api_tasks", "p95")),
                ("/ui/tasks/", series("requests", "ui_tasks", "p95")),
            ],
        ),
    ]
    figure, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for axis, (name, lines) in zip(axes.flat, panels, strict=True):
        for label, values in lines:
            shown = [(size, value) for size, value in zip(sizes, values, strict=True) if value is not None]
            if shown:
                axis.plot([s for s, _ in shown], [v for _, v in shown], marker="o", label=label)
        axis.set_xscale("log")
        axis.set_xticks(sizes, [f"{size:,}" for size in sizes])
        axis.minorticks_off()
        axis.set_ylim(bottom=0)
        axis.set_title(name)
        axis.set_xlabel("tasks")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
    figure.suptitle(title or "tms_bench --scenario scale: cost per run against the number of tasks")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)


def staff_user() -> Any:
    """The superuser the requests are made as (staff see every task)."""
    return get_user_model().objects.update_or_create(
        username="tms-bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )[0]
