"""A bounded database connection budget: `make run` serves through the same gunicorn configuration
as the image, so 400 concurrent API requests queue for its workers instead of opening a connection
each (the development server did, until PostgreSQL answered "too many clients" and the API a 500);
and when PostgreSQL does refuse a connection, the API answers 503 with Retry-After, never a 500.

Each test watches ``pg_stat_activity`` for the web process's own connections (an
``application_name`` of its own, or a role of its own) while the requests are in flight."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg2
import pytest
import requests
from django.conf import settings
from django.db import connection

from executions.periodic import register_periodic_tasks
from tests.conftest import account_key_for
from tests.processes import LOG_DIR, ROOT, ManagedProcess, process_env, wait_for
from tests.web import free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CONCURRENT = 400
CELERY = (sys.executable, "-m", "celery", "-A", "tms_project")


def procfile_web_command() -> str:
    """The command `make run` starts for the web (honcho runs it through the shell)."""
    (line,) = [line for line in (ROOT / "tms_project" / "Procfile").read_text().splitlines() if line.startswith("web:")]
    return line.removeprefix("web:").strip()


def _database_url(*, user: str, application_name: str) -> str:
    db = settings.DATABASES["default"]
    server = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
    return f"postgres://{user}@{server}/{db['NAME']}?application_name={application_name}"


#: The web process's own server processes in this database: by application name, or by role.
COUNT = {
    "application_name": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name = %s",
    "usename": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND usename = %s",
}


def start_make_run_web(**env: str) -> tuple[ManagedProcess, str]:
    """The web process exactly as `make run` starts it (the Procfile's line, through ``sh``)."""
    port = free_port()
    environment = process_env(
        # make run's own environment (Makefile): the virtualenv first on PATH, DEBUG on.
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        PORT=str(port),
        DJANGO_DEBUG="true",
        **env,
    )
    web = ManagedProcess("web-make-run", ["sh", "-c", procfile_web_command()], environment, LOG_DIR)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: f"Listening at: {base}" in web.log(), timeout=30, what="make run's web to listen")
    except AssertionError:
        web.stop()
        raise
    return web, base


def _connections(by: str, value: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(COUNT[by], [value])
        return cursor.fetchone()[0]


class ConnectionSampler:
    """Counts, every 20 ms until stopped, the server processes of ``by`` = ``value``; keeps the highest."""

    def __init__(self, by: str, value: str) -> None:
        db = settings.DATABASES["default"]
        self._conn = psycopg2.connect(
            host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]
        )
        self._conn.autocommit = True
        self._sql = COUNT[by]
        self._params = (value,)
        self.highest = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._conn.cursor() as cursor:
            while not self._stop.is_set():
                cursor.execute(self._sql, self._params)
                self.highest = max(self.highest, cursor.fetchone()[0])
                self.samples += 1
                time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=10)
        self._conn.close()
        return self.highest


def fire(url: str, token: str, count: int = CONCURRENT) -> list[tuple[int, str | None, str]]:
    """``count`` GETs released at once from ``count`` threads: (status, Retry-After, error type)."""
    start = threading.Barrier(count)

    def one(_: int) -> tuple[int, str | None, str]:
        start.wait()
        response = requests.get(url, headers={"Authorization": f"Token {token}"}, timeout=120)
        kind = response.json().get("type", "") if response.status_code >= 400 else ""
        return response.status_code, response.headers.get("Retry-After"), kind

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count)))


def test_make_run_serves_through_gunicorn_with_the_images_configuration():
    command = procfile_web_command()
    assert "gunicorn --config docker/gunicorn.conf.py tms_project.wsgi" in command
    assert command.startswith("exec ")  # gunicorn itself gets the SIGTERM of Ctrl-C or honcho
    assert "runserver" not in (ROOT / "tms_project" / "Procfile").read_text()
    # Local settings and human-readable logs unless the environment says otherwise; loopback only.
    assert "DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-tms_project.settings.local}" in command
    assert "TMS_WEB_HOST=127.0.0.1" in command and "TMS_LOG_FORMAT=${TMS_LOG_FORMAT:-plain}" in command


def test_400_concurrent_requests_to_make_runs_web_stay_within_its_connection_budget(user):
    token = account_key_for(user)
    name = f"tms-budget-web-{os.getpid()}"
    # make run's defaults: WEB_CONCURRENCY=2 workers x GUNICORN_THREADS=1 thread, one persistent
    # connection each (docker/gunicorn.conf.py).
    budget = 2 * 1
    url = _database_url(user=settings.DATABASES["default"]["USER"], application_name=name)
    web, base = start_make_run_web(DATABASE_URL=url)
    sampler = ConnectionSampler("application_name", name)
    try:
        answers = fire(f"{base}/api/v1/tasks", token)
    finally:
        highest = sampler.stop()
        web.stop()
    statuses = Counter(status for status, _, _ in answers)
    print(f"make run's web, {CONCURRENT} concurrent requests: {dict(statuses)}; connections {highest} of {budget}")
    assert set(statuses) <= {200, 503}, statuses
    assert statuses[200] >= 1
    assert all(retry_after for status, retry_after, _ in answers if status == 503)
    assert 1 <= highest <= budget, (highest, sampler.samples)
    assert "Traceback" not in web.log()
    # Stopped (SIGTERM, as Ctrl-C or honcho sends it), gunicorn and its workers leave with their connections.
    wait_for(lambda: not _connections("application_name", name), timeout=30, what="the web's connections to close")


def test_a_refused_database_connection_answers_503_with_retry_after_never_500(user):
    """PostgreSQL refusing a connection (SQLSTATE 53300, as "sorry, too many clients already"),
    here through a role limited to 2 connections while gunicorn runs 8 threads: every request is
    answered 200 or 503 with Retry-After in the API's error shape; none is a 500."""
    token = account_key_for(user)
    role, limit, threads = f"tms_budget_{os.getpid()}", 2, 8
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT {limit}')
        cursor.execute(f'GRANT USAGE ON SCHEMA public TO "{role}"')
        cursor.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"')
        cursor.execute(f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
    web = None
    try:
        web, base = start_make_run_web(
            DATABASE_URL=_database_url(user=role, application_name=role),
            WEB_CONCURRENCY="1",
            GUNICORN_THREADS=str(threads),
            TMS_RETRY_AFTER="3",
        )
        sampler = ConnectionSampler("usename", role)
        try:
            answers = fire(f"{base}/api/v1/tasks", token)
        finally:
            highest = sampler.stop()
        statuses = Counter(status for status, _, _ in answers)
        print(f"{threads} threads, role limited to {limit} connections: {dict(statuses)}; most connections {highest}")
        assert set(statuses) == {200, 503}, statuses
        assert {(retry_after, kind) for status, retry_after, kind in answers if status == 503} == {
            ("3", "service_unavailable")
        }
        assert highest <= limit
        log = web.log()
        refused = r"database unavailable during GET /api/v1/tasks: OperationalError: .*too many connections"
        assert re.search(refused, log)
        assert "Traceback" not in log
    finally:
        if web is not None:
            web.stop()
        wait_for(lambda: not _connections("usename", role), timeout=30, what="the web's connections to close")
        with connection.cursor() as cursor:
            cursor.execute(f'DROP OWNED BY "{role}"')
            cursor.execute(f'DROP ROLE "{role}"')


class ConnectionsByName:
    """Every 50 ms until stopped: this database's server processes per ``application_name``; keeps
    the highest count of each."""

    def __init__(self) -> None:
        db = settings.DATABASES["default"]
        self._conn = psycopg2.connect(
            host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]
        )
        self._conn.autocommit = True
        self.highest: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sql = (
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() GROUP BY application_name"
        )
        with self._conn.cursor() as cursor:
            while not self._stop.is_set():
                cursor.execute(sql)
                for name, count in cursor.fetchall():
                    self.highest[name] = max(self.highest[name], count)
                time.sleep(0.05)

    def stop(self) -> Counter[str]:
        self._stop.set()
        self._thread.join(timeout=10)
        self._conn.close()
        return self.highest


def test_each_process_kind_holds_no_more_connections_than_its_stated_budget(user):
    """The budget docs/deployment.md's "Scaling out" states, per process, measured on the real processes while
    they work: a worker (2 pool processes) running short and long runs, the monitor, beat, Flower."""
    from tasks_api.creation import task_create
    from tests.processes import start_monitor, start_worker

    register_periodic_tasks()
    concurrency, materialise_threads = 2, settings.TMS["MATERIALISE_THREADS"]
    budget = {
        # heartbeat thread of the main process + per pool process (task, lease keeper) + a
        # materialiser pass draining a backlog
        "worker": 1 + 2 * concurrency + materialise_threads,
        "monitor": 2,  # its passes + its LISTEN connection
        "beat": 1,  # the DatabaseScheduler
        "flower": 0,
    }
    names = {kind: f"tms-budget-{kind}-{os.getpid()}" for kind in budget}
    user_name = settings.DATABASES["default"]["USER"]

    def url(kind: str) -> str:
        return _database_url(user=user_name, application_name=names[kind])

    sampler = ConnectionsByName()
    procs = [
        # A heartbeat every second, so the lease keeper of a 4 s run extends its lease (a connection).
        start_worker("budget-worker", concurrency=concurrency, DATABASE_URL=url("worker"), TMS_HEARTBEAT_INTERVAL="1"),
        start_monitor("budget-monitor", DATABASE_URL=url("monitor")),
        ManagedProcess(
            "budget-beat",
            [*CELERY, "beat", "--pidfile="],
            process_env(DATABASE_URL=url("beat"), TMS_LOG_HOUSEKEEPING="true"),
            LOG_DIR,
        ),
        ManagedProcess(
            "budget-flower",
            [*CELERY, "flower", "--address=127.0.0.1", f"--port={free_port()}"],
            process_env(DATABASE_URL=url("flower")),
            LOG_DIR,
        ),
    ]
    try:
        tasks = [task_create(owner=user, runner="sleep", config={"duration": "4s"})]
        tasks += [task_create(owner=user, runner="noop") for _ in range(6)]
        wait_for(
            lambda: all(
                task.executions.filter(status="SUCCEEDED").exists()  # type: ignore[attr-defined]
                for task in tasks
            ),
            timeout=90,
            interval=0.5,
            what="the runs to succeed",
        )
        wait_for(
            lambda: "Sending due task tms: materialise upcoming executions" in procs[2].log(),
            timeout=30,
            what="beat to send the materialiser job",
        )
        assert "Visit me at" in procs[3].log() or procs[3].alive
    finally:
        highest = sampler.stop()
        for proc in procs:
            proc.stop()
    held = {kind: highest[names[kind]] for kind in budget}
    print(f"connections held (most seen): {held}; budget {budget}")
    for kind, most in held.items():
        assert most <= budget[kind], (kind, most, budget[kind])
    assert held["monitor"] == 2 and held["beat"] == 1 and held["worker"] >= 2
