"""Stopping the platform (issue 34). Ctrl-C on ``make run`` ends every process it started, with no
SIGKILL from the process manager, a busy worker handing its run back; a second ``make run`` finds
an earlier one still running and says so; a worker given SIGTERM or SIGINT, sent to it alone (a
service manager) or to its whole process group (a terminal, honcho), exits within its grace plus
its pool's own stop, on the embedded default and on PostgreSQL + RabbitMQ. Before the fix a
worker of the embedded default hung for ever at exit in billiard's pool finaliser.

Real processes only: honcho and every process of the Procfile, and Celery workers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg2
import pytest

from tasks_api.creation import task_create
from tests.factories import UserFactory
from tests.processes import LOG_DIR, ROOT, ManagedProcess, running, start_monitor, start_worker, wait_for
from tms_core import embedded_db
from tooling.harness.processes import wait_ready
from tooling.run_platform import STOP_MARGIN, platform_key, strays

GRACE = 2.0
#: What a stopped worker may take beyond its grace: its pool's stop. Billiard's pool without an
#: event loop (the embedded broker's) waits in steps of a second: about 4 s on an idle machine.
POOL_STOP = 8.0
#: A run longer than the test, short enough to sleep inside the pool process (SleepRunner).
LONG_RUN = "25s"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _embedded_env(var: Path, **extra: str) -> dict[str, str]:
    """``make run``'s environment with nothing configured: the embedded PostgreSQL and the filesystem broker under
    ``var`` (the suite's own database and broker settings removed)."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL"}}
    env.update(
        DJANGO_SETTINGS_MODULE="tms_project.settings.local",
        TMS_VAR_DIR=str(var),
        PROMETHEUS_MULTIPROC_DIR=str(var / "metrics"),
        TMS_SHUTDOWN_GRACE=str(GRACE),
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


@pytest.fixture(scope="module")
def embedded_var(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A migrated embedded default, shared by this module's tests."""
    var = tmp_path_factory.mktemp("embedded")
    (var / "metrics").mkdir()
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=_embedded_env(var), check=True, timeout=300
    )
    yield var
    embedded_db.stop(var)


def _gone(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has ended: only its parent has not reaped it)."""
    left = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            continue
    return left


def _wait_gone(pids: list[int], timeout: float) -> tuple[float, list[int]]:
    """Seconds until every one of ``pids`` ended, and those still running after ``timeout``."""
    start = time.monotonic()
    while (left := _gone(pids)) and time.monotonic() - start < timeout:
        time.sleep(0.05)
    return time.monotonic() - start, left


def _running_executions(var: Path) -> int:
    db = embedded_db.settings_dict(var)
    conn = psycopg2.connect(host=db["HOST"], user=db["USER"], dbname=db["NAME"])
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM executions_execution WHERE status = 'RUNNING'")
            return cur.fetchone()[0]
    finally:
        conn.close()


def _create_long_run(env: dict[str, str]) -> None:
    script = (
        "from django.contrib.auth import get_user_model\n"
        "from tasks_api.creation import task_create\n"
        "owner = get_user_model().objects.create_user('stopper')\n"
        f"task_create(owner=owner, runner='sleep', config={{'duration': '{LONG_RUN}'}})\n"
    )
    subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=env, check=True, timeout=120)


@pytest.fixture
def make_run(embedded_var: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, dict[str, str]]]:
    """``make run``'s process manager (tooling.run_platform over tms_project/Procfile), started as
    the Makefile starts it, in a session of its own as a terminal's foreground job is."""
    env = _embedded_env(embedded_var, PORT=str(_free_port()), FLOWER_PORT=str(_free_port()), TMS_BANNER_DELAY="0")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # as the Makefile sets it
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # as the Makefile sets it
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"make-run-{os.getpid()}-{time.monotonic_ns()}.log"
    argv = [
        sys.executable,
        "-m",
        "tooling.run_platform",
        "--procfile",
        "tms_project/Procfile",
        "--app-root",
        ".",
        "start",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc, log, env
    finally:
        # Whatever the test left: every process of this platform, by its mark.
        for pid, _ in strays(platform_key(ROOT, env)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.mark.slow
def test_ctrl_c_on_make_run_ends_every_process_it_started(make_run):
    proc, log, env = make_run
    key = platform_key(ROOT, env)

    def up() -> bool:
        text = log.read_text(errors="replace")
        assert proc.poll() is None, text[-3000:]
        return " ready." in text and "Listening at" in text and "monitor" in text

    wait_for(up, timeout=120, what="make run to start")
    _create_long_run(env)
    var = Path(env["TMS_VAR_DIR"])
    wait_for(lambda: _running_executions(var) == 1, timeout=60, what="a run")

    # A second make run of the same checkout, database and broker finds this one and refuses.
    second = subprocess.run(
        [sys.executable, "-m", "tooling.run_platform", "start"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    platform = strays(key)
    worker_pids = [pid for pid, cmd in platform if " worker " in cmd and not cmd.startswith("/bin/sh")]
    assert second.returncode == 1
    assert "still running" in second.stderr and str(worker_pids[0]) in second.stderr
    assert len(worker_pids) == 3, platform  # the worker and its two pool processes

    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
    took, left = _wait_gone([pid for pid, _ in platform], GRACE + STOP_MARGIN + 5)
    assert proc.wait(10) is not None
    print(f"Ctrl-C: every process ended in {took:.1f}s")
    text = log.read_text(errors="replace")
    assert left == [], f"still running {took:.1f}s after Ctrl-C: {left}\n{text[-3000:]}"
    assert "sending SIGKILL" not in text, text[-3000:]
    assert took < GRACE + POOL_STOP, text[-3000:]
    assert "handed back 1 execution(s) on shutdown" in text
    assert strays(key) == []
    # The embedded PostgreSQL stopped with the rest.
    assert not (embedded_db.pgdata(var) / "postmaster.pid").exists()


def _embedded_worker(var: Path) -> ManagedProcess:
    argv = [sys.executable, "-m", "celery", "-A", "tms_project", "worker", "-l", "info", "-c", "2"]
    return ManagedProcess(
        "embedded-worker", [*argv, "--without-mingle", "--without-gossip"], _embedded_env(var), LOG_DIR
    )


def _stop(worker: ManagedProcess, sig: signal.Signals, to: str) -> tuple[float, list[int]]:
    """Send ``sig`` to the worker alone (``main``: a service manager) or its process group
    (``group``: a terminal or honcho); return how long until it and its pool ended."""
    pids = [worker.pid, *(child.pid for child in psutil.Process(worker.pid).children(recursive=True))]
    assert len(pids) == 3, pids  # the worker and its two pool processes
    if to == "group":
        os.killpg(worker.pid, sig)
    else:
        worker.popen.send_signal(sig)
    took, left = _wait_gone(pids, GRACE + POOL_STOP + 20)
    print(f"{sig.name} to the {to}: stopped in {took:.1f}s")
    return took, left


def _ids(stops: list[tuple[signal.Signals, str]]) -> list[str]:
    return [f"{sig.name}-{to}" for sig, to in stops]


#: make run's Ctrl-C (SIGINT to the group: honcho's) stops a busy worker of the embedded default
#: above; test_graceful_shutdown stops busy ones with SIGTERM to the worker alone.
EMBEDDED_STOPS = [(signal.SIGTERM, "main"), (signal.SIGINT, "group")]


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "to"), EMBEDDED_STOPS, ids=_ids(EMBEDDED_STOPS))
def test_an_idle_worker_of_the_embedded_default_exits_on_a_stop(embedded_var, sig, to):
    worker = _embedded_worker(embedded_var)
    with running(worker):
        wait_ready(worker, timeout=60)
        took, left = _stop(worker, sig, to)
        assert left == [], f"still running {took:.1f}s after {sig.name} to the {to}:\n{worker.log()[-3000:]}"
        assert took < GRACE + POOL_STOP, worker.log()[-3000:]
        assert worker.popen.wait(5) == (1 if sig == signal.SIGINT else 0)  # Celery's codes for Ctrl-C and TERM


ENV = {"TMS_SHUTDOWN_GRACE": str(GRACE), "TMS_MONITOR_MAX_SLEEP": "0.3", "TMS_WORKER_TIMEOUT": "60"}


RABBITMQ_STOPS = [(signal.SIGTERM, "group", False), (signal.SIGINT, "group", True)]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("sig", "to", "busy"), RABBITMQ_STOPS, ids=["SIGTERM-group-idle", "SIGINT-group-busy"])
def test_a_worker_on_postgresql_and_rabbitmq_exits_on_a_stop(sig, to, busy):
    from executions.models import Execution
    from executions.models import ExecutionStatus as S

    worker = start_worker("stop", **ENV)
    with running(worker, start_monitor(**ENV)):
        wait_ready(worker, timeout=60)
        if busy:
            task = task_create(owner=UserFactory(), runner="sleep", config={"duration": LONG_RUN})
            wait_for(lambda: Execution.objects.filter(task=task, status=S.RUNNING).exists(), timeout=30, what="the run")
        took, left = _stop(worker, sig, to)
        assert left == [], f"still running {took:.1f}s after {sig.name} to the {to}:\n{worker.log()[-3000:]}"
        assert took < GRACE + POOL_STOP, worker.log()[-3000:]
        if busy:
            assert "handed back 1 execution(s) on shutdown" in worker.log()
            (execution,) = Execution.objects.filter(task=task)
            assert execution.status not in {S.FAILED, S.CANCELLED}  # handed back: another worker resumes it
