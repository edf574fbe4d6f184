"""TMS behind PgBouncer in transaction pooling mode (issue 45 item 3; docs/deployment.md
"Behind PgBouncer"): a private PgBouncer (tests/pgbouncer/conftest.py) in front of the test
database, the web's API calls, real worker and monitor processes through it, the monitor's
``LISTEN`` on a direct connection of its own (``TMS_LISTEN_DATABASE_URL``).

Under transaction pooling a client gets a server connection for one transaction at a time, and
the next transaction may run on another: whatever a session keeps between transactions (a
session advisory lock, a ``LISTEN``, a ``WITH HOLD`` cursor, a plain ``SET``) is left on a server
connection another client gets next, or missing where the client looks for it.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import psycopg2
import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from executions import retention
from executions.models import TERMINAL_STATUSES, Execution
from executions.models import ExecutionStatus as S
from executions.notify import CHANNEL, DueListener
from executions.retention import retention_prune
from tasks_app.models import Task
from tests.factories import ExecutionFactory, TaskFactory
from tests.pgbouncer.conftest import direct_database_url, django_through, pooled_database_url
from tests.processes import (
    LOG_DIR,
    TEST_SETTINGS,
    run_command,
    running,
    start_monitor,
    start_worker,
    wait_for,
    wait_worker_ready,
)
from tooling.harness import processes
from tooling.harness.bench import _bring_forward
from tooling.harness.herd import herd_account
from tooling.harness.ledger import LedgerServer
from tooling.harness.pgbouncer import PgBouncer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _pooler_settings(settings, **extra) -> None:
    settings.TMS = {
        **settings.TMS,
        "DATABASE_POOLER": "transaction",
        "LISTEN_DATABASE_URL": direct_database_url(),
        **extra,
    }


def _advisory_lock_held(key: int) -> bool:
    """Whether any session of the test database holds the advisory lock ``key`` (asked directly)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()"
            " AND l.classid::bigint = %s AND l.objid::bigint = %s AND l.objsubid = 1",
            [key >> 32, key & 0xFFFFFFFF],
        )
        return cursor.fetchone()[0] > 0


def test_a_prune_through_pgbouncer_leaves_no_pruning_lock_behind(bouncer: PgBouncer, settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "tms_archive": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "archive")},
        },
    }
    task = TaskFactory(keep_last=1)
    now = timezone.now()
    for hours in range(1, 5):
        ended = now - timedelta(hours=hours)
        ExecutionFactory(task=task, status=S.SUCCEEDED, scheduled_for=ended, started_at=ended, finished_at=ended)

    held_between_batches: list[bool] = []
    others: list[psycopg2.extensions.connection] = []

    def between_batches(report: retention.PruneReport) -> None:
        held_between_batches.append(_direct_lock_taken())
        if not others:
            # Another client of the pool opens a transaction: it gets the server connection the
            # prune used last (PgBouncer reuses the latest), so the prune's next ones run elsewhere.
            other = psycopg2.connect(pooled_database_url(bouncer))
            with other.cursor() as cursor:
                cursor.execute("SELECT 1")
            others.append(other)

    with django_through(bouncer):
        report = retention_prune(batch=1, now=now, progress=between_batches)
    for other in others:
        other.rollback()
        other.close()

    assert report.executions == 3 and not report.busy
    assert held_between_batches and all(held_between_batches)  # no second prune while one runs
    # The lock went with the prune: none is left on a server connection of the pool, and a prune
    # through another one is not told that another run holds it.
    assert not _advisory_lock_held(retention.ADVISORY_KEY)
    with django_through(bouncer):
        assert not retention_prune(now=now).busy


def _direct_lock_taken() -> bool:
    """Whether the pruning lock is taken: a direct session's try fails."""
    direct = psycopg2.connect(direct_database_url())
    try:
        direct.autocommit = True
        with direct.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [retention.ADVISORY_KEY])
            got = cursor.fetchone()[0]
            if got:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [retention.ADVISORY_KEY])
        return not got
    finally:
        direct.close()


def _notify_through(bouncer: PgBouncer) -> None:
    sender = psycopg2.connect(pooled_database_url(bouncer))
    try:
        sender.autocommit = True
        with sender.cursor() as cursor:
            cursor.execute(f"NOTIFY {CHANNEL}")
    finally:
        sender.close()


def test_the_monitors_listen_runs_on_its_direct_connection_and_hears_notifies_sent_through_pgbouncer(
    bouncer: PgBouncer, settings
):
    _pooler_settings(settings)
    with django_through(bouncer):
        listener = DueListener()
        try:
            assert listener.wait(0.01) is False  # connects and LISTENs
            pid = listener._conn.get_backend_pid()
            assert pid not in bouncer.server_pids()  # not one of the pool's connections
            _notify_through(bouncer)
            assert listener.wait(10) is True
        finally:
            listener.close()

    # Why: a LISTEN sent through the pool lands on whichever server connection ran it, and the
    # client, back in the pool, hears nothing.
    pooled = psycopg2.connect(pooled_database_url(bouncer))
    try:
        pooled.autocommit = True
        with pooled.cursor() as cursor:
            cursor.execute(f"LISTEN {CHANNEL}")
        _notify_through(bouncer)
        with pooled.cursor() as cursor:
            cursor.execute("SELECT 1")
        pooled.poll()
        assert pooled.notifies == []
    finally:
        pooled.close()


def test_settings_refuse_transaction_pooling_without_a_direct_listen_url_and_turn_off_server_side_cursors():
    probe = (
        "from django.conf import settings; "
        "print(settings.DATABASES['default'].get('DISABLE_SERVER_SIDE_CURSORS', False), "
        "settings.TMS['DATABASE_POOLER'], settings.TMS['LISTEN_DATABASE_URL'])"
    )
    missing = run_command("shell", "-c", probe, TMS_DATABASE_POOLER="transaction", TMS_LISTEN_DATABASE_URL="")
    assert missing.returncode != 0
    assert "TMS_DATABASE_POOLER=transaction needs TMS_LISTEN_DATABASE_URL" in missing.stderr

    unknown = run_command("shell", "-c", probe, TMS_DATABASE_POOLER="session")
    assert unknown.returncode != 0
    assert "TMS_DATABASE_POOLER must be none or transaction" in unknown.stderr

    direct = "postgres://postgres@127.0.0.1:5432/tms"
    ok = run_command("shell", "-c", probe, TMS_DATABASE_POOLER="transaction", TMS_LISTEN_DATABASE_URL=direct)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[-1].split() == ["True", "transaction", direct]

    plain = run_command("shell", "-c", probe)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[-1].split() == ["False", "none"]


ONE_SHOTS = 100
HERD = 200
#: Interval tasks, a run a second each for INTERVAL_WINDOW seconds (beat's materialiser keeps
#: their next runs coming, through the pool too).
INTERVAL_TASKS = 10
INTERVAL_WINDOW = 12


def test_api_beat_workers_and_monitor_through_pgbouncer_run_every_run_once(
    bouncer: PgBouncer, settings, api_client, user, other_user, django_user_model
):
    herd_client = APIClient()  # the herd's owner: herd_account counts every task of its owner
    herd_client.force_authenticate(other_user)
    interval_owner = django_user_model.objects.create_user(username="carol", password="carol-password")
    interval_client = APIClient()
    interval_client.force_authenticate(interval_owner)
    ledger = LedgerServer().start()
    env = {
        "DATABASE_URL": pooled_database_url(bouncer),
        "TMS_DATABASE_POOLER": "transaction",
        "TMS_LISTEN_DATABASE_URL": direct_database_url(),
    }
    _pooler_settings(settings)
    body = {"runner": "http", "config": {"url": ledger.url, "method": "POST", "json": {}}}
    try:
        worker = start_worker(concurrency=4, **env)
        monitor = start_monitor(**env)
        beat = processes.start_beat("beat", log_dir=LOG_DIR, **TEST_SETTINGS, **env)
        with running(worker, monitor, beat), django_through(bouncer):
            wait_worker_ready(worker)
            end = timezone.now() + timedelta(seconds=INTERVAL_WINDOW)
            for _ in range(INTERVAL_TASKS):
                response = interval_client.post(
                    "/api/v1/tasks", {**body, "interval": 1, "end_at": end.isoformat()}, format="json"
                )
                assert response.status_code == 201, response.content
            # The web's writes: one-shot tasks due now, and the herd's, due later (inside the
            # materialiser's horizon, so their runs are created with them) and brought forward
            # together.
            for _ in range(ONE_SHOTS):
                response = api_client.post("/api/v1/tasks", body, format="json")
                assert response.status_code == 201, response.content
            later = (timezone.now() + timedelta(seconds=50)).isoformat()
            herd = []
            for _ in range(HERD):
                response = herd_client.post("/api/v1/tasks", {**body, "start_at": later}, format="json")
                assert response.status_code == 201, response.content
                herd.append(response.json()["id"])
            due = _bring_forward(herd, seconds=2)

            owners = [user, other_user]

            def finished() -> int:
                return Execution.objects.filter(task__owner__in=owners, status__in=TERMINAL_STATUSES).count()

            def interval_runs_done() -> bool:
                runs = Execution.objects.filter(task__owner=interval_owner)
                return timezone.now() > end and not runs.exclude(status__in=TERMINAL_STATUSES).exists()

            wait_for(lambda: finished() == ONE_SHOTS + HERD, timeout=90, interval=0.5, what="every run to end")
            wait_for(interval_runs_done, timeout=60, interval=0.5, what="the interval runs to end")

            # The monitor's LISTEN ran on its direct connection, not through the pool.
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
                    [f"LISTEN {CHANNEL}"],
                )
                listening = {row[0] for row in cursor.fetchall()}
            assert listening and not listening & bouncer.server_pids()
            assert worker.alive and monitor.alive and beat.alive
    finally:
        ledger.stop()

    runs = list(Execution.objects.filter(task__owner__in=owners).values_list("pk", "status", "attempt"))
    assert len(runs) == ONE_SHOTS + HERD == Task.objects.filter(owner__in=owners).count()
    assert {status for _, status, _ in runs} == {S.SUCCEEDED}
    # Every run launched once, under its own key, and never asked again.
    assert all(ledger.ledger.launches[f"tms-{pk}-{attempt}"] == 1 for pk, _, attempt in runs)
    assert {attempt for _, _, attempt in runs} == {1}
    assert ledger.ledger.repeated_starts() == 0
    # The interval tasks: a run a second each, every one SUCCEEDED once, none cancelled as late.
    interval_runs = list(
        Execution.objects.filter(task__owner=interval_owner).values_list("pk", "task_id", "scheduled_for", "status")
    )
    assert {status for *_, status in interval_runs} == {S.SUCCEEDED}
    assert len({(task, at) for _, task, at, _ in interval_runs}) == len(interval_runs)
    per_task = Counter(task for _, task, _, _ in interval_runs)
    assert len(per_task) == INTERVAL_TASKS and min(per_task.values()) >= INTERVAL_WINDOW - 4
    assert all(ledger.ledger.launches[f"tms-{pk}-1"] == 1 for pk, *_ in interval_runs)
    assert len(ledger.ledger.launches) == len(runs) + len(interval_runs)
    account = herd_account(owner_id=other_user.pk, due=due)
    assert (account.expected, account.started, account.lost, account.duplicated) == (HERD, HERD, 0, 0)
    assert "Traceback" not in worker.log() + monitor.log() + beat.log()
