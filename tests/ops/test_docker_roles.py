"""Each role of docker/entrypoint.sh starts with the production settings against the local
PostgreSQL (a fresh database of this test's own) and RabbitMQ (a queue of its own), becomes ready,
and stops cleanly on SIGTERM, as it would in its container."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
import requests
from cryptography.fernet import Fernet
from django.conf import settings
from kombu import Connection

from executions.periodic import periodic_jobs
from notifications.periodic import periodic_jobs as notification_jobs
from tests.processes import LOG_DIR, ROOT, ManagedProcess, wait_for
from tests.web import free_port

pytestmark = pytest.mark.slow

ENTRYPOINT = str(ROOT / "docker" / "entrypoint.sh")


def _admin(sql: str) -> None:
    """Run ``sql`` outside a transaction (CREATE/DROP DATABASE) on the server's maintenance database."""
    db = settings.DATABASES["default"]
    conn = psycopg2.connect(
        host=db["HOST"] or "127.0.0.1",
        port=db["PORT"] or 5432,
        user=db["USER"],
        password=db["PASSWORD"] or None,
        dbname="postgres",
    )
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql)
    finally:
        conn.close()


@pytest.fixture(scope="module")
def role_env() -> Iterator[dict[str, str]]:
    """The container's environment: production settings, a fresh database, a queue of its own."""
    db = settings.DATABASES["default"]
    name = f"tms_roles_{os.getpid()}"
    queue = f"tms.roles.{os.getpid()}"
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _admin(f'CREATE DATABASE "{name}"')
    var = tempfile.mkdtemp(prefix="tms-roles-")
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER")
    env = {key: value for key, value in os.environ.items() if key in keep}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="tms_project.settings.production",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        # A key of its own: production refuses the test settings' (a key from the repository).
        TMS_SECRET_KEYS=Fernet.generate_key().decode(),
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{name}",
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        TMS_QUEUE=queue,
        TMS_VAR_DIR=var,
        TMS_SUBPROCESS_WORK_DIR=os.path.join(var, "runs"),
        TMS_LOG_LEVEL="INFO",
        # The beat check below reads its "Sending due task" line, which is quiet by default.
        TMS_LOG_HOUSEKEEPING="true",
        TMS_WEB_HOST="127.0.0.1",
        PORT=str(free_port()),
        WEB_CONCURRENCY="1",
        TMS_WORKER_CONCURRENCY="1",
        FLOWER_ADDRESS="127.0.0.1",
        FLOWER_PORT=str(free_port()),
        FLOWER_BASIC_AUTH="ops:flower-password",
    )
    yield env
    # The queue is missing if the worker never started: nothing to delete then.
    with Connection(settings.CELERY_BROKER_URL) as conn, contextlib.suppress(Exception):
        conn.default_channel.queue_delete(queue)
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _query(env: dict[str, str], sql: str) -> list[tuple]:
    conn = psycopg2.connect(env["DATABASE_URL"])
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchall()
    finally:
        conn.close()


def _run(env: dict[str, str], *argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
    # From "/": the entrypoint finds the application from its own path, as in the image.
    return subprocess.run(
        ["sh", ENTRYPOINT, *argv], cwd="/", env={**env, **extra}, capture_output=True, text=True, timeout=180
    )


def _start(env: dict[str, str], role: str) -> ManagedProcess:
    return ManagedProcess(f"role-{role}", ["sh", ENTRYPOINT, role], env, LOG_DIR)


def _ready(proc: ManagedProcess, predicate, what: str, timeout: float = 90):  # type: ignore[no-untyped-def]
    def check():  # type: ignore[no-untyped-def]
        assert proc.alive, f"{proc.name} exited ({proc.popen.returncode}):\n{proc.log()[-3000:]}"
        return predicate()

    return wait_for(check, timeout=timeout, interval=0.5, what=what)


def test_every_role_starts_becomes_ready_and_stops(role_env):
    env = role_env
    # migrate: applies every migration to the empty database, registers beat's jobs, exits 0.
    migrate = _run(env, "migrate")
    assert migrate.returncode == 0, migrate.stderr
    assert "Applying executions.0001_initial... OK" in migrate.stdout
    assert _query(env, "SELECT count(*) FROM django_celery_beat_periodictask")[0][0] == len(periodic_jobs()) + len(
        notification_jobs()
    )
    again = _run(env, "migrate")
    assert again.returncode == 0 and "No migrations to apply." in again.stdout

    procs = {role: _start(env, role) for role in ("web", "worker", "beat", "monitor")}
    # As compose gives it: Flower reads the broker, never the database (no DATABASE_URL).
    procs["flower"] = _start({k: v for k, v in env.items() if k != "DATABASE_URL"}, "flower")
    try:
        # web: gunicorn answers /readyz 200 (database, broker and migrations checked).
        base = f"http://127.0.0.1:{env['PORT']}"

        def web_ready():  # type: ignore[no-untyped-def]
            try:
                response = requests.get(f"{base}/readyz", timeout=5)
            except (requests.ConnectionError, requests.Timeout):  # not listening yet, or still booting its worker
                return None
            return response.status_code == 200 and response

        ready = _ready(procs["web"], web_ready, "web /readyz 200")
        assert ready.headers["Server"].startswith("gunicorn")
        assert ready.json()["status"] == "ready"
        assert requests.get(f"{base}/healthz", timeout=5).json() == {"status": "alive"}
        # The API itself runs with the production hardening: plain HTTP is redirected to HTTPS.
        assert requests.get(f"{base}/api/v1/tasks", allow_redirects=False, timeout=5).status_code == 301

        # worker: registers its Worker row and heartbeats it.
        _ready(
            procs["worker"],
            lambda: _query(env, "SELECT id FROM executions_worker WHERE status = 'ALIVE'"),
            "worker row ALIVE",
        )
        # monitor: holds its LISTEN connection.
        _ready(
            procs["monitor"],
            lambda: _query(
                env, "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN tms_due'"
            ),
            "monitor LISTEN session",
        )
        # beat: starts with the database scheduler and sends the materialiser job (every 5 s).
        _ready(
            procs["beat"],
            lambda: "Sending due task tms: materialise upcoming executions" in procs["beat"].log(),
            "beat to send the materialiser job",
        )
        assert "DatabaseScheduler" in procs["beat"].log()

        # flower: answers its health check; the UI wants the credentials.
        flower = f"http://127.0.0.1:{env['FLOWER_PORT']}"

        def flower_ready():  # type: ignore[no-untyped-def]
            try:
                return requests.get(f"{flower}/healthcheck", timeout=5).text == "OK"
            except (requests.ConnectionError, requests.Timeout):
                return False

        _ready(procs["flower"], flower_ready, "flower /healthcheck")
        assert requests.get(f"{flower}/", timeout=5).status_code == 401
        assert requests.get(f"{flower}/", auth=("ops", "flower-password"), timeout=5).status_code == 200
        # Its /metrics is Flower's own: TMS's series (the Celery app loads them) are not there.
        scraped = requests.get(f"{flower}/metrics", auth=("ops", "flower-password"), timeout=5)
        assert scraped.status_code == 200 and "flower_" in scraped.text
        assert not re.findall(r"^tms_\w+", scraped.text, flags=re.MULTILINE)

        # The operator's check agrees, run through the entrypoint as `docker compose run` would.
        check = wait_for(
            lambda: (result := _run(env, "python", "manage.py", "tms_check", "--no-color")).returncode == 0 and result,
            timeout=60,
            interval=1,
            what="tms_check to pass",
        )
        assert check.stdout.count("OK  ") == 8, check.stdout
    finally:
        codes = {}
        for role, proc in procs.items():
            proc.stop(timeout=30)
            codes[role] = proc.popen.returncode
    # SIGTERM stops every role cleanly; the worker marks its row STOPPED on the way out.
    assert codes == {"web": 0, "worker": 0, "beat": 0, "monitor": 0, "flower": 0}, codes
    assert _query(env, "SELECT status FROM executions_worker") == [("STOPPED",)]


def test_flower_refuses_to_start_without_credentials(role_env):
    result = _run({k: v for k, v in role_env.items() if k != "FLOWER_BASIC_AUTH"}, "flower")
    assert result.returncode == 64
    assert "flower needs FLOWER_BASIC_AUTH" in result.stderr


def test_other_commands_run_as_given(role_env):
    result = _run(role_env, "python", "-c", "import os; print(os.getcwd())")
    assert (result.returncode, result.stdout.strip()) == (0, str(ROOT))
