"""``manage.py tms_bench``: measure the platform beside the bare-Celery ceiling, in one run.

Every scenario starts real monitor and worker processes against the configured PostgreSQL and
RabbitMQ, drives load through the same code paths as production, and reads the figures back
from the database (lateness = claimed minus scheduled time), from PostgreSQL's own counters
(commits per execution) and from the monitor's stats (due-query time). The baseline pushes bare
Celery no-op tasks through the same broker and queue with the same worker settings, so the ratio
between the two says what TMS costs on this machine today, whatever its speed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Count, Max

from executions.models import TERMINAL_STATUSES, Execution, ExecutionEvent, ExecutionStatus
from tasks_api.creation import task_bulk_create
from tasks_api.limits import limit_create
from tasks_app.models import Limit, Task
from tasks_app.quotas import owner_quota_set
from tms_core.clock import db_now
from tms_core.conf import tms_settings
from tooling.harness.compare import cpu_speed
from tooling.harness.fill import insert_tasks
from tooling.harness.history import LIVE_ROWS
from tooling.harness.pg_cluster import PgCluster
from tooling.harness.processes import (
    ROOT,
    ManagedProcess,
    monitor_stats,
    process_env,
    start_monitor,
    start_worker,
    wait_ready,
)
from tooling.harness.rabbit_cluster import RabbitCluster

SCENARIOS = (
    "burst",
    "herd",
    "restore",
    "sustained",
    "sustained_filled",
    "scale",
    "create",
    "dashboard",
    "lists",
    "prune",
    "fairness",
    "pages",
    "workflows",
)
#: Scenarios run only when named (``--scenario scale``), never by ``all``: the cost curve fills a
#: million tasks and runs for tens of minutes (issue 50: a scenario of its own, outside make bench).
ON_REQUEST = ("scale",)
#: What ``all`` (and no ``--scenario``) runs.
DEFAULT_SCENARIOS = tuple(name for name in SCENARIOS if name not in ON_REQUEST)
#: The scenarios ``BenchConfig.through`` runs again through a pooler or on the HA topology.
THROUGH_SCENARIOS = ("sustained", "herd")
#: What the platform's processes can be put behind: a pooler, or the high-availability topology.
THROUGH = ("pgbouncer", "ha")
#: How the runs of ``--through ha`` are named in the table.
HA_LABELS = {
    "single-node": "one PostgreSQL, one RabbitMQ node (classic queues)",
    "ha": "Patroni pair (synchronous) + 3 RabbitMQ nodes (quorum queues)",
}
#: The tables the benchmark's runs write and delete in bulk (:meth:`Bench._cleanup`).
_VACUUMED = (
    "executions_execution",
    "executions_executionevent",
    "executions_taskrollup",
    "executions_runrollup",
    "tasks_app_task",
    "tasks_app_taskversion",
    "tasks_app_taskdependency",
    "tasks_app_auditentry",
)
#: Deletes what a bench user owns, set-based (the scale and sustained_filled scenarios leave a million rows).
_CLEANUP = (
    # Named limits of the burst with limits: their slots and starts, through their buckets.
    """DELETE FROM executions_limitslot WHERE bucket_id IN (SELECT b.id FROM executions_limitbucket b
        JOIN tasks_app_limit l ON l.id = b.limit_id JOIN auth_user u ON u.id = l.owner_id WHERE u.username = %s)""",
    """DELETE FROM executions_limitstart WHERE bucket_id IN (SELECT b.id FROM executions_limitbucket b
        JOIN tasks_app_limit l ON l.id = b.limit_id JOIN auth_user u ON u.id = l.owner_id WHERE u.username = %s)""",
    """DELETE FROM executions_limitbucket WHERE limit_id IN (
        SELECT l.id FROM tasks_app_limit l JOIN auth_user u ON u.id = l.owner_id WHERE u.username = %s)""",
    """DELETE FROM tasks_app_task_limits WHERE task_id IN (
        SELECT t.id FROM tasks_app_task t JOIN auth_user u ON u.id = t.owner_id WHERE u.username = %s)""",
    """DELETE FROM executions_archiveindex WHERE owner_id IN (SELECT id FROM auth_user WHERE username = %s)""",
    # The rollups are kept by team: the bench user's tasks are in its personal team.
    """DELETE FROM executions_runrollup WHERE team_id IN (
        SELECT t.id FROM tasks_app_team t JOIN auth_user u ON u.id = t.personal_of_id WHERE u.username = %s)""",
    """DELETE FROM executions_taskrollup WHERE team_id IN (
        SELECT t.id FROM tasks_app_team t JOIN auth_user u ON u.id = t.personal_of_id WHERE u.username = %s)""",
    """DELETE FROM executions_skippedoccurrence WHERE task_id IN (
        SELECT t.id FROM tasks_app_task t JOIN auth_user u ON u.id = t.owner_id WHERE u.username = %s)""",
    # What a workflow run records of its map steps and skipped steps (the workflows scenario).
    """DELETE FROM executions_workflowmap WHERE task_id IN (
        SELECT t.id FROM tasks_app_task t JOIN auth_user u ON u.id = t.owner_id WHERE u.username = %s)""",
    """DELETE FROM executions_workflowskip WHERE task_id IN (
        SELECT t.id FROM tasks_app_task t JOIN auth_user u ON u.id = t.owner_id WHERE u.username = %s)""",
    """DELETE FROM executions_executionevent WHERE execution_id IN (
        SELECT e.id FROM executions_execution e JOIN tasks_app_task t ON t.id = e.task_id
        JOIN auth_user u ON u.id = t.owner_id WHERE u.username = %s)""",
    """DELETE FROM executions_execution WHERE task_id IN (
        SELECT t.id FROM tasks_app_task t JOIN auth_user u ON u.id = t.owner_id WHERE u.username = %s)""",
    # What refers to the tasks: their versions, trigger URLs and dependencies (either end).
    """DELETE FROM tasks_app_taskversion WHERE task_id IN (
        SELECT t.id FROM tasks_app_task t JOIN auth_user u ON u.id = t.owner_id WHERE u.username = %s)""",
    """DELETE FROM tasks_app_taskhook WHERE task_id IN (
        SELECT t.id FROM tasks_app_task t JOIN auth_user u ON u.id = t.owner_id WHERE u.username = %s)""",
    """DELETE FROM tasks_app_taskdependency WHERE task_id IN (
        SELECT t.id FROM tasks_app_task t JOIN auth_user u ON u.id = t.owner_id WHERE u.username = %s)
        OR upstream_id IN (SELECT t.id FROM tasks_app_task t JOIN auth_user u ON u.id = t.owner_id
        WHERE u.username = %s)""",
    """DELETE FROM tasks_app_task WHERE owner_id IN (SELECT id FROM auth_user WHERE username = %s)""",
    """DELETE FROM tasks_app_limit WHERE owner_id IN (SELECT id FROM auth_user WHERE username = %s)""",
)
BENCH_USER = "tms-bench"
FILLER_USER = "tms-bench-filler"
#: Owner of the prune scenario's bursts, apart from the history being pruned.
BURST_USER = "tms-bench-burst"
#: The fairness scenario's second owner (the first is BENCH_USER, with the herd).
FAIR_USER = "tms-bench-fair"


#: What a load scenario creates once the platform is up: the task specs and their first due time.
Plan = Callable[[], tuple[list[dict[str, Any]], datetime]]


def _bring_forward(task_ids: list[Any], *, seconds: float, run_input: Any = None) -> datetime:
    """Make the one-shot tasks ``task_ids`` (and their SCHEDULED runs) due ``seconds`` from now,
    in one transaction; the monitor, which sleeps at most ``TMS_MONITOR_MAX_SLEEP`` and is woken by
    the NOTIFY, sees the new time. The harness's own write: no product path moves a one-shot's
    run earlier without replacing it, and a replaced run would not be the one measured. With
    ``run_input``, the runs get it as their input, as a trigger's run would."""
    from executions.notify import notify_due

    due = db_now() + timedelta(seconds=seconds)
    ids = [str(task_id) for task_id in task_ids]
    given = None if run_input is None else json.dumps(run_input)
    with transaction.atomic(), connection.cursor() as cursor:
        # Not next_run_at: the materialiser's cursor, past the one occurrence it created.
        cursor.execute("UPDATE tasks_app_task SET start_at = %s WHERE id = ANY(%s::uuid[])", [due, ids])
        cursor.execute(
            "UPDATE executions_execution SET due_at = %s, scheduled_for = %s, input = COALESCE(%s::jsonb, input) "
            "WHERE status = 'SCHEDULED' AND task_id = ANY(%s::uuid[])",
            [due, due, given, ids],
        )
        notify_due()
    return due


@dataclass
class BenchConfig:
    scenarios: tuple[str, ...] = DEFAULT_SCENARIOS
    tasks: int = 5000
    #: Sustained executions per second; default: half the burst throughput of this run (or 100).
    rate: float | None = None
    #: Sustained runs at these fractions of the burst rate of this run (one figure each, named
    #: ``sustained`` for the first and ``sustained_75`` for 0.75 and so on), instead of ``rate``.
    sustained_shares: tuple[float, ...] = ()
    #: And at these fixed rates (executions/s), whatever the burst's: one figure each, named
    #: ``sustained_at_123`` for 123/s (issue 50's steady-load goal is set at 123/s and 500/s).
    sustained_rates: tuple[float, ...] = ()
    #: The sustained scenario also runs Celery's own ETA tasks at the same rate on the same workers.
    celery_eta: bool = True
    duration: float = 20.0
    workers: int = 1
    concurrency: int = 4
    #: The herd scenario: every-minute cron tasks due on one minute, worker processes per worker
    #: (beside ``workers``), and monitors.
    herd_tasks: int = 1000
    herd_concurrency: int = 2
    monitors: int = 1
    #: The herd due a few seconds ahead rather than on the next minute boundary (smoke runs).
    herd_soon: bool = False
    #: The restore scenario: one-run tasks that appear all due at one instant, not materialised
    #: (a restore, an import), with the herd's processes.
    restore_tasks: int = 100_000
    scale_executions: int = 1_000_000
    scale_tasks: int = 100_000
    #: The scale scenario (the cost curve, tooling/harness/scale_curve.py): its task counts, the
    #: every-minute tasks among them, the window's minutes, the requests timed per path and size,
    #: and where its plot goes.
    scale_sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    scale_every_minute: int = 10_000
    scale_minutes: int = 3
    scale_requests: int = 60
    scale_plot: Path | None = field(default_factory=lambda: ROOT / "var" / "bench" / "bench-scale.png")
    #: Sizes measured by earlier runs of the scenario (their ``--json`` files), tabled, judged and
    #: drawn with this run's: a curve can be run a size at a time on a shared machine.
    scale_with: tuple[Path, ...] = ()
    create_requests: int = 300
    bulk_tasks: int = 20_000
    #: Dashboard renders timed (for each of a staff user and an owner).
    dashboard_renders: int = 60
    #: Requests timed per execution-list path (lists scenario).
    list_requests: int = 100
    #: lists: leave the history in place afterwards, and time the one already there if any.
    keep_history: bool = False
    #: The fairness scenario: owner A's herd and owner B's runs, all due at one instant.
    fair_herd: int = 10_000
    fair_few: int = 10
    #: The workflows scenario: this many workflow runs of ``workflow_steps`` chained noop steps,
    #: beside as many independent noop runs as they have steps, all due at one instant.
    workflow_runs: int = 1000
    workflow_steps: int = 5
    #: ... and then this many workflow runs that each map ``workflow_map_items`` noop
    #: items and join them, beside as many independent noop runs as they have items.
    workflow_map_runs: int = 100
    workflow_map_items: int = 50
    #: Run the burst a second time with a named limit on every task (a cap and a rate window
    #: too wide to bind): what enforcing limits costs per execution, beside the burst without.
    with_limit: bool = False
    #: Run the steady load (sustained) and the herd again with the platform's processes going
    #: through each of these (``pgbouncer``: a private PgBouncer in transaction pooling mode in
    #: front of the same PostgreSQL, tooling/harness/pgbouncer.py; ``ha``: a private Patroni pair
    #: with synchronous replication and a three-node RabbitMQ cluster with quorum queues,
    #: tooling/harness/pg_cluster.py and rabbit_cluster.py), beside the direct runs.
    through: tuple[str, ...] = ()
    #: PgBouncer's server connections per database and role (``default_pool_size``).
    pgbouncer_pool: int = 8
    log_dir: Path = field(default_factory=lambda: ROOT / "var" / "bench")
    settings_module: str = ""
    progress: Callable[[str], None] = lambda line: None


@dataclass
class Figures:
    scenario: str
    executions: int = 0
    seconds: float = 0.0
    per_second: float = 0.0
    lateness_ms: dict[str, float] = field(default_factory=dict)
    commits_per_execution: float | None = None
    monitor: dict[str, Any] = field(default_factory=dict)
    baseline_per_second: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if not self.baseline_per_second:
            return None
        return self.per_second / self.baseline_per_second


def slices(values: list[Any], parts: int = 4, least: int = 10) -> list[list[Any]]:
    """``values`` in ``parts`` consecutive slices of about equal size, each of at least ``least``
    values (fewer slices if there are too few values)."""
    parts = max(1, min(parts, len(values) // least))
    size = -(-len(values) // parts) if values else 1
    return [values[i : i + size] for i in range(0, len(values), size)]


def noise(figures: list[float]) -> float:
    """How much one figure moves between stretches of the same run: half the range of the
    figure over the slices, relative to their median (0.25: +-25 %). The run-to-run noise that
    ``make bench`` allows before it marks a figure worse; 0 with fewer than two slices."""
    values = sorted(v for v in figures if v is not None)
    if len(values) < 2 or not values[len(values) // 2]:
        return 0.0
    return round((values[-1] - values[0]) / 2 / abs(values[len(values) // 2]), 3)


def _sample_noise(samples: list[tuple[float, int, float]]) -> dict[str, float]:
    """Noise of the throughput and of the CPU per execution, from the samples of a load's wait
    (time, executions done, CPU seconds) over the stretch where executions ended."""
    working = [s for s, t in itertools.pairwise(samples) if t[1] > s[1]]
    if len(working) < 2:
        return {}
    first, last = samples.index(working[0]), samples.index(working[-1]) + 1
    stretch = samples[first : last + 1]
    rates, cpus = [], []
    for part in slices(list(itertools.pairwise(stretch)), 4, least=2):
        done = part[-1][1][1] - part[0][0][1]
        seconds = part[-1][1][0] - part[0][0][0]
        if done > 0 and seconds > 0:
            rates.append(done / seconds)
            cpus.append((part[-1][1][2] - part[0][0][2]) * 1000 / done)
    return {"per_second": noise(rates), "cpu_ms_per_exec": noise(cpus)}


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def q(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 1)

    return {"p50": q(0.50), "p95": q(0.95), "p99": q(0.99), "max": round(ordered[-1], 1)}


class _StatementCounter:
    """Counts this process's own statements, to take them out of the commit figures."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        self.count += 1
        return execute(sql, params, many, context)


def _cpu_seconds(procs: list[ManagedProcess]) -> float:
    """CPU time (user + system) used so far by the processes of these process groups (a worker
    and its pool children; the monitor), from /proc."""
    groups = {proc.pid for proc in procs}
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) in groups:  # pgrp
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _commits() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Bench:
    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.owner = get_user_model().objects.get_or_create(username=BENCH_USER)[0]
        # The benchmark creates tens of thousands of tasks: lift its owner's quotas (0: no limit).
        owner_quota_set(owner=self.owner, max_tasks=0, max_executions_per_hour=0)
        self.results: list[Figures] = []
        #: The environment of the platform's processes for the runs through a pooler.
        self._through: dict[str, str] = {}

    # -- processes --------------------------------------------------------------------------

    # Any, not str: the values are strings, but start_worker's keyword options (split_stderr) share
    # the **env namespace, and mypy cannot tell these keys apart from them.
    def _env(self) -> dict[str, Any]:
        env = {"DJANGO_SETTINGS_MODULE": self.config.settings_module} if self.config.settings_module else {}
        return {**env, **self._through}

    @contextlib.contextmanager
    def _platform(self, *, monitor: bool = True) -> Iterator[tuple[list[ManagedProcess], ManagedProcess | None]]:
        workers = [
            start_worker(f"bench-worker-{i + 1}", log_dir=self.config.log_dir, concurrency=self.config.concurrency,
                         **self._env())
            for i in range(self.config.workers)
        ]  # fmt: skip
        mon = start_monitor("bench-monitor", log_dir=self.config.log_dir, **self._env()) if monitor else None
        try:
            for worker in workers:
                wait_ready(worker, timeout=120)  # a loaded shared machine starts Celery slowly
            yield workers, mon
        finally:
            for proc in [*workers, *([mon] if mon else [])]:
                proc.stop()

    @staticmethod
    def _monitor_stats(mon: ManagedProcess | None) -> dict[str, Any]:
        if mon is None:
            return {}
        return monitor_stats(mon.log()) or {}

    # -- the execution path -----------------------------------------------------------------

    def _run_load(
        self, name: str, plan: Plan, expected: int, then: Callable[[list[ManagedProcess], Figures], None] | None = None
    ) -> Figures:
        """Once the platform is up, create the tasks ``plan()`` gives, then measure from the start
        time it gives until ``expected`` executions end. The due times are chosen only then: a
        loaded machine can take longer to start a worker than the lead before the first run, and
        the wait for the platform would be counted as lateness. ``then`` runs afterwards with the
        same workers (the monitor idle), before they stop."""
        figures = Figures(name)
        samples: list[tuple[float, int, float]] = []
        with self._platform() as (procs, mon):
            specs, starts_at = plan()
            for chunk in range(0, len(specs), 2000):
                task_bulk_create(owner=self.owner, specs=specs[chunk : chunk + 2000])
            task_ids = list(Task.objects.filter(owner=self.owner).values_list("id", flat=True))
            counter = _StatementCounter()
            before = _commits()
            cpu_before = _cpu_seconds([*procs, *([mon] if mon else [])])
            with connection.execute_wrapper(counter):
                self._wait_done(
                    name, task_ids, expected, starts_at,
                    sample=lambda done: samples.append(
                        (time.monotonic(), done, _cpu_seconds([*procs, *([mon] if mon else [])]))
                    ),
                )  # fmt: skip
            cpu = _cpu_seconds([*procs, *([mon] if mon else [])]) - cpu_before
            if then is not None:
                then(procs, figures)
        connection.close()  # our own statistics are flushed when the connection ends
        time.sleep(1.0)
        commits = _commits() - before - counter.count
        executions = Execution.objects.filter(task_id__in=task_ids, status__in=TERMINAL_STATUSES)
        rows = list(executions.values_list("scheduled_for", "started_at", "finished_at"))
        figures.executions = len(rows)
        lateness = [(started - scheduled).total_seconds() * 1000 for scheduled, started, _ in rows if started]
        figures.lateness_ms = _quantiles(lateness)
        # Where the lateness goes: due -> taken by the monitor (enqueued_at) -> claimed by a worker.
        legs = [
            (due, taken, go)
            for due, taken, go in executions.values_list("due_at", "enqueued_at", "started_at")
            if taken is not None and go is not None
        ]
        figures.extra["take_lag_ms"] = _quantiles([(taken - due).total_seconds() * 1000 for due, taken, _ in legs])
        figures.extra["queue_lag_ms"] = _quantiles([(go - taken).total_seconds() * 1000 for _, taken, go in legs])
        by_due = [(started - scheduled).total_seconds() * 1000 for scheduled, started, _ in sorted(rows) if started]
        figures.extra.setdefault("noise", {}).update(
            {
                **{
                    f"lateness_{q}": noise([_quantiles(part)[q] for part in slices(by_due)])
                    for q in ("p50", "p95", "p99")
                },
                **_sample_noise(samples),
            }
        )
        last = executions.aggregate(last=Max("finished_at"))["last"]
        first_due = min(scheduled for scheduled, _, _ in rows) if rows else starts_at
        figures.seconds = max(1e-6, (last - first_due).total_seconds()) if last else 0.0
        figures.per_second = figures.executions / figures.seconds if figures.seconds else 0.0
        figures.commits_per_execution = round(commits / figures.executions, 2) if figures.executions else None
        if figures.executions:
            # Workers' and monitor's CPU (PostgreSQL's is shared with other users of the server).
            figures.extra["cpu_ms_per_exec"] = round(cpu * 1000 / figures.executions, 3)
        figures.monitor = self._monitor_stats(mon)
        return figures

    def _wait_done(
        self,
        name: str,
        task_ids: list[Any],
        expected: int,
        starts_at: datetime,
        timeout: float | None = None,
        sample: Callable[[int], None] | None = None,
    ) -> None:
        timeout = timeout or 120 + expected / 20
        deadline = time.monotonic() + timeout
        last_report = 0.0
        while True:
            done = Execution.objects.filter(task_id__in=task_ids, status__in=TERMINAL_STATUSES).count()
            if sample is not None:
                sample(done)
            if done >= expected:
                return
            if time.monotonic() > deadline:
                self.config.progress(f"{name}: gave up after {timeout:.0f}s with {done}/{expected} done")
                return
            if time.monotonic() - last_report >= 1:
                self.config.progress(f"{name}: {done}/{expected} executions done")
                last_report = time.monotonic()
            time.sleep(0.5)

    def _cleanup(self) -> None:
        """Delete what this run created (set-based: the scale scenario leaves a million tasks),
        then vacuum what the deletes left dead: the next scenario (or phase of one) starts on tables
        as the first did. Autovacuum lags behind deletes this size, and the dead index entries a
        query then steps over made the later phase slow: the workflows scenario's chains, run
        after the independent runs were deleted, went from 3.5 to 13 s on a database the
        benchmark had been run on a dozen times."""
        with connection.cursor() as cursor:
            for username in (BENCH_USER, FILLER_USER, BURST_USER, FAIR_USER):
                for statement in _CLEANUP:
                    cursor.execute(statement, [username] * statement.count("%s"))
        if connection.get_autocommit():
            with connection.cursor() as cursor:
                cursor.execute(f"VACUUM (ANALYZE) {', '.join(_VACUUMED)}")

    # -- scenarios --------------------------------------------------------------------------

    def burst(self, *, limited: bool = False) -> Figures:
        count = self.config.tasks
        lead = max(3.0, count / 2000 + 3.0)
        name = "burst"
        if limited:
            # Checked, never binding: every claim pays for the limit, none waits for it.
            limit_create(
                owner=self.owner, name="bench", max_concurrency=100_000, windows=[{"count": 1_000_000, "seconds": 1}]
            )
            name = "burst_limited"

        def plan() -> tuple[list[dict[str, Any]], datetime]:
            due = db_now() + timedelta(seconds=lead)
            extra = {"limits": ["bench"]} if limited else {}
            return [{"runner": "noop", "start_at": due, "name": f"burst {i}", **extra} for i in range(count)], due

        self.config.progress(f"{name}: {count} one-shot tasks due at one instant {lead:.0f}s ahead")
        figures = self._run_load(name, plan, count)
        rows = Execution.objects.filter(task__owner=self.owner).values_list("scheduled_for", "started_at")
        figures.extra["last_start_after_due_s"] = round(
            max((started - scheduled).total_seconds() for scheduled, started in rows if started), 3
        )
        figures.baseline_per_second = self.baseline(count)
        self._cleanup()
        return figures

    def herd(self) -> Figures:
        """The minute-boundary herd beside bare Celery's drain of as many pre-published no-ops
        (tooling/harness/herd.py)."""
        return self._herd("herd", self.config.herd_tasks, soon=self.config.herd_soon)

    def restore(self) -> Figures:
        """Tasks that appear with their one run due at once, none materialised (a restore, an
        import), through beat, the materialiser, the monitor and the workers, beside bare Celery's
        drain of as many pre-published no-ops: due instant to last start, every task run once."""
        return self._herd("restore", self.config.restore_tasks, restore=True)

    def _herd(
        self, name: str, tasks: int, *, soon: bool = False, restore: bool = False, bare_drain: bool = True
    ) -> Figures:
        from tooling.harness.herd import Herd, quantiles

        herd = Herd(
            owner_id=self.owner.pk,
            tasks=tasks,
            workers=self.config.workers,
            concurrency=self.config.herd_concurrency,
            monitors=self.config.monitors,
            log_dir=self.config.log_dir,
            env=self._env(),
            progress=self.config.progress,
            soon=soon,
            restore=restore,
        )
        tms = herd.run()
        self._cleanup()
        bare = herd.bare() if bare_drain else None
        figures = Figures(name)
        account = tms.account
        figures.executions = account.started
        figures.seconds = tms.seconds
        figures.per_second = account.started / tms.seconds if tms.seconds else 0.0
        figures.lateness_ms = {k: round(v * 1000, 1) for k, v in quantiles(account.lateness_s).items()}
        figures.commits_per_execution = (
            round(tms.commits / account.started, 2) if tms.commits and account.started else None
        )
        figures.monitor = tms.monitor[0] if tms.monitor else {}
        tms_cpu = tms.cpu_ms_per_execution()
        # The same without the idle wait before the due minute (HerdResult.idle_s): what the herd
        # itself costs, from its tasks' creation through its materialisation and its runs.
        herd_cpu = tms.cpu_ms_per_execution(without_idle=True)
        if bare is None:  # a run through a pooler: compared with the direct run, not bare Celery
            figures.extra.update(
                processes=f"{self.config.workers}x{self.config.herd_concurrency}, {self.config.monitors} monitor(s)",
                due_to_last_start_s=round(tms.seconds, 3),
                lost=account.lost,
                duplicated=account.duplicated,
                tasks_not_run_once=tms.not_once,
                cpu_ms_per_exec=tms_cpu,
                cpu_ms_per_exec_total=round(sum(tms_cpu.values()), 2),
                herd_cpu_ms_per_exec_total=round(sum(herd_cpu.values()), 2),
            )
            return figures
        figures.baseline_per_second = bare.account.started / bare.seconds if bare.seconds else None
        bare_cpu = bare.cpu_ms_per_execution()
        figures.extra.update(
            processes=f"{self.config.workers}x{self.config.herd_concurrency}, {self.config.monitors} monitor(s)",
            due_to_last_start_s=round(tms.seconds, 3),
            bare_drain_s=round(bare.seconds, 3),
            time_ratio=round(tms.seconds / bare.seconds, 2) if bare.seconds else None,
            lost=account.lost,
            duplicated=account.duplicated,
            tasks_not_run_once=tms.not_once,
            bare_lost=bare.account.lost,
            cpu_ms_per_exec=tms_cpu,
            cpu_ms_per_exec_total=round(sum(tms_cpu.values()), 2),
            bare_cpu_ms_per_task=bare_cpu,
            bare_cpu_ms_per_task_total=round(sum(bare_cpu.values()), 2),
            cpu_ratio=round(sum(tms_cpu.values()) / sum(bare_cpu.values()), 2) if sum(bare_cpu.values()) else None,
            idle_wait_s=tms.idle_s,
            idle_cpu_ms_per_s=tms.idle_cpu_ms_per_second(),
            idle_commits=tms.idle_commits,
            herd_cpu_ms_per_exec=herd_cpu,
            herd_cpu_ms_per_exec_total=round(sum(herd_cpu.values()), 2),
            herd_cpu_ratio=(
                round(sum(herd_cpu.values()) / sum(bare_cpu.values()), 2) if sum(bare_cpu.values()) else None
            ),
            herd_commits_per_exec=(
                round((tms.commits - tms.idle_commits) / account.started, 2)
                if tms.commits and account.started
                else None
            ),
        )
        return figures

    def fairness(self) -> Figures:
        """Owner A's herd and owner B's few runs due at one instant, through the real monitor and
        workers: each owner's lateness, and whether every run started exactly once."""
        herd, few = self.config.fair_herd, self.config.fair_few
        other = get_user_model().objects.get_or_create(username=FAIR_USER)[0]
        owner_quota_set(owner=other, max_tasks=0, max_executions_per_hour=0)
        # Long enough to create every task before the herd is due even on a loaded machine: the
        # point is one instant with everything due, not runs trickling in.
        lead = 5.0 + herd / 250
        due = db_now() + timedelta(seconds=lead)
        self.config.progress(
            f"fairness: owner A {herd} runs and owner B {few} runs due at one instant {lead:.0f}s ahead"
        )
        figures = Figures("fairness")
        with self._platform() as (_, mon):
            specs = [{"runner": "noop", "start_at": due, "name": f"herd {i}"} for i in range(herd)]
            for chunk in range(0, len(specs), 2000):
                task_bulk_create(owner=self.owner, specs=specs[chunk : chunk + 2000])
            task_bulk_create(
                owner=other, specs=[{"runner": "noop", "start_at": due, "name": f"few {i}"} for i in range(few)]
            )
            task_ids = list(Task.objects.filter(owner__in=[self.owner, other]).values_list("id", flat=True))
            counter = _StatementCounter()
            before = _commits()
            with connection.execute_wrapper(counter):
                # The herd drains at the workers' pace: wait for all of it (A's p99 needs it).
                self._wait_done("fairness", task_ids, herd + few, due, timeout=120 + (herd + few) / 4)
        connection.close()
        time.sleep(1.0)
        commits = _commits() - before - counter.count
        rows = list(
            Execution.objects.filter(task_id__in=task_ids).values_list(
                "id", "task__owner_id", "status", "scheduled_for", "started_at", "finished_at", "created_at"
            )
        )
        starts: dict[int, int] = {}
        for execution_id in ExecutionEvent.objects.filter(
            execution_id__in=[row[0] for row in rows], to_status=ExecutionStatus.RUNNING
        ).values_list("execution_id", flat=True):
            starts[execution_id] = starts.get(execution_id, 0) + 1
        finished = [row for row in rows if row[2] in TERMINAL_STATUSES]
        figures.executions = len(finished)
        last = max((row[5] for row in finished if row[5]), default=None)
        figures.seconds = max(1e-6, (last - due).total_seconds()) if last else 0.0
        figures.per_second = figures.executions / figures.seconds if figures.seconds else 0.0
        figures.commits_per_execution = round(commits / figures.executions, 2) if figures.executions else None
        figures.monitor = self._monitor_stats(mon)

        def lateness(owner_id: int) -> list[float]:
            # From the due time, or from the creation if the run was created after it was due
            # (a machine too loaded to create the herd within the lead): what the monitor and
            # the workers made it wait, not the benchmark's own setup.
            return [(r[4] - max(r[3], r[6])).total_seconds() * 1000 for r in rows if r[1] == owner_id and r[4]]

        figures.lateness_ms = _quantiles(lateness(self.owner.pk) + lateness(other.pk))
        figures.extra["owner_a_lateness_ms"] = _quantiles(lateness(self.owner.pk))
        figures.extra["owner_b_lateness_ms"] = _quantiles(lateness(other.pk))
        figures.extra["created_after_due"] = sum(1 for row in rows if row[6] > row[3])
        figures.extra["runs"] = len(rows)
        figures.extra["started_exactly_once"] = sum(1 for row in rows if starts.get(row[0]) == 1)
        figures.extra["started_twice_or_more"] = sum(1 for count in starts.values() if count > 1)
        figures.extra["never_started"] = sum(1 for row in rows if not starts.get(row[0]))
        self._cleanup()
        return figures

    def sustained(self, name: str = "sustained", rate: float | None = None, *, celery_eta: bool = True) -> Figures:
        rate = rate or self.config.rate or 100.0
        seconds = self.config.duration
        recurring = max(1, round(rate / 2))
        one_shots = round(rate / 2 * seconds)

        def plan() -> tuple[list[dict[str, Any]], datetime]:
            start = db_now() + timedelta(seconds=5)
            specs: list[dict[str, Any]] = [
                {"runner": "noop", "start_at": start + timedelta(seconds=i / recurring),
                 "interval": timedelta(seconds=1), "max_runs": int(seconds), "name": f"recurring {i}"}
                for i in range(recurring)
            ]  # fmt: skip
            specs += [
                {
                    "runner": "noop",
                    "start_at": start + timedelta(seconds=seconds * i / max(1, one_shots)),
                    "name": f"once {i}",
                }
                for i in range(one_shots)
            ]
            return specs, start

        expected = recurring * int(seconds) + one_shots
        self.config.progress(f"{name}: {rate:g}/s for {seconds:g}s ({recurring} recurring + {one_shots} one-shot)")
        then = partial(self._celery_eta, rate=rate, seconds=seconds) if celery_eta and self.config.celery_eta else None
        figures = self._run_load(name, plan, expected, then=then)
        figures.extra["target_rate"] = rate
        self._cleanup()
        return figures

    def _celery_eta(self, procs: list[ManagedProcess], figures: Figures, *, rate: float, seconds: float) -> None:
        """The comparison a Celery user would make: Celery's own ETA tasks (``apply_async(eta=)``,
        as ``countdown=`` sends them) at the same rate for the same time, on the same workers, all
        sent a few seconds ahead as the platform's tasks were created ahead. Their lateness (start
        minus ETA, logged by each task) and the workers' CPU per task go into ``figures.extra``."""
        from tooling.tasks import ETA_LINE, bench_eta

        count = max(1, round(rate * seconds))
        self.config.progress(f"celery eta: {count} ETA tasks at {rate:g}/s for {seconds:g}s on the same workers")
        logged = sum(proc.log().count(ETA_LINE) for proc in procs)
        cpu_before = _cpu_seconds(procs)
        start = time.time() + 1.5  # the workers are up: only the sending is ahead of the first
        with bench_eta.app.producer_or_acquire() as producer:
            for index in range(count):
                due = start + seconds * index / count
                bench_eta.apply_async(
                    args=(due,), eta=datetime.fromtimestamp(due, tz=UTC), producer=producer, priority=5
                )
        deadline = time.monotonic() + 1.5 + seconds + 60 + count / 20
        while time.monotonic() < deadline:
            if sum(proc.log().count(ETA_LINE) for proc in procs) - logged >= count:
                break
            time.sleep(0.5)
        cpu = _cpu_seconds(procs) - cpu_before
        lateness = [
            float(value)
            for proc in procs
            for value in re.findall(re.escape(ETA_LINE) + r"(-?[0-9.]+)", proc.log())[-count:]
        ]
        by_time = lateness  # in each worker's log order, which is start order
        figures.extra["celery_eta_lateness_ms"] = _quantiles(lateness)
        figures.extra["celery_eta_runs"] = len(lateness)
        if lateness:
            figures.extra["celery_eta_cpu_ms_per_task"] = round(cpu * 1000 / len(lateness), 2)
        figures.extra.setdefault("noise", {})["celery_eta_p50"] = noise(
            [_quantiles(part)["p50"] for part in slices(by_time)]
        )

    def _sustained_runs(self, burst: Figures | None, *, rate_asked: bool) -> Figures | None:
        """The sustained scenario's runs: at each share of this run's burst rate, else at ``rate``
        (given, or half the burst's) unless only fixed rates were asked for; then at each fixed
        rate. Returns the first (the figure other scenarios compare with)."""
        first: Figures | None = None
        if self.config.sustained_shares and burst is not None:
            for index, share in enumerate(self.config.sustained_shares):
                name = "sustained" if index == 0 else f"sustained_{round(share * 100)}"
                figures = self.sustained(name, rate=max(1.0, round(burst.per_second * share)))
                figures.extra["share_of_burst"] = share
                first = first or figures
                self.results.append(figures)
        elif rate_asked or not self.config.sustained_rates:
            first = self.sustained()
            self.results.append(first)
        for rate in self.config.sustained_rates:
            figures = self.sustained(f"sustained_at_{rate:g}", rate=rate)
            first = first or figures
            self.results.append(figures)
        return first

    def sustained_filled(self, empty: Figures | None) -> Figures:
        """The sustained load with ``scale_executions`` future executions of ``scale_tasks`` idle
        recurring tasks in the tables (named ``scale`` before issue 50 made that the cost curve)."""
        self._fill()
        try:
            figures = self.sustained("sustained_filled", celery_eta=False)  # compared with the sustained run
        finally:
            self.config.progress("sustained_filled: deleting the filler rows")
            self._cleanup()
        figures.extra["filler_executions"] = self.config.scale_executions
        figures.extra["filler_tasks"] = self.config.scale_tasks
        if empty is not None and empty.per_second:
            figures.extra["throughput_vs_empty"] = round(figures.per_second / empty.per_second, 3)
        return figures

    def scale(self) -> Figures:
        """Issue 50's cost curve (tooling/harness/scale_curve.py): for each of ``scale_sizes`` task
        counts, the every-minute runs' lateness, the materialiser's passes, CPU per run, bytes per
        row, resident memory and two list requests' p95; the plot to ``scale_plot``."""
        from tooling.harness.scale_curve import (
            CurveConfig,
            ScaleCurve,
            earlier_points,
            goal,
            staff_user,
            write_plot,
        )

        filler = get_user_model().objects.get_or_create(username=FILLER_USER)[0]
        owner_quota_set(owner=filler, max_tasks=0, max_executions_per_hour=0)
        config = self.config
        curve = ScaleCurve(
            owner_id=self.owner.pk,
            filler_id=filler.pk,
            staff=staff_user(),
            config=CurveConfig(
                sizes=config.scale_sizes,
                every_minute=config.scale_every_minute,
                minutes=config.scale_minutes,
                requests=config.scale_requests,
                workers=config.workers,
                concurrency=config.concurrency,
                monitors=config.monitors,
                keep_last=config.keep_history,
            ),
            log_dir=config.log_dir,
            env=self._env(),
            progress=config.progress,
            cleanup=self._cleanup,
        )
        points = curve.run()
        figures = Figures("scale")
        earlier = earlier_points(config.scale_with, besides=[point["size"] for point in points])
        if earlier:
            figures.extra["earlier_runs"] = [str(path) for path in config.scale_with]
        points = sorted([*earlier, *points], key=lambda point: point["size"])
        last = points[-1] if points else {}  # the largest size
        runs = last.get("every_minute_runs", {})
        figures.executions = int(runs.get("started", 0))
        figures.lateness_ms = dict(runs.get("lateness_ms", {}))
        figures.per_second = float(last.get("runs_per_second") or 0.0)  # every run's, in the window
        figures.seconds = 60.0 * config.scale_minutes
        figures.extra["points"] = points
        figures.extra["goal"] = goal(points)
        if config.scale_plot is not None and points:
            write_plot(points, config.scale_plot)
            figures.extra["plot"] = str(config.scale_plot)
        return figures

    def _fill(self) -> None:
        """Insert the sustained_filled scenario's idle rows set-based: recurring tasks not due for a day,
        and their future executions."""
        filler = get_user_model().objects.get_or_create(username=FILLER_USER)[0]
        tasks, per_task = self.config.scale_tasks, max(1, self.config.scale_executions // self.config.scale_tasks)
        self.config.progress(
            f"sustained_filled: inserting {tasks} recurring tasks and {tasks * per_task} future executions"
        )
        started = time.monotonic()
        with connection.cursor() as cursor:
            insert_tasks(
                cursor=cursor,
                owner_id=filler.pk,
                count=tasks,
                columns={
                    "start_at": "now() + interval '1 day'",
                    "interval": "interval '1 hour'",
                    "next_run_at": "now() + interval '1 day' + g * interval '1 millisecond'",
                    "runs_materialised": "%(per_task)s",
                },
                params={"per_task": per_task},
            )
            cursor.execute(
                """
                INSERT INTO executions_execution (task_id, scheduled_for, status, attempt, due_at, priority,
                    lease_owner, external_run_id, run_handle, message_id, output, error, owner_id, team_id)
                SELECT t.id, t.start_at + k * interval '1 hour', 'SCHEDULED', 1, t.start_at + k * interval '1 hour',
                    5, '', '', '{}', '', '', '', t.owner_id, t.team_id
                FROM tasks_app_task t CROSS JOIN generate_series(0, %s - 1) AS k
                WHERE t.owner_id = %s
                """,
                [per_task, filler.pk],
            )
            cursor.execute("ANALYZE tasks_app_task")
            cursor.execute("ANALYZE executions_execution")
        self.config.progress(f"sustained_filled: filled in {time.monotonic() - started:.1f}s")

    def baseline(self, count: int) -> float:
        """Bare Celery no-op tasks through the same broker, queue and worker settings; per second."""
        from tooling.tasks import bench_noop

        self.config.progress(f"baseline: {count} bare Celery no-op tasks")
        with self._platform(monitor=False) as (workers, _):
            started = time.monotonic()
            with bench_noop.app.producer_or_acquire() as producer:
                for _ in range(count):
                    bench_noop.apply_async(producer=producer, priority=5)
            deadline = started + 120 + count / 20
            last_report = 0.0
            while True:
                done = sum(proc.log().count("] succeeded in") for proc in workers)
                if done >= count or time.monotonic() > deadline:
                    break
                if time.monotonic() - last_report >= 1:
                    self.config.progress(f"baseline: {done}/{count} done")
                    last_report = time.monotonic()
                time.sleep(0.05)
            elapsed = time.monotonic() - started
        return count / elapsed

    def create(self) -> Figures:
        figures = Figures("create")
        port = _free_port()
        from accounts.account_keys import account_key_create

        token = account_key_create(user=self.owner)
        web = ManagedProcess(
            "bench-web",
            [sys.executable, "-m", "gunicorn", "tms_project.wsgi", "-b", f"127.0.0.1:{port}",
             "-w", "2", "-k", "gthread", "--threads", "4"],
            process_env(**self._env()),
            self.config.log_dir,
        )  # fmt: skip
        import requests

        session = requests.Session()
        session.headers["Authorization"] = f"Token {token}"
        url = f"http://127.0.0.1:{port}/api/v1/tasks"
        try:
            # gunicorn's workers boot slowly on a loaded machine: wait for the first 200 (a refused
            # connection or a slow answer both mean "not yet"), for up to a minute.
            ready_by = time.monotonic() + 60
            while time.monotonic() < ready_by:
                with contextlib.suppress(requests.ConnectionError, requests.Timeout):
                    if session.get(url, timeout=5).status_code == 200:
                        break
                time.sleep(0.1)
            latencies = []
            self.config.progress(f"create: {self.config.create_requests} single API requests")
            for index in range(self.config.create_requests):
                started = time.perf_counter()
                response = session.post(url, json={"runner": "noop", "name": f"api {index}"}, timeout=10)
                latencies.append((time.perf_counter() - started) * 1000)
                if response.status_code != 201:
                    raise RuntimeError(f"create answered {response.status_code}: {response.text[:300]}")
        finally:
            web.stop()
        figures.extra["api_single_ms"] = _quantiles(latencies)
        parts = [_quantiles(part) for part in slices(latencies)]
        figures.extra["noise"] = {
            "api_p50": noise([q["p50"] for q in parts]),
            "api_p99": noise([q["p99"] for q in parts]),
        }
        count = self.config.bulk_tasks
        self.config.progress(f"create: {count} tasks through the bulk service")
        start_at = db_now() + timedelta(hours=1)
        specs = [{"runner": "noop", "start_at": start_at, "name": f"bulk {i}"} for i in range(count)]
        started = time.perf_counter()
        rates = []
        for chunk in range(0, count, 1000):
            chunk_started = time.perf_counter()
            task_bulk_create(owner=self.owner, specs=specs[chunk : chunk + 1000])
            rates.append(len(specs[chunk : chunk + 1000]) / (time.perf_counter() - chunk_started))
        elapsed = time.perf_counter() - started
        figures.extra["bulk_tasks_per_second"] = round(count / elapsed)
        figures.extra["noise"]["bulk"] = noise([sum(part) / len(part) for part in slices(rates, 4, least=1)])
        figures.executions = count
        figures.seconds = elapsed
        figures.per_second = count / elapsed
        self._cleanup()
        return figures

    def dashboard(self) -> Figures:
        """Dashboard render time with ``scale_executions`` executions of ``scale_tasks`` tasks in
        the tables: the snapshot (and the page at ``/``, if the project serves one) for a staff
        user and for an owner of a tenth of the tasks; p50/p95 and queries per render."""
        figures = Figures("dashboard")
        self._fill_history()
        try:
            from django.test.utils import CaptureQueriesContext

            from executions.dashboard import dashboard_snapshot

            staff_name = f"{BENCH_USER}-staff"
            staff = get_user_model().objects.get_or_create(username=staff_name, defaults={"is_staff": True})[0]
            page = _dashboard_page()
            renders = self.config.dashboard_renders
            for label, user in (("staff", staff), ("owner", self.owner)):
                dashboard_snapshot(user=user)  # warm: plans and caches, as a running server has them
                timings, queries = [], []
                self.config.progress(f"dashboard: {renders} snapshots as {label}")
                for _ in range(renders):
                    with CaptureQueriesContext(connection) as captured:
                        started = time.perf_counter()
                        snapshot = dashboard_snapshot(user=user)
                        timings.append((time.perf_counter() - started) * 1000)
                    queries.append(len(captured))
                figures.extra[f"{label}_snapshot_ms"] = _quantiles(timings)
                figures.extra[f"{label}_queries"] = max(queries)
                figures.extra[f"{label}_runs_24h"] = sum(p.total for p in snapshot.runs_per_minute)
                if page is not None:
                    figures.extra[f"{label}_page_ms"], figures.extra[f"{label}_page_queries"] = page(user, renders)
                    for name, path in _execution_list_paths(user):
                        self.config.progress(f"dashboard: {renders} renders of {path} as {label}")
                        timed, counted = page(user, renders, path)
                        figures.extra[f"{label}_{name}_ms"], figures.extra[f"{label}_{name}_queries"] = timed, counted
            figures.executions = Execution.objects.count()
            figures.extra["tasks"] = Task.objects.count()
        finally:
            self.config.progress("dashboard: deleting the filler rows")
            self._cleanup()
        return figures

    def _fill_history(self) -> None:
        """A day and a half of history, set-based: ``scale_tasks`` recurring tasks (a tenth the
        bench user's, the rest the filler's) on three runners, ``scale_executions`` executions
        (mostly finished over the last 36 h: 90 % succeeded, 7 % failed, 3 % cancelled; plus
        running, pending, overdue and upcoming ones), skipped occurrences, and the rollup
        recounted from them as the trigger would have kept it."""
        from executions.rollup import rollup_compact, rollup_rebuild

        filler = get_user_model().objects.get_or_create(username=FILLER_USER)[0]
        tasks, total = self.config.scale_tasks, self.config.scale_executions
        live = max(4, total // 100)  # 1 %: a fifth running, a fifth pending, a fifth overdue, the rest upcoming
        finished = total - live
        self.config.progress(f"dashboard: inserting {tasks} tasks, {total} executions and their rollup")
        started = time.monotonic()
        with connection.cursor() as cursor:
            self._history_tasks(cursor, filler.pk, tasks)
            self._history_finished(cursor, filler.pk, tasks, finished)
            self._history_live(cursor, filler.pk, tasks, live)
            self._history_skips(cursor, filler.pk, tasks)
        counted = rollup_rebuild(since=db_now() - timedelta(hours=37))
        folded = rollup_compact()  # as beat does every minute: shards of past minutes folded
        with connection.cursor() as cursor:
            for table in ("tasks_app_task", "executions_execution", "executions_runrollup", "executions_taskrollup",
                          "executions_skippedoccurrence"):  # fmt: skip
                cursor.execute(f"VACUUM ANALYZE {table}")
        elapsed = time.monotonic() - started
        self.config.progress(f"dashboard: filled in {elapsed:.1f}s ({counted} counted, {folded} shard rows folded)")

    def _history_tasks(self, cursor: Any, filler_id: int, tasks: int) -> None:
        """The history's recurring tasks: a tenth the bench user's, the rest the filler's."""
        for owner, count in ((self.owner.pk, tasks // 10), (filler_id, tasks - tasks // 10)):
            insert_tasks(
                cursor=cursor,
                owner_id=owner,
                count=count,
                columns={
                    "runner": "(ARRAY['noop', 'sleep', 'http'])[1 + g %% 3]",
                    "start_at": "now() - interval '2 days'",
                    "interval": "interval '1 hour'",
                    "next_run_at": "now() + (g %% 7200) * interval '1 second'",
                },
            )

    def _history_finished(self, cursor: Any, filler_id: int, tasks: int, finished: int) -> None:
        """The finished executions, spread over the last 36 hours."""
        # Execution k belongs to task k mod tasks; its times are k's own, so (task,
        # scheduled_for) stays unique. Lateness 0.05-20 s, duration 0.01-600 s, log-ish spread.
        cursor.execute(
            """
            WITH t AS (SELECT id, owner_id, team_id, row_number() OVER (ORDER BY id) - 1 AS n FROM tasks_app_task
                       WHERE owner_id IN (%(bench)s, %(filler)s)),
            k AS (SELECT k, now() - (k * 129600.0 / %(finished)s) * interval '1 second' AS ended,
                         (0.05 * power(400, (k %% 97) / 96.0)) AS late,
                         (0.01 * power(60000, (k %% 89) / 88.0)) AS took
                  FROM generate_series(0, %(finished)s - 1) AS k)
            INSERT INTO executions_execution (task_id, scheduled_for, status, attempt, due_at, priority,
                lease_owner, external_run_id, run_handle, message_id, output, error,
                enqueued_at, started_at, finished_at, owner_id, team_id)
            SELECT t.id, k.ended - (k.took + k.late) * interval '1 second',
                CASE WHEN k.k %% 100 < 90 THEN 'SUCCEEDED' WHEN k.k %% 100 < 97 THEN 'FAILED' ELSE 'CANCELLED' END,
                1, k.ended - (k.took + k.late) * interval '1 second', 5, '', '', '{}', '', '', '',
                k.ended - k.took * interval '1 second', k.ended - k.took * interval '1 second', k.ended, t.owner_id,
                t.team_id
            FROM k JOIN t ON t.n = k.k %% %(tasks)s
            """,
            {"bench": self.owner.pk, "filler": filler_id, "finished": finished, "tasks": tasks},
        )

    def _history_live(self, cursor: Any, filler_id: int, tasks: int, live: int) -> None:
        """The live executions: running, pending, overdue and upcoming."""
        cursor.execute(
            f"""
            WITH t AS (SELECT id, owner_id, team_id, row_number() OVER (ORDER BY id) - 1 AS n FROM tasks_app_task
                       WHERE owner_id IN (%(bench)s, %(filler)s))
            INSERT INTO executions_execution (task_id, scheduled_for, status, attempt, due_at, priority,
                lease_owner, lease_expires_at, external_run_id, run_handle, message_id, output, error,
                enqueued_at, started_at, owner_id, team_id)
            SELECT t.id, {LIVE_ROWS}
                CASE WHEN 5 * k < 2 * %(live)s THEN now() END, CASE WHEN 5 * k < %(live)s THEN now() END,
                t.owner_id, t.team_id
            FROM generate_series(0, %(live)s - 1) AS k JOIN t ON t.n = (k * 7919) %% %(tasks)s
            """,  # noqa: S608 - LIVE_ROWS is a constant of this harness
            {"bench": self.owner.pk, "filler": filler_id, "live": live, "tasks": tasks},
        )

    def _history_skips(self, cursor: Any, filler_id: int, tasks: int) -> None:
        """Skipped occurrences of the last day, a fifth as many as the tasks."""
        cursor.execute(
            """
            WITH t AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM tasks_app_task
                       WHERE owner_id IN (%(bench)s, %(filler)s))
            INSERT INTO executions_skippedoccurrence (task_id, scheduled_for, reason, detail, recorded_at)
            SELECT t.id, now() - (g * 86400.0 / %(skips)s) * interval '1 second',
                (ARRAY['missed', 'coalesced', 'paused', 'overlap'])[1 + g %% 4], '',
                now() - (g * 86400.0 / %(skips)s) * interval '1 second'
            FROM generate_series(0, %(skips)s - 1) AS g JOIN t ON t.n = g %% %(tasks)s
            """,
            {"bench": self.owner.pk, "filler": filler_id, "skips": max(1, tasks // 5), "tasks": tasks},
        )

    def pages(self) -> Figures:
        """Every back-office page's server time (:mod:`tooling.harness.pages`) with the dashboard
        scenario's history (``scale_executions`` executions of ``scale_tasks`` tasks), as staff and
        as the owner of a tenth of the tasks. ``--keep-history`` keeps the rows afterwards and
        times the ones already there, so a change can be measured before and after on one fill."""
        from tooling.harness.pages import time_pages

        figures = Figures("pages")
        reuse = self.config.keep_history and Execution.objects.filter(owner_id=self.owner.pk).exists()
        try:
            if reuse:
                self.config.progress("pages: reusing the history already there (--keep-history)")
            else:
                self._cleanup()
                self._fill_history()
            self._pages_limit()
            # A superuser: staff who may also change others' tasks, so every page (the edit form too) answers.
            staff = get_user_model().objects.update_or_create(
                username=f"{BENCH_USER}-admin", defaults={"is_staff": True, "is_superuser": True}
            )[0]
            users = [("staff", staff), ("owner", self.owner)]
            figures.extra = time_pages(users, self.config.dashboard_renders, self.config.progress)
            figures.executions = Execution.objects.count()
            figures.extra["tasks"] = Task.objects.count()
        finally:
            if not self.config.keep_history:
                self.config.progress("pages: deleting the filler rows")
                self._cleanup()
        return figures

    def _pages_limit(self) -> None:
        """A named limit of the owner's, named by a hundred of its tasks and with a budget, so that
        the limit pages (the list's use column, a limit's page) read real rows at this scale."""
        from executions.models import LimitBucket
        from tasks_api.limits import task_set_limits

        limit = Limit.objects.filter(owner=self.owner, name="bench-pages").first()
        if limit is None:
            limit = limit_create(owner=self.owner, name="bench-pages", max_concurrency=5)
        with transaction.atomic():  # task_set_limits runs in the caller's transaction, the task locked
            for task in Task.objects.select_for_update().filter(owner=self.owner).order_by("pk")[:100]:
                task_set_limits(task=task, limits=[limit])
        LimitBucket.objects.get_or_create(limit=limit, key=limit.name)

    # -- big history: the API's lists, and pruning ------------------------------------------

    def lists(self) -> Figures:
        """The API's execution lists (and the task list, a task's why, one execution, the archive
        list) with ``scale_executions`` executions of ``scale_tasks`` tasks, all of one owner
        (:mod:`tooling.harness.history`), timed over real HTTP through gunicorn as that owner
        and as staff, with CPU per request and a trivial path's time beside them; then each path
        once in process with its queries and the plan of its slowest
        (:mod:`tooling.harness.api_lists`)."""
        from tooling.harness.api_lists import list_paths, profile_in_process, time_over_http
        from tooling.harness.history import fill_history, index_sizes

        figures = Figures("lists")
        mine = Execution.objects.filter(task__owner=self.owner)
        reuse = self.config.keep_history and mine.exists()
        try:
            if reuse:
                self.config.progress("lists: reusing the history already there (--keep-history)")
                figures.extra["index_bytes"] = index_sizes()
            else:
                self._cleanup()
                filled = fill_history(
                    owner_id=self.owner.pk,
                    executions=self.config.scale_executions,
                    tasks=self.config.scale_tasks,
                    progress=self.config.progress,
                )
                figures.extra["fill"] = {
                    "seconds": round(filled.seconds, 1),
                    "index_seconds": filled.index_seconds,
                    "rows_per_second": round(filled.rows_per_second),
                    "events": filled.events,
                    "archive_entries": filled.archive_entries,
                }
                figures.extra["index_bytes"] = filled.index_bytes
            staff = get_user_model().objects.get_or_create(username=f"{BENCH_USER}-staff", defaults={"is_staff": True})[
                0
            ]
            paths = list_paths(self.owner)
            figures.extra["paths"] = dict(paths)
            figures.extra["http"] = time_over_http(
                users={"owner": self.owner, "staff": staff},
                paths=paths,
                requests=self.config.list_requests,
                settings_module=self.config.settings_module,
                log_dir=self.config.log_dir,
                progress=self.config.progress,
            )
            self.config.progress("lists: each path once in process, with its queries and plans")
            figures.extra["profile"] = profile_in_process(user=self.owner, paths=paths)
            figures.executions = mine.count()
        finally:
            if not self.config.keep_history:
                self.config.progress("lists: deleting the filler rows")
                self._cleanup()
        return figures

    def prune(self) -> Figures:
        """Pruning and archiving ``scale_executions`` executions (every task keeps its latest run
        only), and the lateness of a burst of ``tasks`` one-shot tasks through real workers while
        it runs, beside the same burst without pruning."""
        import shutil
        import tempfile
        import threading

        from django.db import connections
        from django.test import override_settings

        from executions.retention import PruneReport, retention_prune

        figures = Figures("prune")
        self._fill_history()
        archive = tempfile.mkdtemp(prefix="tms-bench-archive-")
        storages = {
            **settings.STORAGES,
            "tms_archive": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": archive}},
        }
        try:
            history = Task.objects.filter(owner__username__in=[BENCH_USER, FILLER_USER])
            history.update(keep_last=1, keep_for=timedelta(hours=1))
            # The history's running, pending and waiting rows would be work for the workers ahead
            # of the bursts: end them, so both bursts meet idle workers and only pruning differs.
            Execution.objects.filter(task__in=history, status__in=["SCHEDULED", "PENDING", "RUNNING"]).update(
                status="CANCELLED", finished_at=db_now(), lease_owner="", lease_expires_at=None
            )
            history.update(status="PAUSED")
            burst_owner = get_user_model().objects.get_or_create(username=BURST_USER)[0]
            bench_owner, self.owner = self.owner, burst_owner
            try:
                self.config.progress("prune: the burst without pruning")
                alone = self._burst_lateness("alone")
                report: dict[str, PruneReport] = {}

                def run_prune() -> None:
                    try:
                        with override_settings(STORAGES=storages):
                            report["done"] = retention_prune(
                                progress=lambda r: (
                                    self.config.progress(f"prune: {r.executions} pruned")
                                    if r.files % 100 == 0
                                    else None
                                )
                            )
                    finally:
                        connections.close_all()

                pruner = threading.Thread(target=run_prune)
                pruner.start()
                time.sleep(3.0)
                self.config.progress("prune: the same burst while pruning")
                during = self._burst_lateness("during")
                still = pruner.is_alive()
                pruner.join()
            finally:
                self.owner = bench_owner
            done = report["done"]
            figures.executions = done.executions
            figures.seconds = done.seconds
            figures.per_second = done.executions / done.seconds if done.seconds else 0.0
            figures.lateness_ms = during
            figures.extra["lateness_without_pruning_ms"] = alone
            figures.extra["pruning_outlasted_burst"] = still
            figures.extra["events_pruned"] = done.events
            figures.extra["archive_files"] = done.files
            figures.extra["archive_bytes"] = sum(p.stat().st_size for p in Path(archive).rglob("*.gz"))
        finally:
            shutil.rmtree(archive, ignore_errors=True)
            self.config.progress("prune: deleting the filler rows")
            self._cleanup()
        return figures

    def workflows(self) -> Figures:
        """``workflow_runs`` workflow runs of ``workflow_steps`` chained noop steps (each step's
        task follows the one before), against as many independent noop runs as they have steps,
        on the same processes in the same run. Both are due at one instant; each figure is the
        time from that instant to the last run's end (issue 31: the chains within 1.3x of the
        independent runs). What the chains add: each step is created in the transaction that ends
        the one before, then taken by the monitor (which that insert wakes) and claimed."""
        runs, steps = self.config.workflow_runs, self.config.workflow_steps
        count = runs * steps
        # Creating the chains (their dependencies checked for cycles) before the roots are due.
        lead = max(3.0, count / 800 + 3.0)

        def independent() -> tuple[list[dict[str, Any]], datetime]:
            due = db_now() + timedelta(seconds=lead)
            return [{"runner": "noop", "start_at": due, "name": f"flat {i}"} for i in range(count)], due

        def chained() -> tuple[list[dict[str, Any]], datetime]:
            # The roots are created first (each later step names the one before), due well
            # after any creation could end, and brought forward once the last step's task
            # exists: with a fixed lead, a loaded machine still created the later steps' tasks
            # when the first steps ended, and those chains stopped there (nothing followed yet).
            # Within the materialising horizon, so that each root's run exists at once.
            parked = db_now() + timedelta(seconds=0.8 * tms_settings().MATERIALISE_HORIZON)
            previous: list[Any] = []
            roots: list[Any] = []
            for step in range(steps):
                created: list[Any] = []
                for chunk in range(0, runs, 1000):
                    created += task_bulk_create(
                        owner=self.owner,
                        specs=[
                            {"runner": "noop", "name": f"flow {i} step {step + 1}"}
                            | ({"after": [{"task": str(previous[i].pk)}]} if step else {"start_at": parked})
                            for i in range(chunk, min(runs, chunk + 1000))
                        ],
                    )
                previous = created
                roots = roots or created
            return [], _bring_forward([root.pk for root in roots], seconds=3.0)

        self.config.progress(f"workflows: {count} independent noop runs due at one instant {lead:.0f}s ahead")
        flat = self._run_load("workflows_independent", independent, count)
        self._cleanup()
        self.config.progress(f"workflows: {runs} workflow runs of {steps} chained noop steps, due {lead:.0f}s ahead")
        figures = self._run_load("workflows", chained, count)
        figures.extra = {
            "workflow_runs": runs,
            "steps": steps,
            "seconds": round(figures.seconds, 3),
            "independent_seconds": round(flat.seconds, 3),
            "time_ratio": round(figures.seconds / flat.seconds, 3) if flat.seconds else None,
            "cpu_ms_per_exec": figures.extra.get("cpu_ms_per_exec"),
            "independent_cpu_ms_per_exec": flat.extra.get("cpu_ms_per_exec"),
            "commits_per_exec": figures.commits_per_execution,
            "independent_commits_per_exec": flat.commits_per_execution,
        }
        figures.lateness_ms = {}  # a step is due when the one before ends: no lateness to read
        figures.baseline_per_second = flat.per_second
        self._cleanup()
        if self.config.workflow_map_runs:
            figures.extra["map"] = self._workflow_maps(flat if count == self._map_items() else None)
        return figures

    def _map_items(self) -> int:
        return self.config.workflow_map_runs * self.config.workflow_map_items

    def _workflow_maps(self, flat: Figures | None) -> dict[str, Any]:
        """``workflow_map_runs`` workflow runs of a root (a ``subprocess`` echo of the list), a map
        step of ``workflow_map_items`` noop items (``map_concurrency`` the items: the bound does not
        bind) and a noop join after it, against as many independent noop runs as there are items
        (those of the chains' phase when the counts are equal). Each figure is the time from the
        due instant to the last run's end; the map-and-join's runs/s counts its items. Counted
        after: the items not run once per workflow run and index (lost, duplicated), the joins that
        did not get every item's document."""
        runs, items = self.config.workflow_map_runs, self.config.workflow_map_items
        count = runs * items
        if flat is None:
            lead = max(3.0, count / 800 + 3.0)

            def independent() -> tuple[list[dict[str, Any]], datetime]:
                due = db_now() + timedelta(seconds=lead)
                return [{"runner": "noop", "start_at": due, "name": f"flat {i}"} for i in range(count)], due

            self.config.progress(f"workflows: {count} independent noop runs due at one instant {lead:.0f}s ahead")
            flat = self._run_load("workflows_map_independent", independent, count)
            self._cleanup()

        def mapped() -> tuple[list[dict[str, Any]], datetime]:
            # As the chains': roots parked within the materialising horizon, brought forward once
            # every map step and join exists.
            parked = db_now() + timedelta(seconds=0.8 * tms_settings().MATERIALISE_HORIZON)
            roots: list[Any] = []
            for chunk in range(0, runs, 500):
                block = range(chunk, min(runs, chunk + 500))
                heads = task_bulk_create(
                    owner=self.owner,
                    specs=[
                        {"runner": "sleep", "config": {"for": "0s"}, "start_at": parked, "name": f"map {i} list"}
                        for i in block
                    ],
                )  # fmt: skip
                maps = task_bulk_create(
                    owner=self.owner,
                    specs=[
                        {"runner": "noop", "name": f"map {i} item", "after": [{"task": str(head.pk)}],
                         "map_over": "$.items", "map_concurrency": min(1000, items)}
                        for i, head in zip(block, heads, strict=True)
                    ],
                )  # fmt: skip
                task_bulk_create(
                    owner=self.owner,
                    specs=[
                        {"runner": "noop", "name": f"map {i} join", "after": [{"task": str(step.pk)}]}
                        for i, step in zip(block, maps, strict=True)
                    ],
                )
                roots += heads
            # The roots hand their input on as their output (a 0 s pause): the list to map costs
            # no process of its own (an echo's supervisor is a Python start per root, which was
            # most of the phase on two cores), as the independent runs cost none.
            listing = {"items": list(range(items))}
            return [], _bring_forward([root.pk for root in roots], seconds=3.0, run_input=listing)

        expected = runs * (items + 2)
        self.config.progress(f"workflows: {runs} workflow runs mapping {items} noop items each, then a join")
        figures = self._run_load("workflows_map", mapped, expected)
        counted = _map_counts(self.owner, runs=runs, items=items)
        self._cleanup()
        seconds = figures.seconds
        return {
            "workflow_runs": runs,
            "items": items,
            "executions": figures.executions,
            "seconds": round(seconds, 3),
            "items_per_second": round(count / seconds, 1) if seconds else None,
            "independent_seconds": round(flat.seconds, 3),
            "independent_per_second": round(flat.per_second, 1),
            "time_ratio": round(seconds / flat.seconds, 3) if flat.seconds else None,
            "cpu_ms_per_exec": figures.extra.get("cpu_ms_per_exec"),
            "independent_cpu_ms_per_exec": flat.extra.get("cpu_ms_per_exec"),
            "commits_per_exec": figures.commits_per_execution,
            **counted,
        }

    def _burst_lateness(self, name: str) -> dict[str, float]:
        count = self.config.tasks
        lead = max(3.0, count / 2000 + 3.0)

        def plan() -> tuple[list[dict[str, Any]], datetime]:
            due = db_now() + timedelta(seconds=lead)
            return [{"runner": "noop", "start_at": due, "name": f"burst {i}"} for i in range(count)], due

        figures = self._run_load(f"prune-{name}", plan, count)
        with connection.cursor() as cursor:
            for statement in _CLEANUP:
                cursor.execute(statement, [BURST_USER] * statement.count("%s"))
        return figures.lateness_ms

    # -- all --------------------------------------------------------------------------------

    def run(self) -> list[Figures]:
        if not self.config.keep_history:  # the lists scenario reuses the history it kept
            self._cleanup()
        burst = sustained = None
        rate_asked = self.config.rate is not None  # the burst sets it when it is not
        for scenario in self.config.scenarios:
            if scenario == "burst":
                burst = self.burst()
                self.results.append(burst)
                if self.config.with_limit:
                    self.results.append(self.burst(limited=True))
                if self.config.rate is None and burst.per_second:
                    self.config.rate = round(burst.per_second / 2)
            elif scenario == "herd":
                self.results.append(self.herd())
            elif scenario == "restore":
                self.results.append(self.restore())
            elif scenario == "sustained":
                sustained = self._sustained_runs(burst, rate_asked=rate_asked)
            elif scenario == "sustained_filled":
                self.results.append(self.sustained_filled(sustained))
            elif scenario == "scale":
                self.results.append(self.scale())
            elif scenario == "create":
                self.results.append(self.create())
            elif scenario == "dashboard":
                self.results.append(self.dashboard())
            elif scenario == "lists":
                self.results.append(self.lists())
            elif scenario == "prune":
                self.results.append(self.prune())
            elif scenario == "fairness":
                self.results.append(self.fairness())
            elif scenario == "pages":
                self.results.append(self.pages())
            elif scenario == "workflows":
                self.results.append(self.workflows())
            self.config.progress(f"{scenario}: done")
        if "pgbouncer" in self.config.through:
            self.results += self.through_pgbouncer()
        if "ha" in self.config.through:
            self.results += self.through_ha()
        return self.results

    def through_pgbouncer(self) -> list[Figures]:
        """The steady load and the herd of this run again, with the workers, monitors and beat
        going through a private PgBouncer in transaction pooling mode in front of the same
        PostgreSQL (``TMS_DATABASE_POOLER=transaction``; the monitors' LISTEN straight to
        PostgreSQL, ``TMS_LISTEN_DATABASE_URL``, as docs/deployment.md says to run it). Each result
        (``sustained@pgbouncer``, ``herd@pgbouncer``) carries PgBouncer's own CPU per run and its
        ratios to the direct run of the same scenario (``vs_direct``)."""
        from tooling.harness.pgbouncer import PgBouncer

        direct = {f.scenario: f for f in self.results if f.scenario in THROUGH_SCENARIOS}
        db = connection.settings_dict
        host, port = db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)
        auth = quote(db["USER"], safe="") + (f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else "")
        pooled: list[Figures] = []
        with PgBouncer(server_host=host, server_port=port, pool_size=self.config.pgbouncer_pool) as bouncer:
            assert bouncer.popen is not None
            self._through = {
                "DATABASE_URL": f"postgres://{auth}@127.0.0.1:{bouncer.port}/{db['NAME']}",
                "TMS_DATABASE_POOLER": "transaction",
                "TMS_LISTEN_DATABASE_URL": f"postgres://{auth}@{host}:{port}/{db['NAME']}",
            }
            self.config.progress(
                f"through pgbouncer: 127.0.0.1:{bouncer.port}, transaction pooling, pool {self.config.pgbouncer_pool}"
            )
            try:
                for scenario, reference in direct.items():
                    name = f"{scenario}@pgbouncer"
                    cpu_before = _process_cpu(bouncer.popen.pid)
                    if scenario == "sustained":
                        figures = self.sustained(name, rate=reference.extra.get("target_rate"), celery_eta=False)
                    else:
                        figures = self._herd(name, self.config.herd_tasks, soon=self.config.herd_soon, bare_drain=False)
                    bouncer_cpu = _process_cpu(bouncer.popen.pid) - cpu_before
                    figures.extra["through"] = f"pgbouncer (transaction pooling, pool {self.config.pgbouncer_pool})"
                    figures.extra["pgbouncer_cpu_ms_per_exec"] = (
                        round(bouncer_cpu * 1000 / figures.executions, 2) if figures.executions else None
                    )
                    figures.extra["vs_direct"] = through_ratios(reference, figures)
                    pooled.append(figures)
                    self.config.progress(f"{name}: done")
            finally:
                self._through = {}
        return pooled

    def through_ha(self, topology: tuple[PgCluster, RabbitCluster] | None = None) -> list[Figures]:
        """The steady load and the herd again, on one PostgreSQL and one RabbitMQ node and on the
        high-availability topology of docs/deployment.md: a Patroni pair (synchronous replication,
        TMS given the libpq multi-host URL with ``target_session_attrs=read-write``) and a
        three-node RabbitMQ cluster (TMS given the three nodes as a failover list,
        ``TMS_QUEUE_TYPE=quorum``), private ones started here unless ``topology`` is given.

        The topology's database is another server, so both runs are ``tms_bench`` processes of
        their own with the same options (this run's rate and sizes), one given this run's database
        and broker, the other the topology's: the same code measures both, and the servers' CPU
        (PostgreSQL and RabbitMQ; on the topology etcd, both Patroni-managed servers and the
        three nodes) is read around each. Results: ``<scenario>@single-node`` and
        ``<scenario>@ha``, the latter with its ratios to the former (``vs_direct``)."""
        scenarios = [name for name in THROUGH_SCENARIOS if name in self.config.scenarios]
        direct = {f.scenario: f for f in self.results}
        rate = (direct["sustained"].extra.get("target_rate") if "sustained" in direct else None) or self.config.rate
        argv = [
            sys.executable, str(ROOT / "manage.py"), "tms_bench", "--prepare", "--no-celery-eta",
            "--duration", str(self.config.duration), "--workers", str(self.config.workers),
            "--concurrency", str(self.config.concurrency), "--herd-tasks", str(self.config.herd_tasks),
            "--herd-concurrency", str(self.config.herd_concurrency), "--monitors", str(self.config.monitors),
            *(arg for name in scenarios for arg in ("--scenario", name)),
            *(("--rate", str(rate)) if rate else ()), *(("--herd-soon",) if self.config.herd_soon else ()),
        ]  # fmt: skip
        self.config.progress("through ha: the same scenarios on one PostgreSQL and one RabbitMQ node first")
        single = self._child_bench(argv, process_env(), _local_server_pids(), label="single-node")
        with contextlib.ExitStack() as stack:
            if topology is None:
                self.config.progress("through ha: starting a Patroni pair and a three-node RabbitMQ cluster")
                topology = (stack.enter_context(PgCluster()), stack.enter_context(RabbitCluster()))
            pair, rabbit = topology
            env = process_env(DATABASE_URL=pair.url, CELERY_BROKER_URL=rabbit.url, TMS_QUEUE_TYPE="quorum")
            ha = self._child_bench(argv, env, _cluster_pids(pair, rabbit), label="ha")
        reference = {f.scenario.split("@", 1)[0]: f for f in single}
        for figures in ha:
            base = reference.get(figures.scenario.split("@", 1)[0])
            if base is not None:
                figures.extra["reference"] = base.scenario
                figures.extra["vs_direct"] = through_ratios(base, figures)
        return single + ha

    def _child_bench(self, argv: list[str], env: dict[str, str], servers: list[int], *, label: str) -> list[Figures]:
        """Run ``argv`` (a ``tms_bench`` of its own) with ``env``, its lines passed on as progress,
        and return its figures named ``<scenario>@<label>``, each with the CPU per run of the
        ``servers`` (process trees) over the whole child run. A child that fails fails this run."""
        tail: list[str] = []
        with tempfile.TemporaryDirectory(prefix="tms-bench-") as folder:
            out = Path(folder) / "figures.json"
            cpu_before = _tree_cpu(servers) if servers else None
            with subprocess.Popen(
                [*argv, "--json", str(out)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True,
            ) as child:  # fmt: skip
                assert child.stdout is not None
                for line in child.stdout:
                    tail = [*tail[-20:], line.rstrip()]
                    if line.strip():
                        self.config.progress(f"{label}: {line.strip()}")
            if child.returncode:
                raise RuntimeError(f"the {label} benchmark failed ({child.returncode}):\n" + "\n".join(tail))
            servers_cpu = _tree_cpu(servers) - cpu_before if cpu_before is not None else None
            results = [_figures(row) for row in json.loads(out.read_text())["results"]]
        runs = sum(f.executions for f in results)
        for figures in results:
            figures.scenario = f"{figures.scenario}@{label}"
            figures.extra["through"] = HA_LABELS.get(label, label)
            # Over the child's whole run: its scenarios share the servers' CPU by their runs.
            figures.extra["servers_cpu_ms_per_exec"] = (
                round(servers_cpu * 1000 / runs, 2) if servers_cpu is not None and runs else None
            )
        return results


def _figures(row: dict[str, Any]) -> Figures:
    """A :class:`Figures` back from a row of ``run_bench``'s JSON (its ``ratio`` is computed)."""
    row = dict(row)
    row.pop("ratio", None)
    return Figures(**row)


def _cluster_pids(pair: PgCluster, rabbit: RabbitCluster) -> list[int]:
    """The processes at the root of the HA topology's servers: etcd, each Patroni (its
    PostgreSQL below it) and each RabbitMQ node."""
    popens = [pair.etcd, *(node.popen for node in pair.nodes), *(node.popen for node in rabbit.nodes)]
    return [popen.pid for popen in popens if popen is not None]


def _local_server_pids() -> list[int]:
    """The postmaster of this run's PostgreSQL (the parent of this connection's backend) and the
    RabbitMQ node's Erlang VM, when they run on this machine and can be seen; [] otherwise
    (a server elsewhere: its CPU is not this machine's to read, and a pid it names would be
    another process's here)."""
    loopback = {"", "127.0.0.1", "localhost", "::1"}
    database_host = str(connection.settings_dict.get("HOST") or "")
    broker_host = urlsplit(str(settings.CELERY_BROKER_URL).split(";")[0]).hostname or ""
    if (database_host not in loopback and not database_host.startswith("/")) or broker_host not in loopback:
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    try:
        postmaster = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
        answer = subprocess.run(
            ["rabbitmqctl", "eval", "os:getpid()."], capture_output=True, text=True, timeout=30, check=True
        )
        beam = int(answer.stdout.strip().strip('"'))
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return []
    return [postmaster, beam]


def _tree_cpu(roots: list[int]) -> float:
    """CPU seconds used so far by the processes ``roots`` and every live descendant, with what
    their ended children used (a process's own user and system time, and its reaped children's:
    a PostgreSQL backend that has ended is counted in its postmaster)."""
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry)] = int(fields[1])
                stats[int(entry)] = fields
    tree, frontier = set(), [pid for pid in roots if pid in stats]
    while frontier:
        pid = frontier.pop()
        tree.add(pid)
        frontier += [child for child, parent in parents.items() if parent == pid and child not in tree]
    ticks = sum(int(stats[pid][i]) for pid in tree for i in (11, 12, 13, 14))
    return ticks / os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) one process has used so far, from /proc (0 if it is gone)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def _map_counts(owner: Any, *, runs: int, items: int) -> dict[str, Any]:
    """The map-and-join phase's runs, counted per workflow run: items lost (an index of 0 to
    ``items - 1`` with no ended run), items duplicated (a second run of one index), joins that did
    not run or did not get ``items`` documents, and workflow runs seen (``runs`` expected)."""
    lost = duplicated = joins_short = 0
    seen: dict[int | None, dict[int, int]] = {}
    joins: dict[int | None, Any] = {}
    rows = Execution.objects.filter(task__owner=owner, task__name__startswith="map ").values_list(
        "task__name", "workflow_run", "map_index", "status", "input"
    )
    for name, workflow_run, index, status, run_input in rows:
        if name.endswith(" item") and index is not None:
            per_index = seen.setdefault(workflow_run, {})
            if status in TERMINAL_STATUSES:
                per_index[index] = per_index.get(index, 0) + 1
        elif name.endswith(" join"):
            joins[workflow_run] = run_input
    for per_index in seen.values():
        lost += sum(1 for index in range(items) if not per_index.get(index))
        duplicated += sum(found - 1 for found in per_index.values() if found > 1)
    lost += items * max(0, runs - len(seen))
    # An index run twice to its end: a second terminal event on one run (a second run of an index
    # is counted above; the unique index on task, workflow run and map_index refuses it anyway).
    duplicated += (
        ExecutionEvent.objects.filter(
            execution__task__owner=owner, execution__task__name__startswith="map ", to_status__in=TERMINAL_STATUSES
        )
        .values("execution")
        .annotate(ends=Count("id"))
        .filter(ends__gt=1)
        .count()
    )
    joins_short = runs - sum(1 for got in joins.values() if isinstance(got, list) and len(got) == items)
    return {
        "map_runs_seen": len(seen),
        "lost": lost,
        "duplicated": duplicated,
        "joins_short": joins_short,
        "phases": _map_phases(owner),
    }


def _map_phases(owner: Any) -> dict[str, float | None]:
    """Where the map-and-join's time went: seconds from the roots' due instant (their earliest
    ``scheduled_for``) to the roots' start and end, the items' creation, publishing, start and end, and the
    joins' end (each the median and the last, ``p50``/``max``): what a slow phase is made of."""
    kinds = {"list": "roots", "item": "items", "join": "joins"}
    phases: dict[str, float | None] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT split_part(t.name, ' ', 3) AS kind,"  # noqa: S608 - our table names only
            " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.created_at)),"
            " max(extract(epoch FROM e.created_at)),"
            " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.enqueued_at)),"
            " max(extract(epoch FROM e.enqueued_at)),"
            " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.started_at)),"
            " max(extract(epoch FROM e.started_at)),"
            " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.finished_at)),"
            " max(extract(epoch FROM e.finished_at)),"
            " min(extract(epoch FROM e.scheduled_for))"
            f" FROM {Execution._meta.db_table} e JOIN {Task._meta.db_table} t ON t.id = e.task_id"
            " WHERE t.owner_id = %s AND t.name LIKE 'map %%' GROUP BY 1",
            [owner.pk],
        )
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    origin = rows.get("list", (None,) * 9)[8]
    if origin is None:
        return phases
    for kind, label in kinds.items():
        values = rows.get(kind)
        if values is None:
            continue
        for name, value in zip(
            (
                "created_p50",
                "created_max",
                "enqueued_p50",
                "enqueued_max",
                "started_p50",
                "started_max",
                "ended_p50",
                "ended_max",
            ),
            values[:8],
            strict=True,
        ):
            phases[f"{label}_{name}"] = None if value is None else round(float(value) - float(origin), 3)
    return phases


def _cpu_per_run(figures: Figures) -> float | None:
    """The platform's processes' CPU per run (a herd's total over its roles), with PgBouncer's."""
    extra = figures.extra
    own = extra.get("cpu_ms_per_exec_total", extra.get("cpu_ms_per_exec"))
    if not isinstance(own, int | float):
        return None
    return own + (extra.get("pgbouncer_cpu_ms_per_exec") or 0.0)


def through_ratios(direct: Figures, other: Figures) -> dict[str, float | None]:
    """``other``'s figures over ``direct``'s of the same scenario: throughput (runs per second),
    lateness p50 and p99, CPU per run (the platform's processes, PgBouncer's included) and, where
    both runs read it, the servers' CPU per run."""

    def ratio(over: float | None, under: float | None) -> float | None:
        return round(over / under, 2) if over is not None and under else None

    return {
        "throughput": ratio(other.per_second, direct.per_second),
        "lateness_p50": ratio(other.lateness_ms.get("p50"), direct.lateness_ms.get("p50")),
        "lateness_p99": ratio(other.lateness_ms.get("p99"), direct.lateness_ms.get("p99")),
        "cpu_per_run": ratio(_cpu_per_run(other), _cpu_per_run(direct)),
        "servers_cpu_per_run": ratio(
            other.extra.get("servers_cpu_ms_per_exec"), direct.extra.get("servers_cpu_ms_per_exec")
        ),
    }


def through_table(results: list[Figures]) -> list[str]:
    """The runs through a pooler or on the HA topology beside the direct runs of the same
    scenarios, as ratios (other / direct: above 1 is more throughput, more lateness, more CPU).
    The last CPU column is PgBouncer's own, or the servers' (PostgreSQL, RabbitMQ, and on the HA
    topology etcd and every node)."""
    by_name = {f.scenario: f for f in results}
    lines = [
        "| scenario | through | exec/s (direct -> other) | lateness p50 (ms) | lateness p99 (ms) "
        "| platform CPU ms/run | pgbouncer's or servers' CPU ms/run | ratios: throughput / p50 / p99 / CPU "
        "/ servers' CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for other in results:
        r = other.extra.get("vs_direct")
        direct = by_name.get(other.extra.get("reference") or other.scenario.split("@", 1)[0])
        if "@" not in other.scenario or r is None or direct is None:
            continue
        if "pgbouncer_cpu_ms_per_exec" in other.extra:
            aside = f"{other.extra['pgbouncer_cpu_ms_per_exec']} (pgbouncer)"
        else:
            aside = f"{direct.extra.get('servers_cpu_ms_per_exec')} -> {other.extra.get('servers_cpu_ms_per_exec')}"
        lines.append(
            f"| {other.scenario.split('@', 1)[0]} | {other.extra.get('through', '')} | {direct.per_second:.0f} -> "
            f"{other.per_second:.0f} | {direct.lateness_ms.get('p50', '-')} -> {other.lateness_ms.get('p50', '-')} | "
            f"{direct.lateness_ms.get('p99', '-')} -> {other.lateness_ms.get('p99', '-')} | "
            f"{_cpu_per_run(direct)} -> {_cpu_per_run(other)} | {aside} | {r.get('throughput')} / "
            f"{r.get('lateness_p50')} / {r.get('lateness_p99')} / {r.get('cpu_per_run')} / "
            f"{r.get('servers_cpu_per_run')} |"
        )
    return lines if len(lines) > 2 else []


def _execution_list_paths(user: Any) -> list[tuple[str, str]]:
    """The execution list's first page, a page half-way down what the user may see (its keyset
    cursor), the FAILED filter and the waiting runs: ``(figure name, path)``, if the project
    serves the list."""
    from django.urls import Resolver404, resolve

    try:
        resolve("/ui/executions/")
        from backoffice.keyset import row_cursor
        from backoffice.scope import visible_executions
    except (Resolver404, ImportError):
        return []
    ran = visible_executions(user).exclude(status="SCHEDULED").order_by("-scheduled_for", "-id")
    middle = ran[ran.count() // 2]
    return [
        ("list", "/ui/executions/"),
        ("list_deep", f"/ui/executions/?cursor={row_cursor('scheduled_for', middle)}"),
        ("list_failed", "/ui/executions/?status=FAILED"),
        ("list_waiting", "/ui/executions/?status=SCHEDULED"),
    ]


def _dashboard_page() -> Callable[..., tuple[dict[str, float], int]] | None:
    """A timer of a page (``/`` unless told) through Django's test client, if the project serves ``/``."""
    from django.urls import Resolver404, resolve

    try:
        resolve("/")
    except Resolver404:
        return None
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    def render(user: Any, times: int, path: str = "/") -> tuple[dict[str, float], int]:
        client = Client()
        client.force_login(user)
        client.get(path)
        timings, queries = [], []
        for _ in range(times):
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                response = client.get(path)
                timings.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"{path} answered {response.status_code}")
            queries.append(len(captured))
        return _quantiles(timings), max(queries)

    return render


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        memory = int(Path("/proc/meminfo").read_text().split()[1]) // 1024 // 1024
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        postgres = cursor.fetchone()[0]
    rabbit = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["rabbitmqctl", "version"], capture_output=True, text=True, timeout=30).stdout.strip()
        rabbit = out or rabbit

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        # What tells this machine from another with the same model name (tooling.harness.compare).
        "speed": cpu_speed(),
        "memory_gib": memory,
        "python": sys.version.split()[0],
        "postgresql": postgres,
        "rabbitmq": rabbit,
    }


def _lists_table(f: Figures) -> list[str]:
    """The lists scenario's figures per path: HTTP quantiles, CPU per request, queries."""
    lines = [
        "",
        "| user | path | p50 / p95 / p99 (ms) | p95 / trivial p95 | web CPU ms/req | db CPU ms/req "
        "| queries | SQL ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    profile = f.extra.get("profile", {})
    for label, paths in f.extra.get("http", {}).items():
        for name, q in paths.items():
            prof = profile.get(name, {}) if label == "owner" else {}
            lines.append(
                f"| {label} | {name} | {q['p50']} / {q['p95']} / {q['p99']} | {q['p95_over_trivial']} | "
                f"{q['web_cpu_ms']} | {q['db_cpu_ms']} | {prof.get('queries', '')} | {prof.get('sql_ms', '')} |"
            )
    return lines


def table(results: list[Figures]) -> list[str]:
    """The figures as a Markdown table."""
    lines_after: list[str] = []
    lines = [
        "| scenario | executions | exec/s | baseline/s | ratio | lateness p50 / p95 / p99 / max (ms) "
        "| commits/exec | due query p99 (ms) | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in results:
        late = (
            " / ".join(str(f.lateness_ms.get(k, "-")) for k in ("p50", "p95", "p99", "max")) if f.lateness_ms else "-"
        )
        if f.scenario == "pages":
            from tooling.harness.pages import pages_table

            lines_after += pages_table(f.extra)
            notes = f"tasks={f.extra.get('tasks')}; over budget: {', '.join(f.extra.get('over_budget', [])) or 'none'}"
        elif f.scenario == "lists":
            lines_after = _lists_table(f)
            notes = f"fill={json.dumps(f.extra.get('fill'))}; per path below"
        elif f.scenario == "scale":
            from tooling.harness.scale_curve import curve_table

            lines_after += ["", "The cost curve (every-minute runs' lateness in the row above: the largest size):"]
            lines_after += curve_table(f.extra.get("points", []))
            notes = f"goal={json.dumps(f.extra.get('goal'))}; plot={f.extra.get('plot')}; per size below"
        else:
            notes = ", ".join(f"{k}={json.dumps(v)}" for k, v in f.extra.items())
        lines.append(
            f"| {f.scenario} | {f.executions} | {f.per_second:.0f} | "
            f"{(f.baseline_per_second and round(f.baseline_per_second)) or '-'} | "
            f"{(f.ratio and round(f.ratio, 2)) or '-'} | {late} | {f.commits_per_execution or '-'} | "
            f"{f.monitor.get('due_query_p99_ms', '-')} | {notes} |"
        )
    return lines + lines_after


def run_bench(config: BenchConfig, json_path: Path | None = None) -> list[Figures]:
    # Its processes are given the database by URL (tooling/harness/processes.py): a server of
    # its own, not the embedded one on a socket.
    if settings.TMS_EMBEDDED_DATABASE or settings.TMS_EMBEDDED_BROKER:
        raise RuntimeError("tms_bench needs PostgreSQL and RabbitMQ (set DATABASE_URL and CELERY_BROKER_URL)")
    results = Bench(config).run()
    if json_path is not None:
        payload = {
            "when": db_now().isoformat(),
            "machine": machine(),
            "config": {k: v for k, v in asdict(config).items() if k not in ("progress", "log_dir")},
            "results": [{**asdict(f), "ratio": f.ratio} for f in results],
        }
        json_path.write_text(json.dumps(payload, indent=2, default=str))
    return results
