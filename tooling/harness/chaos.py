"""The chaos harness: run executions on the real platform while breaking it, then count.

It starts monitors, workers and beat as real processes, submits N one-shot tasks (half drive
the ledger endpoint through the ``http`` runner's async mode, so every launch is counted per
idempotency key; half are ``sleep`` runs that hold their lease while they work), and meanwhile
SIGKILLs pool processes and whole workers, pauses a worker with SIGSTOP past its timeout,
restarts RabbitMQ and restarts PostgreSQL. Then it reports what a scheduler is trusted for:
nothing lost, nothing launched twice, no execution finished twice, and how fast work held by a
killed worker was resumed. Services it stopped are started again whatever happens.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import OperationalError, close_old_connections, connection
from django.db.models import Count, Q, QuerySet
from django.test.utils import override_settings

from executions.models import TERMINAL_STATUSES, Execution, ExecutionEvent, ExecutionStatus
from executions.periodic import register_periodic_tasks
from tasks_api.creation import task_create
from tasks_app.quotas import owner_quota_set
from tms_core.clock import db_now
from tooling.harness.ledger import LedgerServer
from tooling.harness.processes import ROOT, ManagedProcess, process_env, start_monitor, start_worker, wait_ready

logger = logging.getLogger(__name__)
T = TypeVar("T")

RESUMED = "resumed after the previous lease expired"


@dataclass
class ChaosConfig:
    executions: int = 300
    workers: int = 3
    concurrency: int = 3
    monitors: int = 2
    #: Seconds between SIGKILLs (alternating a pool process and a whole worker).
    kill_every: float = 3.0
    #: Submitted runs start within this many seconds, so the chaos hits a running system.
    spread: float = 20.0
    run_seconds: tuple[float, float] = (0.3, 2.0)
    pause: bool = True
    restart_broker: bool = True
    restart_database: bool = True
    heartbeat: float = 1.0
    worker_timeout: float = 4.0
    #: Workflow runs among the load: each a diamond of four tasks (a root on the clock, two that
    #: follow it, one that follows both), each step an http or sleep run like the others.
    workflows: int = 0
    #: Give up waiting for terminal states after this many seconds.
    deadline: float = 170.0
    log_dir: Path = field(default_factory=lambda: ROOT / "var" / "chaos")
    settings_module: str = field(default_factory=lambda: os.environ.get("DJANGO_SETTINGS_MODULE", ""))
    progress: Callable[[str], None] = lambda line: None


@dataclass
class ChaosReport:
    submitted: int = 0
    succeeded: int = 0
    failed: int = 0
    lost: int = 0
    duplicate_launches: int = 0
    repeated_starts: int = 0
    duplicate_terminal_events: int = 0
    redeliveries: int = 0
    republished: int = 0
    handbacks: int = 0
    kills: int = 0
    pauses: int = 0
    broker_restarts: int = 0
    database_restarts: int = 0
    #: Seconds from a kill (or pause) to another worker resuming the execution, when no broker
    #: or database outage overlapped; ``recoveries_during_outage`` holds the others.
    recoveries: list[float] = field(default_factory=list)
    recoveries_during_outage: list[float] = field(default_factory=list)
    recoveries_after_pause: list[float] = field(default_factory=list)
    unrecovered_victims: int = 0
    #: Diamonds run; steps (executions of a diamond's three followers) created; steps that should
    #: exist (their upstreams ended as asked) but do not, or are not ended; tasks with more than
    #: one step in one workflow run; diamonds whose last step succeeded.
    workflows: int = 0
    workflow_steps: int = 0
    workflow_steps_missing: int = 0
    workflow_steps_duplicate: int = 0
    workflows_completed: int = 0
    elapsed: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def recovery_p50(self) -> float | None:
        return statistics.median(self.recoveries) if self.recoveries else None

    @property
    def recovery_max(self) -> float | None:
        return max(self.recoveries) if self.recoveries else None

    def lines(self) -> list[str]:
        def seconds(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.2f}s"

        return [
            f"submitted                  {self.submitted}",
            f"completed                  {self.succeeded + self.failed}"
            f" ({self.succeeded} succeeded, {self.failed} failed)",
            f"lost                       {self.lost}",
            f"duplicate launches         {self.duplicate_launches}",
            f"repeated starts (adopted)  {self.repeated_starts}",
            f"duplicate terminal events  {self.duplicate_terminal_events}",
            f"redeliveries               {self.redeliveries}",
            f"republished (PENDING)      {self.republished}",
            f"leases handed back         {self.handbacks}",
            f"disruptions                {self.kills} SIGKILL, {self.pauses} SIGSTOP, "
            f"{self.broker_restarts} RabbitMQ restart, {self.database_restarts} PostgreSQL restart",
            f"recovery kill->resume      p50 {seconds(self.recovery_p50)}, max {seconds(self.recovery_max)} "
            f"over {len(self.recoveries)} resumed executions",
            f"recovery during outages    {_listing(self.recoveries_during_outage)}",
            f"recovery after the pause   {_listing(self.recoveries_after_pause)}",
            *(
                [
                    f"workflow runs (diamonds)   {self.workflows}: {self.workflows_completed} completed, "
                    f"{self.workflow_steps} steps, {self.workflow_steps_missing} missing, "
                    f"{self.workflow_steps_duplicate} duplicate"
                ]
                if self.workflows
                else []
            ),
            f"elapsed                    {self.elapsed:.1f}s",
            *[f"note: {note}" for note in self.notes],
        ]


def _listing(values: list[float]) -> str:
    return ", ".join(f"{value:.1f}s" for value in sorted(values)) or "none"


def _retrying(query: Callable[[], T], attempts: int = 60) -> T:
    """Run a harness query through a database restart."""
    for attempt in range(attempts):
        try:
            return query()
        except OperationalError:
            if attempt == attempts - 1:
                raise
            connection.close()
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _run(argv: list[str], timeout: float = 120) -> bool:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("%s failed: %s", argv[0], exc)
        return False
    if result.returncode != 0:
        logger.warning("%s exited %s: %s", " ".join(argv), result.returncode, result.stderr.strip()[-500:])
    return result.returncode == 0


def _postgres_cluster() -> list[str] | None:
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if not versions or not shutil.which("pg_ctlcluster"):
        return None
    return ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main"]


def _tcp_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:
        return []


class ChaosRun:
    def __init__(self, config: ChaosConfig) -> None:
        self.config = config
        self.report = ChaosReport()
        self.ledger = LedgerServer(default_duration=1.0)
        self.workers: list[ManagedProcess] = []
        self.others: list[ManagedProcess] = []
        self.retired: list[ManagedProcess] = []
        #: (db time of the kill, execution ids the killed process held)
        self.victims: list[tuple[datetime, list[int]]] = []
        #: The same for the paused worker: its recovery is reported apart, since a message the
        #: broker handed to the paused worker waits for it to come back.
        self.paused: list[tuple[datetime, list[int]]] = []
        self.task_ids: list[Any] = []
        #: Each diamond's tasks: (root, left, right, last); left and right follow root, last both.
        self.diamonds: list[tuple[Any, Any, Any, Any]] = []
        self.broker_stopped = False
        #: (start, end) database times of broker and database outages.
        self.outages: list[tuple[datetime, datetime]] = []
        self._worker_count = 0

    # -- processes --------------------------------------------------------------------------

    # Any, not str: the values are strings, but start_worker's keyword options (split_stderr) share
    # the **env namespace, and mypy cannot tell these keys apart from them.
    def _env(self) -> dict[str, Any]:
        env = {
            "TMS_HEARTBEAT_INTERVAL": str(self.config.heartbeat),
            "TMS_WORKER_TIMEOUT": str(self.config.worker_timeout),
            "TMS_PENDING_REPUBLISH_AFTER": "15",
            "TMS_MONITOR_MAX_SLEEP": "0.5",
            "TMS_HTTP_ALLOWED_NETWORKS": "127.0.0.1/32",
        }
        if self.config.settings_module:
            env["DJANGO_SETTINGS_MODULE"] = self.config.settings_module
        return env

    def _start_worker(self) -> ManagedProcess:
        self._worker_count += 1
        worker = start_worker(
            f"chaos-worker-{self._worker_count}",
            log_dir=self.config.log_dir,
            concurrency=self.config.concurrency,
            **self._env(),
        )
        self.workers.append(worker)
        return worker

    def _start_processes(self) -> None:
        register_periodic_tasks()
        for index in range(self.config.monitors):
            self.others.append(start_monitor(f"chaos-monitor-{index + 1}", log_dir=self.config.log_dir, **self._env()))
        beat = [sys.executable, "-m", "celery", "-A", "tms_project", "beat", "-l", "info", "--pidfile="]
        beat += ["-s", str(self.config.log_dir / "celerybeat-schedule")]
        self.others.append(ManagedProcess("chaos-beat", beat, process_env(**self._env()), self.config.log_dir))
        for _ in range(self.config.workers):
            self._start_worker()
        for worker in self.workers:
            wait_ready(worker)

    # -- load -------------------------------------------------------------------------------

    def _submit(self) -> None:
        # The ledger listens on loopback: open 127.0.0.1 to the http runner here, as the
        # processes this harness starts do through TMS_HTTP_ALLOWED_NETWORKS.
        runners: dict[str, dict[str, Any]] = copy.deepcopy(settings.TMS_RUNNERS)
        runners["http"].setdefault("OPTIONS", {})["allowed_networks"] = ["127.0.0.1/32"]
        with override_settings(TMS_RUNNERS=runners):
            self._create_tasks()

    def _create_tasks(self) -> None:
        owner, _ = get_user_model().objects.get_or_create(username="chaos")
        owner_quota_set(owner=owner, max_tasks=0)  # one task per execution, run after run: no task quota
        low, high = self.config.run_seconds
        for index in range(self.config.executions):
            start_at = db_now() + timedelta(seconds=random.uniform(0, self.config.spread))  # noqa: S311
            duration = round(random.uniform(low, high), 2)  # noqa: S311
            common: dict[str, Any] = {
                "owner": owner,
                "start_at": start_at,
                "max_attempts": 5,
                "retry_backoff": timedelta(seconds=1),
            }
            if index % 2 == 0:
                task = task_create(
                    runner="http",
                    name=f"chaos ledger {index}",
                    config={"url": self.ledger.url, "method": "POST", "json": {"duration": duration}, "async": True},
                    **common,
                )
            else:
                task = task_create(runner="sleep", name=f"chaos sleep {index}", config={"duration": duration}, **common)
            self.task_ids.append(task.pk)
        self.report.submitted = len(self.task_ids)
        for index in range(self.config.workflows):
            self.diamonds.append(self._diamond(owner, index))
        self.report.workflows = len(self.diamonds)

    def _step(self, owner: Any, name: str, *, http: bool, **fields: Any) -> Any:
        low, high = self.config.run_seconds
        duration = round(random.uniform(low, high), 2)  # noqa: S311
        common = {"owner": owner, "name": name, "max_attempts": 5, "retry_backoff": timedelta(seconds=1), **fields}
        if http:
            config = {"url": self.ledger.url, "method": "POST", "json": {"duration": duration}, "async": True}
            return task_create(runner="http", config=config, **common).pk
        return task_create(runner="sleep", config={"duration": duration}, **common).pk

    def _diamond(self, owner: Any, index: int) -> tuple[Any, Any, Any, Any]:
        start_at = db_now() + timedelta(seconds=random.uniform(0, self.config.spread))  # noqa: S311
        root = self._step(owner, f"chaos flow {index} root", http=True, start_at=start_at)
        left = self._step(owner, f"chaos flow {index} left", http=False, after=[{"task": str(root)}])
        right = self._step(owner, f"chaos flow {index} right", http=True, after=[{"task": str(root)}])
        last = self._step(
            owner, f"chaos flow {index} last", http=True, after=[{"task": str(left)}, {"task": str(right)}]
        )
        return root, left, right, last

    def _executions(self) -> QuerySet[Execution]:
        """The independent runs and every workflow step (to wait for all of them to end)."""
        return Execution.objects.filter(task_id__in=[*self.task_ids, *(pk for d in self.diamonds for pk in d)])

    def _open(self) -> int:
        return _retrying(lambda: self._executions().exclude(status__in=TERMINAL_STATUSES).count())

    # -- disruptions ------------------------------------------------------------------------

    def _held_by(self, owner: str) -> list[int]:
        """Executions leased by ``owner``: a pool process (``host:pid:child``) or, ending in
        ``:``, any process of a worker."""
        lookup = {"lease_owner__startswith": owner} if owner.endswith(":") else {"lease_owner": owner}
        return _retrying(
            lambda: list(
                self._executions().filter(status=ExecutionStatus.RUNNING, **lookup).values_list("id", flat=True)
            )
        )

    def _kill(self, whole_worker: bool) -> None:
        live = [worker for worker in self.workers if worker.alive]
        if not live:
            return
        worker = random.choice(live)  # noqa: S311
        node = f"{socket.gethostname()}:{worker.pid}:"
        if whole_worker:
            held, when = self._held_by(node), _retrying(db_now)
            worker.signal_group(signal.SIGKILL)
            self.workers.remove(worker)
            self.retired.append(worker)
            self._start_worker()
            what = f"SIGKILL worker {worker.name} (pid {worker.pid}) holding {len(held)}"
        else:
            children = _children(worker.pid)
            if not children:
                return
            child = random.choice(children)  # noqa: S311
            held, when = self._held_by(f"{node}{child}"), _retrying(db_now)
            os.kill(child, signal.SIGKILL)
            what = f"SIGKILL pool process {child} of {worker.name} holding {len(held)}"
        self.report.kills += 1
        if held:
            self.victims.append((when, held))
        self.config.progress(what)

    def _pause(self) -> None:
        live = [worker for worker in self.workers if worker.alive]
        if not live:
            return
        worker = random.choice(live)  # noqa: S311
        node = f"{socket.gethostname()}:{worker.pid}:"
        held, when = self._held_by(node), _retrying(db_now)
        worker.signal_group(signal.SIGSTOP)
        self.report.pauses += 1
        if held:
            self.paused.append((when, held))
        pause_for = self.config.worker_timeout + 3
        self.config.progress(f"SIGSTOP {worker.name} for {pause_for:.0f}s holding {len(held)}")
        timer = threading.Timer(pause_for, worker.signal_group, args=(signal.SIGCONT,))
        timer.daemon = True
        timer.start()

    def _restart_broker(self) -> None:
        if not shutil.which("rabbitmqctl"):
            self.report.notes.append("rabbitmqctl not found: RabbitMQ restart skipped")
            return
        self.config.progress("RabbitMQ: stop_app")
        began = _retrying(db_now)
        self.broker_stopped = _run(["rabbitmqctl", "stop_app"])
        time.sleep(3)
        if self.broker_stopped and _run(["rabbitmqctl", "start_app"]):
            self.broker_stopped = False
            self.report.broker_restarts += 1
            self.config.progress("RabbitMQ: start_app")
        self.outages.append((began, _retrying(db_now)))

    def _restart_database(self) -> None:
        cluster = _postgres_cluster()
        if cluster is None:
            self.report.notes.append("pg_ctlcluster not found: PostgreSQL restart skipped")
            return
        self.config.progress("PostgreSQL: restart")
        began = _retrying(db_now)
        if _run([*cluster, "restart"]):
            self.report.database_restarts += 1
        connection.close()
        self.outages.append((began, _retrying(db_now)))

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> ChaosReport:
        started = time.monotonic()
        self.ledger.start()
        try:
            self._start_processes()
            self._submit()
            self.config.progress(f"submitted {self.report.submitted} executions")
            self._disrupt_until_done(started)
        finally:
            self._restore_services()
            for proc in [*self.workers, *self.retired, *self.others]:
                proc.stop()
            self.ledger.stop()
            close_old_connections()
        self.report.elapsed = time.monotonic() - started
        self._count()
        return self.report

    def _disrupt_until_done(self, started: float) -> None:
        plan: list[tuple[float, Callable[[], None]]] = []
        if self.config.pause:
            plan.append((0.25, self._pause))
        if self.config.restart_broker:
            plan.append((0.45, self._restart_broker))
        if self.config.restart_database:
            plan.append((0.65, self._restart_database))
        submitted_at = time.monotonic()
        next_kill, kills = submitted_at + self.config.kill_every, 0
        while time.monotonic() - started < self.config.deadline:
            elapsed = time.monotonic() - submitted_at
            # One-off disruptions at set points of the submission window.
            while plan and elapsed >= plan[0][0] * self.config.spread:
                plan.pop(0)[1]()
            if time.monotonic() >= next_kill and elapsed < self.config.spread * 1.5:
                self._kill(whole_worker=kills % 2 == 1)
                kills += 1
                # On a fixed beat: the kills a restart's wait held up come right after it (one a
                # loop), or runs that end on time (the monitor's lookahead) left the window with
                # fewer kills than the test asks for.
                next_kill += self.config.kill_every
            if not plan and elapsed > self.config.spread and self._open() == 0:
                return
            time.sleep(0.2)
        self.report.notes.append(f"deadline of {self.config.deadline:.0f}s reached with work still open")

    def _restore_services(self) -> None:
        if self.broker_stopped:
            _run(["rabbitmqctl", "start_app"])
        cluster = _postgres_cluster()
        if cluster is not None and not _tcp_open("127.0.0.1", int(settings.DATABASES["default"].get("PORT") or 5432)):
            _run([*cluster, "start"])

    def _count(self) -> None:
        report = self.report
        executions = Execution.objects.filter(task_id__in=self.task_ids)
        by_status = dict(_retrying(lambda: list(executions.values_list("status").annotate(n=Count("id")))))
        report.succeeded = by_status.get(ExecutionStatus.SUCCEEDED, 0)
        report.failed = by_status.get(ExecutionStatus.FAILED, 0) + by_status.get(ExecutionStatus.CANCELLED, 0)
        per_task = _retrying(lambda: executions.values("task_id").distinct().count())
        report.lost = (
            report.submitted - per_task + sum(n for status, n in by_status.items() if status not in TERMINAL_STATUSES)
        )
        self._count_workflows()
        events = ExecutionEvent.objects.filter(execution__in=self._executions())
        terminal = events.filter(to_status__in=TERMINAL_STATUSES).values("execution_id").annotate(n=Count("id"))
        report.duplicate_terminal_events = sum(row["n"] - 1 for row in terminal if row["n"] > 1)
        report.republished = events.filter(
            from_status=ExecutionStatus.PENDING, to_status=ExecutionStatus.PENDING
        ).count()
        report.handbacks = events.filter(detail__startswith="lease of").count()
        report.duplicate_launches = self.ledger.ledger.duplicate_launches()
        report.repeated_starts = self.ledger.ledger.repeated_starts()
        report.redeliveries = sum(proc.log().count("redelivered message") for proc in [*self.workers, *self.retired])
        for killed_at, ids, paused in [(t, i, False) for t, i in self.victims] + [(t, i, True) for t, i in self.paused]:
            for execution_id in ids:
                resumed = (
                    events.filter(Q(execution_id=execution_id), at__gt=killed_at, detail=RESUMED)
                    .order_by("at")
                    .values_list("at", flat=True)
                    .first()
                )
                if resumed is not None:
                    overlapped = any(start <= resumed and end >= killed_at for start, end in self.outages)
                    if paused:
                        recoveries = report.recoveries_after_pause
                    else:
                        recoveries = report.recoveries_during_outage if overlapped else report.recoveries
                    recoveries.append((resumed - killed_at).total_seconds())
                elif Execution.objects.filter(pk=execution_id, status=ExecutionStatus.RUNNING).exists():
                    report.unrecovered_victims += 1

    def _count_workflows(self) -> None:
        """Each diamond against what its ends ask for: a follower has exactly one step in the
        workflow run when every task it follows ended SUCCEEDED there, and none otherwise."""
        report = self.report
        rows = _retrying(
            lambda: list(
                Execution.objects.filter(task_id__in=[pk for d in self.diamonds for pk in d]).values_list(
                    "task_id", "workflow_run", "status", "pk"
                )
            )
        )
        by_task: dict[Any, list[tuple[Any, str, int]]] = {}
        for task_id, workflow_run, status, pk in rows:
            by_task.setdefault(task_id, []).append((workflow_run, status, pk))
        for root, left, right, last in self.diamonds:
            roots = by_task.get(root, [])
            if len(roots) != 1:
                report.workflow_steps_duplicate += max(0, len(roots) - 1)
                report.workflow_steps_missing += 0 if roots else 1
                continue
            _, root_status, root_pk = roots[0]
            if root_status not in TERMINAL_STATUSES:
                report.workflow_steps_missing += 1
                continue
            ended: dict[Any, str] = {root: root_status}
            for follower, upstreams in ((left, [root]), (right, [root]), (last, [left, right])):
                steps = [(status, pk) for run, status, pk in by_task.get(follower, []) if run == root_pk]
                report.workflow_steps += len(steps)
                report.workflow_steps_duplicate += max(0, len(steps) - 1)
                expected = all(ended.get(upstream) == ExecutionStatus.SUCCEEDED for upstream in upstreams)
                if expected and (not steps or steps[0][0] not in TERMINAL_STATUSES):
                    report.workflow_steps_missing += 1
                elif not expected and steps:
                    report.notes.append(f"workflow step of task {follower} ran though its upstreams did not succeed")
                    report.workflow_steps_duplicate += len(steps)
                if steps:
                    ended[follower] = steps[0][0]
            report.workflows_completed += ended.get(last) == ExecutionStatus.SUCCEEDED


def run_chaos(config: ChaosConfig) -> ChaosReport:
    """Run the chaos scenario against the configured PostgreSQL and RabbitMQ."""
    if settings.TMS_EMBEDDED_DATABASE or settings.TMS_EMBEDDED_BROKER:
        raise RuntimeError("chaos needs PostgreSQL and RabbitMQ (set DATABASE_URL and CELERY_BROKER_URL)")
    return ChaosRun(config).run()
