"""Start and stop real worker and monitor processes against the configured database and broker.

Used by ``manage.py chaos``, ``manage.py tms_bench`` and the end-to-end tests. Each process is
a session leader, so a whole worker (main process and pool) can be killed or paused at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]


def database_url(db: Mapping[str, Any]) -> str:
    """The ``postgres://`` URL of a Django database's settings, as the platform's processes take it.

    A libpq multi-host database (``HOST`` ``"h1,h2"``, ``PORT`` ``"p1,p2"``, as django-environ reads
    ``postgres://u@h1:p1,h2:p2/db``) keeps each host with its port, and the libpq options
    (``target_session_attrs=read-write``, ``connect_timeout``) go along as the query: without them
    a process given a Patroni pair would connect to whichever node answers first, standby or not.
    """
    auth = quote(db.get("USER") or "", safe="") + (f":{quote(db['PASSWORD'], safe='')}" if db.get("PASSWORD") else "")
    hosts = str(db.get("HOST") or "127.0.0.1").split(",")
    ports = str(db.get("PORT") or "5432").split(",")
    if len(ports) == 1:
        ports *= len(hosts)
    options = {key: value for key, value in (db.get("OPTIONS") or {}).items() if isinstance(value, str | int)}
    if hosts[0].startswith("/"):  # a Unix socket's directory (the embedded server): libpq's ?host=
        options = {"host": hosts[0], "port": ports[0], **options}
        netloc = ""
    elif not db.get("HOST") and "host" in options:  # given as ?host= already
        netloc = ""
    else:
        netloc = ",".join(f"{host}:{port}" for host, port in zip(hosts, ports, strict=True))
    return f"postgres://{auth}@{netloc}/{db['NAME']}" + (f"?{urlencode(options)}" if options else "")


def process_env(**extra: str) -> dict[str, str]:
    """The environment for a platform process: this process's database, broker and queue."""
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url(settings.DATABASES["default"])
    env.update(
        # The settings of this process (local or test), which install tooling: its workers must
        # know the benchmark's task.
        DJANGO_SETTINGS_MODULE=settings.SETTINGS_MODULE,
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        TMS_QUEUE=settings.TMS_QUEUE,
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def _session_members(sid: int) -> list[int]:
    """Every running process of session ``sid`` (Linux: from /proc; elsewhere none)."""
    members = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if os.getsid(int(entry)) == sid:
                        members.append(int(entry))
    return members


class ManagedProcess:
    """A platform process with its output in a log file (with ``split_stderr``, its stderr, where
    the logging goes, in a second file: :meth:`stderr`)."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], log_dir: Path, *, split_stderr: bool = False
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = log_dir / f"{name}-{os.getpid()}-{time.monotonic_ns()}.log"
        self.stderr_path = self.log_path.with_suffix(".stderr.log") if split_stderr else None
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._err = open(self.stderr_path, "wb") if self.stderr_path else None  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._log, stderr=self._err or subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") + self.stderr()

    def stderr(self) -> str:
        """What the process wrote to stderr, if kept apart (``split_stderr``); else empty."""
        return self.stderr_path.read_text(errors="replace") if self.stderr_path else ""

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the process and everything it started (a worker's pool), as a crash, a
        pause or a kill of the whole machine would reach them.

        That is the process's session (it leads one), not only its process group: a worker's pool
        processes leave the group when they start (``executions/tasks.py``), so that a stop sent to
        the group reaches the main process alone; they stay in the session, also once the main
        process is gone.
        """
        if self.popen.returncode is not None and os.path.exists(f"/proc/{self.popen.pid}"):
            # Reaped, and its number taken again by another process: the kernel hands out no number
            # still in use as a session or group id, so nothing of ours is left under it.
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)
        for pid in _session_members(self.popen.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def stop(self, timeout: float = 15) -> None:
        if self.alive:
            self.signal_group(signal.SIGCONT)
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.popen.wait(5)
        else:
            self.signal_group(signal.SIGKILL)  # pool processes a killed main process left behind
        self._log.close()
        if self._err is not None:
            self._err.close()


def start_worker(
    name: str,
    *,
    log_dir: Path,
    concurrency: int = 2,
    pool: str = "prefork",
    split_stderr: bool = False,
    queue: str = "",
    **env: str,
) -> ManagedProcess:
    """A Celery worker consuming ``queue`` (default: the execution queue, ``TMS_QUEUE``)."""
    node = f"{name}-{time.monotonic_ns()}@%h"
    argv = [
        sys.executable, "-m", "celery", "-A", "tms_project", "worker", "-l", "info", "-n", node,
        "-c", str(concurrency), "-P", pool, "-Q", queue or settings.TMS_QUEUE, "--without-mingle", "--without-gossip",
    ]  # fmt: skip
    return ManagedProcess(name, argv, process_env(**env), log_dir, split_stderr=split_stderr)


def start_monitor(name: str, *, log_dir: Path, split_stderr: bool = False, **env: str) -> ManagedProcess:
    argv = [sys.executable, "manage.py", "run_monitor"]
    return ManagedProcess(name, argv, process_env(**env), log_dir, split_stderr=split_stderr)


def start_beat(name: str, *, log_dir: Path, **env: str) -> ManagedProcess:
    """Celery beat with the configured scheduler (django-celery-beat's DatabaseScheduler); no
    pid file, so that several checkouts on one machine do not refuse each other."""
    argv = [sys.executable, "-m", "celery", "-A", "tms_project", "beat", "-l", "info", "--pidfile="]
    return ManagedProcess(name, argv, process_env(**env), log_dir)


def monitor_stats(log: str) -> dict[str, Any] | None:
    """The last stats a monitor logged as it stopped (``monitor stats {...}``), from its log in
    either format: plain lines, or JSON lines (the production default, ``TMS_LOG_FORMAT=json``),
    where the stats are escaped inside the line's message."""
    found = None
    for line in log.splitlines():
        if "monitor stats" not in line:
            continue
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            line = json.loads(line).get("message", line)
        match = re.search(r"monitor stats (\{.*\})", line)
        if match:
            with contextlib.suppress(ValueError):
                found = json.loads(match.group(1))
    return found


def wait_ready(proc: ManagedProcess, timeout: float = 30, line: str = " ready.") -> None:
    """Wait until a worker logs that it is ready (or another process logs ``line``); raise if it
    exits first."""
    deadline = time.monotonic() + timeout
    while line not in proc.log():
        if not proc.alive:
            raise RuntimeError(f"{proc.name} exited early:\n{proc.log()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.name} not ready after {timeout}s:\n{proc.log()[-3000:]}")
        time.sleep(0.1)
