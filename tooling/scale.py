"""Timed materialiser passes over many recurring tasks (``manage.py tms_scale N``).

The tasks are inserted set-based under a dedicated user, then passes are timed; the tasks, their
executions and skipped occurrences are deleted afterwards. Scenarios:

``mix`` (the default), a cold pass: each task has exactly one occurrence inside the horizon;
half on an hourly interval, each starting at its own second of the next four minutes (so no two
share a grid, as with tasks created through the API), half on an hourly cron expression in one
of several time zones, its minute chosen so that it fires within the next two minutes. The
first pass creates one execution per task, the second must create nothing.

``herd``: N identical ``* * * * *`` tasks in UTC, cursors at now. The first (cold) pass creates
every minute of the horizon for each; the second is taken a minute later (horizon + 60 s), when
each task has one new minute inside the horizon; the third, at the same instant, must create
nothing.

``steady``: N every-minute interval tasks on distinct grids (starts spread over the minute),
already materialised up to the horizon. The three passes are taken 5, 10 and 15 s later
(the horizon grown by as much), as the materialiser's loop would: each creates the twelfth of
the tasks whose next occurrence entered the horizon.

Besides wall time, each pass reports the CPU seconds of this process (all its threads) and of
the PostgreSQL backends serving its connections (read from ``/proc``, sampled while they live).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.backends.signals import connection_created

from executions.materialiser import materialise_due
from tasks_app.models import Task
from tms_core.clock import db_now
from tms_core.conf import tms_settings
from tooling.harness.fill import insert_tasks

SCALE_USER = "tms-scale-check"
#: Zones of the cron half, including ones whose offsets are not whole hours.
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "Asia/Kathmandu")
SCENARIOS = ("mix", "herd", "steady")


@dataclass(frozen=True)
class PassFigures:
    """One timed pass: wall seconds, executions created, CPU seconds of this process and of the
    PostgreSQL backends it used (None where /proc could not be read)."""

    seconds: float
    created: int
    cpu: float
    db_cpu: float | None

    def __str__(self) -> str:
        db = "?" if self.db_cpu is None else f"{self.db_cpu:.2f}"
        return f"{self.seconds:.2f}s (CPU {self.cpu:.2f}s, PostgreSQL CPU {db}s), created {self.created}"


@dataclass(frozen=True)
class ScaleResult:
    tasks: int
    fill_seconds: float
    passes: list[PassFigures] = field(default_factory=list)
    scenario: str = "mix"

    @property
    def first_pass_created(self) -> int:
        return self.passes[0].created

    @property
    def second_pass_created(self) -> int:
        return self.passes[1].created

    @property
    def must_be_idle(self) -> PassFigures | None:
        """The pass that must create nothing, in scenarios that have one."""
        index = {"mix": 1, "herd": 2}.get(self.scenario)
        return None if index is None else self.passes[index]

    def __str__(self) -> str:
        names = {"mix": ("first", "second"), "herd": ("cold", "minute later", "again")}.get(
            self.scenario, ("+5 s", "+10 s", "+15 s")
        )
        passes = "; ".join(f"{name} pass {figures}" for name, figures in zip(names, self.passes, strict=True))
        label = "recurring tasks" if self.scenario == "mix" else f"recurring tasks ({self.scenario})"
        return f"{self.tasks} {label} (inserted in {self.fill_seconds:.1f}s): {passes}"


def _backend_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of a local process, None if /proc does not show it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _BackendSampler:
    """The CPU used by the PostgreSQL backends of this process's connections, opened before or
    during the measurement: each is sampled every 10 ms while it lives (a pass's threads close
    their connections when they finish)."""

    def __init__(self) -> None:
        self._start: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.readable = True

    def add(self, pid: int) -> None:
        cpu = _backend_cpu(pid)
        with self._lock:
            if cpu is None:
                self.readable = False
            elif pid not in self._start:
                self._start[pid] = self._last[pid] = cpu

    def _sample(self) -> None:
        with self._lock:
            for pid in list(self._last):
                cpu = _backend_cpu(pid)
                if cpu is not None:
                    self._last[pid] = cpu

    def _loop(self) -> None:
        while not self._stop.wait(0.01):
            self._sample()

    def total(self) -> float | None:
        self._sample()
        return sum(self._last[pid] - self._start[pid] for pid in self._start) if self.readable else None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        thread = threading.Thread(target=self._loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join()


def _pid_of(conn: Any) -> int:
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def timed_pass(run: Callable[[], int]) -> PassFigures:
    """Run one pass and measure it."""
    connection.ensure_connection()
    sampler = _BackendSampler()
    sampler.add(_pid_of(connection))

    def opened(sender: Any, connection: Any, **kwargs: Any) -> None:
        sampler.add(_pid_of(connection))

    connection_created.connect(opened, weak=False)
    try:
        with sampler.running():
            cpu, started = time.process_time(), time.perf_counter()
            created = run()
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            db_cpu = sampler.total()
    finally:
        connection_created.disconnect(opened)
    return PassFigures(seconds, created, cpu, db_cpu)


def _fill_mix(owner_id: int, tasks: int) -> None:
    # The local minute, in each zone, of a fire time one to two minutes from now.
    soon = db_now() + timedelta(minutes=2)
    crons = [f"{soon.astimezone(ZoneInfo(zone)).minute} * * * *" for zone in ZONES]
    insert_tasks(
        owner_id=owner_id,
        count=tasks,
        columns={
            "name": "'scale ' || g",
            "start_at": "s.start_at",
            "interval": "CASE WHEN g %% 2 = 0 THEN interval '1 hour' END",
            "cron": "CASE WHEN g %% 2 = 1 THEN (%(crons)s::text[])[1 + g / 2 %% %(zones)s] ELSE '' END",
            "timezone": "CASE WHEN g %% 2 = 1 THEN (%(names)s::text[])[1 + g / 2 %% %(zones)s] ELSE 'UTC' END",
            "next_run_at": "s.start_at",
        },
        params={"crons": crons, "names": list(ZONES), "zones": len(ZONES)},
        # Interval tasks each on a grid of their own; cron tasks from now.
        lateral=", LATERAL (SELECT CASE WHEN g %% 2 = 0 THEN date_trunc('second', now()) "
        "+ g %% 240 * interval '1 second' + g %% 997 * interval '1 millisecond' "
        "ELSE date_trunc('second', now()) END AS start_at) AS s",
    )


def _fill_herd(owner_id: int, tasks: int) -> None:
    insert_tasks(
        owner_id=owner_id,
        count=tasks,
        columns={"name": "'herd ' || g", "start_at": "now()", "cron": "'* * * * *'", "next_run_at": "now()"},
    )


def _fill_steady(owner_id: int, tasks: int, horizon: float, anchor: datetime) -> None:
    # Each on its own grid (start spread over a minute, to the millisecond), its cursor at its
    # first occurrence after the horizon: materialised up to there.
    insert_tasks(
        owner_id=owner_id,
        count=tasks,
        columns={
            "name": "'steady ' || g",
            "start_at": "s.start_at",
            "interval": "interval '1 minute'",
            "next_run_at": "s.start_at + ceil(extract(epoch FROM %(anchor)s + %(horizon)s * interval '1 second' "
            "- s.start_at) / 60) * interval '1 minute'",
        },
        params={"horizon": horizon, "anchor": anchor},
        lateral=", LATERAL (SELECT date_trunc('second', %(anchor)s) - interval '1 hour' "
        "+ g::bigint * 60000 / %(count)s * interval '1 millisecond' AS start_at) AS s",
    )


def _cleanup(owner_id: int) -> None:
    # Set-based: a cascade through the ORM loads every row it deletes (a herd's half million).
    with connection.cursor() as cursor:
        for sql in (
            "DELETE FROM executions_skippedoccurrence WHERE task_id IN "
            "(SELECT id FROM tasks_app_task WHERE owner_id = %s)",
            "DELETE FROM executions_executionevent WHERE execution_id IN (SELECT e.id FROM executions_execution e "
            "JOIN tasks_app_task t ON t.id = e.task_id WHERE t.owner_id = %s)",
            "DELETE FROM executions_execution WHERE task_id IN (SELECT id FROM tasks_app_task WHERE owner_id = %s)",
            # Their versions (the check's tasks have no trigger URLs, dependencies, rules or
            # deliveries: it made them alone).
            "DELETE FROM tasks_app_taskversion WHERE task_id IN (SELECT id FROM tasks_app_task WHERE owner_id = %s)",
            f"DELETE FROM {Task._meta.db_table} WHERE owner_id = %s",  # noqa: S608 - the table name is ours
        ):
            cursor.execute(sql, [owner_id])


def _pass_at(until: datetime) -> int:
    """A pass whose horizon ends at ``until``."""
    return materialise_due(horizon=(until - db_now()).total_seconds())


def materialise_scale_check(*, tasks: int, scenario: str = "mix") -> ScaleResult:
    """Insert ``tasks`` recurring tasks as ``scenario`` says, time its materialiser passes, clean up."""
    owner = get_user_model().objects.get_or_create(username=SCALE_USER)[0]
    _cleanup(owner.pk)
    horizon = tms_settings().MATERIALISE_HORIZON
    # Passes "5 s later" are taken relative to this instant, however long the fill and the earlier
    # passes took on a loaded machine.
    anchor = db_now()
    started = time.monotonic()
    if scenario == "mix":
        _fill_mix(owner.pk, tasks)
    elif scenario == "herd":
        _fill_herd(owner.pk, tasks)
    else:
        _fill_steady(owner.pk, tasks, horizon, anchor)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_app_task")
    fill = time.monotonic() - started
    try:
        if scenario == "mix":
            passes = [timed_pass(materialise_due), timed_pass(materialise_due)]
        else:
            later = (0, 60, 60) if scenario == "herd" else (5, 10, 15)
            passes = [timed_pass(functools.partial(_pass_at, anchor + timedelta(seconds=horizon + s))) for s in later]
    finally:
        _cleanup(owner.pk)
    return ScaleResult(tasks, fill, passes, scenario)
