"""Real platform processes for end-to-end, race and recovery tests.

Workers and monitors run as separate OS processes against the test database and the test
run's own RabbitMQ queue, exactly as in production.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = ROOT / "var" / "test-logs"


def process_env(**extra: str) -> dict[str, str]:
    db = settings.DATABASES["default"]
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tms_project.settings.test",
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        TMS_QUEUE=settings.TMS_QUEUE,
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = LOG_DIR / f"{name}-{os.getpid()}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def stop(self, timeout: float = 15) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()


def start_worker(name: str = "worker", *, concurrency: int = 2, pool: str = "prefork", **env: str) -> Proc:
    node = f"{name}-{time.monotonic_ns()}@%h"
    argv = [
        sys.executable, "-m", "celery", "-A", "tms_project", "worker", "-l", "info", "-n", node,
        "-c", str(concurrency), "-P", pool, "-Q", settings.TMS_QUEUE, "--without-mingle", "--without-gossip",
    ]  # fmt: skip
    return Proc(name, argv, process_env(**env))


def start_monitor(name: str = "monitor", **env: str) -> Proc:
    return Proc(name, [sys.executable, "manage.py", "run_monitor"], process_env(**env))


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
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
        connection.close_if_unusable_or_obsolete()


def wait_worker_ready(proc: Proc, timeout: float = 30) -> None:
    def ready() -> bool:
        if proc.popen.poll() is not None:
            raise AssertionError(f"{proc.name} exited early:\n{proc.log()[-3000:]}")
        return " ready." in proc.log()

    wait_for(ready, timeout=timeout, what=f"{proc.name} to be ready")


@contextmanager
def running(*procs: Proc) -> Iterator[tuple[Proc, ...]]:
    try:
        yield procs
    finally:
        for proc in procs:
            proc.stop()
