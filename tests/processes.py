"""Real platform processes for end-to-end, race and recovery tests.

Workers and monitors run as separate OS processes against the test database and the test
run's own RabbitMQ queue, exactly as in production.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from django.db import InterfaceError, OperationalError, connection

from tooling.harness import processes
from tooling.harness.processes import ROOT, ManagedProcess

LOG_DIR = ROOT / "var" / "test-logs"
TEST_SETTINGS = {"DJANGO_SETTINGS_MODULE": "tms_project.settings.test"}

__all__ = ["ROOT", "ManagedProcess", "process_env", "running", "start_monitor", "start_worker", "wait_for"]


def process_env(**extra: str) -> dict[str, str]:
    return processes.process_env(**TEST_SETTINGS, **extra)


def start_worker(
    name: str = "worker", *, concurrency: int = 2, pool: str = "prefork", split_stderr: bool = False, **env: str
) -> ManagedProcess:
    return processes.start_worker(
        name, log_dir=LOG_DIR, concurrency=concurrency, pool=pool, split_stderr=split_stderr, **TEST_SETTINGS, **env
    )


def start_monitor(name: str = "monitor", *, split_stderr: bool = False, **env: str) -> ManagedProcess:
    return processes.start_monitor(name, log_dir=LOG_DIR, split_stderr=split_stderr, **TEST_SETTINGS, **env)


def run_command(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=process_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def wait_for(
    predicate: Callable[[], object], *, timeout: float, interval: float = 0.05, what: str = "condition"
) -> object:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (OperationalError, InterfaceError):  # the database is restarting: ask again
            connection.close()
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
        # A test without database access (pytest-django blocks it) that polls something else: a
        # connection an earlier test of this pytest process left open is not its to check.
        with suppress(RuntimeError):
            connection.close_if_unusable_or_obsolete()


def wait_worker_ready(proc: ManagedProcess, timeout: float = 30) -> None:
    processes.wait_ready(proc, timeout)


@contextmanager
def running(*procs: ManagedProcess) -> Iterator[tuple[ManagedProcess, ...]]:
    try:
        yield procs
    finally:
        for proc in procs:
            proc.stop()
