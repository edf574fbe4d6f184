"""``tms_bench``'s herd scenario: N every-minute cron tasks due on the same minute.

The whole platform runs as in production, each part in its own processes: beat (django-celery-beat's
DatabaseScheduler) sends the materialise job to a worker of its own (the "materialiser"), the
monitor publishes what is due, and the execution workers run it. Beside it, in the same run, bare
Celery drains N pre-published no-op tasks with the same worker count and settings. The figures:
time from the due instant to the last start (bare: first to last task), lateness quantiles, every
run started exactly once (lost and duplicated starts counted from the database), CPU seconds per
execution for each kind of process (read from ``/proc``), and PostgreSQL commits per execution
(the bench database's own ``xact_commit``, so other databases on the server do not count).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from executions.models import Execution, ExecutionEvent
from tasks_app.models import Task
from tms_core.clock import db_now
from tooling.harness.fill import insert_tasks
from tooling.harness.processes import ManagedProcess, monitor_stats, start_beat, start_monitor, start_worker, wait_ready

_TICKS = os.sysconf("SC_CLK_TCK")


# -- CPU from /proc -----------------------------------------------------------------------------


def _proc_stats() -> dict[int, tuple[int, float]]:
    """Every process's (session id, CPU seconds: its own and its reaped children's)."""
    found: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(entry.path, "stat").read_text()
            # Fields after the command name (which may hold spaces): state is field 3.
            rest = text[text.rindex(")") + 2 :].split()
            session = int(rest[6 - 3])
            ticks = sum(int(rest[n - 3]) for n in (14, 15, 16, 17))  # utime stime cutime cstime
            found[int(entry.name)] = (session, ticks / _TICKS)
    return found


def _postgres_backends() -> set[int]:
    """The server processes of the bench database's connections, but this process's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return {row[0] for row in cursor.fetchall()}


def _rabbitmq_pids() -> set[int]:
    pids = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if Path(entry.path, "comm").read_text().strip().startswith("beam"):
                    pids.add(int(entry.name))
    return pids


class CpuMeter:
    """CPU seconds per kind of process between :meth:`start` and the last :meth:`sample`.

    A kind is a set of session leaders (each :class:`ManagedProcess` leads its own session, so a
    worker's pool processes count with it), PostgreSQL backends of the bench database, or the
    RabbitMQ server. Sampled often, so a process that ends in between (a pool process, a
    backend that reconnects) still counts up to its last sample.
    """

    def __init__(self, sessions: Mapping[str, Iterable[ManagedProcess]], *, postgres: bool = True) -> None:
        self.sessions = {kind: {p.pid for p in procs} for kind, procs in sessions.items()}
        self.postgres = postgres
        self._before: dict[str, dict[int, float]] = {}
        self._last: dict[str, dict[int, float]] = {}

    def _read(self) -> dict[str, dict[int, float]]:
        stats = _proc_stats()
        seen: dict[str, dict[int, float]] = {kind: {} for kind in self.sessions}
        for pid, (session, cpu) in stats.items():
            for kind, leaders in self.sessions.items():
                if session in leaders:
                    seen[kind][pid] = cpu
        if self.postgres:
            seen["postgresql"] = {pid: stats[pid][1] for pid in _postgres_backends() if pid in stats}
        seen["rabbitmq"] = {pid: stats[pid][1] for pid in _rabbitmq_pids() if pid in stats}
        return seen

    def start(self) -> None:
        self._before = self._read()
        self._last = {kind: dict(pids) for kind, pids in self._before.items()}

    def sample(self) -> None:
        for kind, pids in self._read().items():
            self._last.setdefault(kind, {}).update(pids)

    def seconds(self) -> dict[str, float]:
        return {
            kind: round(sum(cpu - self._before.get(kind, {}).get(pid, 0.0) for pid, cpu in pids.items()), 3)
            for kind, pids in self._last.items()
        }

    def mark(self) -> dict[str, float]:
        """Sample, and return the seconds so far (subtract two marks for the CPU in between)."""
        self.sample()
        return self.seconds()


def _minus(later: Mapping[str, float], earlier: Mapping[str, float]) -> dict[str, float]:
    return {kind: round(seconds - earlier.get(kind, 0.0), 3) for kind, seconds in later.items()}


# -- accounting -------------------------------------------------------------------------------


@dataclass
class HerdAccount:
    """Every task's run of the due minute: started once, never (lost), or more than once."""

    expected: int = 0
    started: int = 0
    lost: int = 0
    duplicated: int = 0
    lateness_s: list[float] = field(default_factory=list)

    @property
    def last_start_s(self) -> float | None:
        return max(self.lateness_s) if self.lateness_s else None


def herd_account(*, owner_id: int, due: datetime) -> HerdAccount:
    """Count, from the database, how the herd owner's tasks' runs due at ``due`` started: a task
    with no started run is lost; a run with more than one start (a PENDING → RUNNING event) is
    duplicated, once per extra start."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT e.started_at, extract(epoch FROM e.started_at - e.scheduled_for),
                (SELECT count(*) FROM {ExecutionEvent._meta.db_table} ev
                 WHERE ev.execution_id = e.id AND ev.to_status = 'RUNNING' AND ev.from_status <> 'RUNNING')
            FROM {Task._meta.db_table} t
            LEFT JOIN {Execution._meta.db_table} e ON e.task_id = t.id AND e.scheduled_for = %s
            WHERE t.owner_id = %s
            """,  # noqa: S608 - table names are ours
            [due, owner_id],
        )
        rows = cursor.fetchall()
    account = HerdAccount(expected=len(rows))
    for started_at, late, starts in rows:
        if started_at is None or not starts:
            account.lost += 1
            continue
        account.started += 1
        account.duplicated += starts - 1
        account.lateness_s.append(float(late))
    return account


def tasks_not_run_once(*, owner_id: int) -> int:
    """How many of the owner's tasks have not exactly one execution (none, or more than one):
    each task of a herd or a restore is to run once."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT count(*) FROM (
                SELECT count(e.id) AS runs FROM {Task._meta.db_table} t
                LEFT JOIN {Execution._meta.db_table} e ON e.task_id = t.id
                WHERE t.owner_id = %s GROUP BY t.id
            ) per_task WHERE runs <> 1
            """,  # noqa: S608 - table names are ours
            [owner_id],
        )
        return int(cursor.fetchone()[0])


# -- the scenario -----------------------------------------------------------------------------


@dataclass
class HerdResult:
    tasks: int
    due: datetime | None = None
    account: HerdAccount = field(default_factory=HerdAccount)
    #: Due instant to the last start (TMS), or first to last task done (bare Celery).
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    commits: int | None = None
    monitor: list[dict[str, Any]] = field(default_factory=list)
    #: The wait between the last of the herd's executions materialised and 0.8 s before the due
    #: instant (at the first poll from then on, so it ends before any run of the herd): its
    #: length, and the CPU seconds and commits in it. The platform is idle then (beat's ticks, the
    #: monitor's looks, the servers' housekeeping); that cost is per second of uptime, not per
    #: execution, and the wait's length is an artefact of the benchmark (13-73 s for the herd to
    #: be created and materialised before a minute boundary).
    idle_s: float = 0.0
    idle_cpu: dict[str, float] = field(default_factory=dict)
    idle_commits: int = 0
    #: Tasks without exactly one execution (:func:`tasks_not_run_once`).
    not_once: int = 0

    def cpu_ms_per_execution(self, *, without_idle: bool = False) -> dict[str, float]:
        done = max(1, self.account.started or self.tasks)
        cpu = _minus(self.cpu, self.idle_cpu) if without_idle else self.cpu
        return {kind: round(seconds * 1000 / done, 2) for kind, seconds in cpu.items()}

    def idle_cpu_ms_per_second(self) -> dict[str, float]:
        """What the idle platform costs per second of its wait, per kind of process."""
        if not self.idle_s:
            return {}
        return {kind: round(seconds * 1000 / self.idle_s, 2) for kind, seconds in self.idle_cpu.items()}


def _commits() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def _count_statements(counter: list[int]) -> Any:
    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        counter[0] += 1
        return execute(sql, params, many, context)

    return wrapper


class Herd:
    """Runs the herd and its bare-Celery baseline (see the module's docstring)."""

    def __init__(
        self,
        *,
        owner_id: int,
        tasks: int,
        workers: int,
        concurrency: int,
        monitors: int,
        log_dir: Path,
        env: dict[str, Any],
        progress: Any,
        soon: bool = False,
        restore: bool = False,
    ) -> None:
        self.owner_id = owner_id
        #: The restore scenario: the tasks appear with their run already due (a restore, an
        #: import), none materialised; measured from that instant, through the materialiser.
        self.restore = restore
        #: Due as soon as the tasks can be created and materialised, on every-minute interval
        #: tasks, instead of on the next minute boundary on ``* * * * *`` (which waits up to a
        #: minute more): for a smoke run of the harness, not for figures.
        self.soon = soon
        self.tasks = tasks
        self.workers = workers
        self.concurrency = concurrency
        self.monitors = monitors
        self.log_dir = log_dir
        self.env = env
        self.progress = progress
        #: Beat's jobs (materialise, liveness, ...) go to a queue of their own, with a worker of
        #: their own, so that their CPU is counted apart and the execution workers carry
        #: executions only, as the bare-Celery workers carry no-ops only.
        self.system_queue = f"{settings.TMS_QUEUE}.system"

    def _workers(self, prefix: str) -> list[ManagedProcess]:
        return [
            start_worker(f"{prefix}-{i + 1}", log_dir=self.log_dir, concurrency=self.concurrency, **self.env)
            for i in range(self.workers)
        ]

    @contextlib.contextmanager
    def _platform(self) -> Iterator[dict[str, list[ManagedProcess]]]:
        system = {**self.env, "TMS_QUEUE": self.system_queue}
        procs = {
            "worker": self._workers("herd-worker"),
            "materialiser": [start_worker("herd-materialiser", log_dir=self.log_dir, concurrency=1,
                                          queue=self.system_queue, **system)],
            "monitor": [start_monitor(f"herd-monitor-{i + 1}", log_dir=self.log_dir, **self.env)
                        for i in range(self.monitors)],
        }  # fmt: skip
        try:
            for proc in [*procs["worker"], *procs["materialiser"]]:
                wait_ready(proc, timeout=60)
            # Beat logs the jobs it sends (quiet by default: tms_project/log_filters.py), so that
            # its first one can be seen.
            beat_env = {**system, "TMS_LOG_HOUSEKEEPING": "true"}
            procs["beat"] = [start_beat("herd-beat", log_dir=self.log_dir, **beat_env)]
            # Measure from beat's first job on: its start-up (Django, the scheduler) is not the herd's.
            wait_ready(procs["beat"][0], timeout=60, line="Sending due task")
            yield procs
        finally:
            for kind in ("beat", "monitor", "worker", "materialiser"):
                for proc in procs.get(kind, []):
                    proc.stop()

    def run(self) -> HerdResult:
        """N every-minute cron tasks (one run each) due on the first minute boundary far enough
        ahead for them to be created and materialised (with ``soon``, interval tasks due as soon
        as that); measured until every run has started."""

        result = HerdResult(self.tasks)
        with self._platform() as procs:
            meter = CpuMeter(procs)
            lead = 12 + self.tasks / 1000
            now = db_now()
            grace = "interval '60 seconds'"
            if self.restore:
                # Due the instant they are inserted; a grace long enough that the misfire policy
                # drops none, however long the drain (every run is to start once).
                due, lead = now.replace(microsecond=0), 0
                schedule = {"interval": "interval '1 minute'"}
                grace = "interval '1 day'"
            elif self.soon:
                due = (now + timedelta(seconds=lead)).replace(microsecond=0)
                schedule = {"interval": "interval '1 minute'"}
            else:
                due = (now + timedelta(seconds=lead)).replace(second=0, microsecond=0) + timedelta(minutes=1)
                schedule = {"cron": "'* * * * *'"}
            result.due = due
            kind = "interval" if self.soon or self.restore else "cron"
            wait = max(0, int((due - now).total_seconds()))
            self.progress(f"{self.name}: {self.tasks} every-minute {kind} tasks due at {due:%H:%M:%S} ({wait}s)")
            meter.start()
            before = _commits()
            own = [0]
            with connection.execute_wrapper(_count_statements(own)), connection.cursor() as cursor:
                insert_tasks(
                    cursor=cursor,
                    owner_id=self.owner_id,
                    count=self.tasks,
                    columns={
                        "name": "'herd ' || g",
                        **schedule,
                        "start_at": "%(due)s",
                        "next_run_at": "%(due)s",
                        "max_runs": "1",
                        "misfire_grace": grace,
                    },
                    params={"due": due},
                )
                self._wait(procs, meter, due, result, commits=lambda: _commits() - own[0])
            meter.sample()
            result.cpu = meter.seconds()
            for proc in procs["monitor"]:
                proc.stop()
                stats = monitor_stats(proc.log())
                if stats is not None:
                    result.monitor.append(stats)
        connection.close()  # this connection's statistics are flushed when it ends
        time.sleep(2.0)
        result.commits = _commits() - before - own[0]
        result.account = herd_account(owner_id=self.owner_id, due=due)
        result.seconds = result.account.last_start_s or 0.0
        result.not_once = tasks_not_run_once(owner_id=self.owner_id)
        return result

    @property
    def name(self) -> str:
        return "restore" if self.restore else "herd"

    def _wait(
        self,
        procs: dict[str, list[ManagedProcess]],
        meter: CpuMeter,
        due: datetime,
        result: HerdResult,
        *,
        commits: Callable[[], int],
    ) -> None:
        """Poll until every run is done; mark the idle wait (see :attr:`HerdResult.idle_s`)."""
        runs = Execution.objects.filter(task__owner_id=self.owner_id, scheduled_for=due)
        deadline = time.monotonic() + (due - db_now()).total_seconds() + 120 + self.tasks / 10
        idle_until = due - timedelta(seconds=0.8)
        idle_from: tuple[float, dict[str, float], int] | None = None
        idle_done = False
        last_report = 0.0
        while True:
            meter.sample()
            now = db_now()
            if idle_from is None and now < idle_until and runs.count() >= self.tasks:
                idle_from = (time.monotonic(), meter.mark(), commits())
            if idle_from is not None and not idle_done and now >= idle_until:
                if now < due:  # only a mark taken before the due instant closes an idle wait
                    start, cpu, committed = idle_from
                    result.idle_s = round(time.monotonic() - start, 3)
                    result.idle_cpu = _minus(meter.mark(), cpu)
                    result.idle_commits = commits() - committed
                idle_done = True
            started = runs.filter(started_at__isnull=False).count()
            done = runs.filter(finished_at__isnull=False).count()
            if done >= self.tasks:
                return
            if time.monotonic() > deadline:
                self.progress(f"{self.name}: gave up with {done}/{self.tasks} done")
                return
            for kind, running in procs.items():
                for proc in running:
                    if not proc.alive:
                        raise RuntimeError(f"{self.name}: {kind} {proc.name} exited:\n{proc.log()[-2000:]}")
            if time.monotonic() - last_report >= 2:
                self.progress(f"{self.name}: {runs.count()} materialised, {started} started, {done} done")
                last_report = time.monotonic()
            # Wake for the idle wait's end mark.
            to_mark = (idle_until - db_now()).total_seconds()
            time.sleep(min(0.25, to_mark) if not idle_done and to_mark > 0 else 0.25)

    def bare(self) -> HerdResult:
        """Bare Celery: N no-op tasks published first, then drained by fresh workers with the same
        count and settings; timed from the first task done to the last (log lines, polled)."""
        from tooling.tasks import bench_noop

        result = HerdResult(self.tasks)
        self.progress(f"bare: publishing {self.tasks} no-op tasks")
        published = time.process_time()
        with bench_noop.app.producer_or_acquire() as producer:
            for _ in range(self.tasks):
                bench_noop.apply_async(producer=producer, priority=5)
        publisher_cpu = time.process_time() - published
        workers = self._workers("bare-worker")
        meter = CpuMeter({"worker": workers}, postgres=False)
        done = 0
        try:
            first = last = None
            deadline = time.monotonic() + 120 + self.tasks / 10
            while time.monotonic() < deadline:
                done = sum(proc.log().count("] succeeded in") for proc in workers)
                if done and first is None:
                    first = time.monotonic()
                    meter.start()
                if done >= self.tasks:
                    last = time.monotonic()
                    break
                if first is not None:
                    meter.sample()
                time.sleep(0.02)
            meter.sample()
            if first is None or last is None:
                self.progress("bare: gave up before every task was done")
            result.seconds = (last or time.monotonic()) - (first or time.monotonic())
            result.account = HerdAccount(expected=self.tasks, started=done, lost=max(0, self.tasks - done))
        finally:
            for proc in workers:
                proc.stop()
        result.cpu = {**meter.seconds(), "publisher": round(publisher_cpu, 3)}
        return result


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def q(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, math.floor(p * len(ordered)))], 3)

    return {"p50": q(0.5), "p99": q(0.99), "max": round(ordered[-1], 3)}
