"""A ``tms_bench`` that is stopped stops what it started (real processes, the real services)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _processes(marker: str, *, file: str = "cmdline") -> list[int]:
    """Pids of the running processes whose ``/proc/<pid>/<file>`` (command line, environment)
    holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                text = Path(f"/proc/{entry}/{file}").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in text:
                found.append(int(entry))
    return found


def _platform(queue: str) -> list[int]:
    """The processes started for ``queue``: each has it in its environment (the monitor, beat)."""
    return _processes(f"TMS_QUEUE={queue}", file="environ")


@pytest.mark.timeout(300)
def test_a_tms_bench_ended_by_sigterm_stops_its_workers_and_monitor():
    """SIGTERM's default ended the command alone: its worker and monitor, each in a session of
    its own, went on consuming the queue (seen after a benchmark was killed on the shared
    machine: five orphaned processes)."""
    queue = f"tms.benchstop.{os.getpid()}.{time.monotonic_ns()}"
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "TMS_QUEUE": queue,
        "TMS_NOTIFY_QUEUE": f"{queue}.notify",
    }
    argv = [sys.executable, "manage.py", "tms_bench", "--scenario", "sustained", "--rate", "5"]
    argv += ["--duration", "120", "--no-celery-eta"]
    bench = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not _processes(f"-Q {queue} ") and time.monotonic() < deadline:
            assert bench.poll() is None, "tms_bench ended before its worker started"
            time.sleep(0.5)
        assert _processes(f"-Q {queue} "), "tms_bench's worker never started"
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=120) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 60
        while _platform(queue) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _platform(queue) == [], "processes of the stopped benchmark still run"
    finally:
        if bench.poll() is None:
            bench.kill()
        for pid in _platform(queue):
            os.kill(pid, signal.SIGKILL)
