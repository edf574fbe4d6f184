"""On the embedded SQLite default, TMS's triggers survive migrations that rebuild their tables."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {
    "tms_status_changed",
    "tms_notify_skipped",
    "tms_task_deleted_without_executions",
    "tms_execution_task_version",
}


def _migrate(tmp_path: Path, *target: str) -> set[str]:
    database = tmp_path / "tms.sqlite3"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tms_project.settings.base",
        "DATABASE_URL": f"sqlite:///{database}",
        "CELERY_BROKER_URL": f"filesystem://{tmp_path}",
        "TMS_VAR_DIR": str(tmp_path),
    }
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0", *target],
        env=env,
        cwd=ROOT,
        check=True,
        timeout=300,
        capture_output=True,
    )
    with sqlite3.connect(database) as db:
        return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}


def test_triggers_are_installed_after_migrate_and_after_a_rebuild_of_their_tables(tmp_path: Path):
    # A fresh database: every migration, several of which rebuild the task and execution tables.
    assert _migrate(tmp_path) >= EXPECTED
    # The row-level triggers it replaced are gone.
    assert not _migrate(tmp_path) & {"tms_rollup_attempt_ended", "tms_notify_execution"}
    # Back before a migration that rebuilds the execution table (the table the triggers are on),
    # and forward again: the triggers are back each time. (Before notifications 0007 the status
    # trigger is not installed: on SQLite that history runs without rollup and outbox.)
    assert "tms_status_changed" not in _migrate(tmp_path, "executions", "0009")
    assert _migrate(tmp_path) >= EXPECTED
    assert _migrate(tmp_path, "executions", "0005").isdisjoint(EXPECTED - {"tms_task_deleted_without_executions"})
    assert _migrate(tmp_path) >= EXPECTED


_RUN = """
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.utils import timezone
from executions import transitions
from executions.models import RunRollup, TaskRollup
from notifications import services
from notifications.models import Outbox
from tasks_api.services import task_create

owner = get_user_model().objects.create_user("sqlite-owner")
task = task_create(owner=owner, runner="noop", name="t", start_at=timezone.now() + timedelta(days=1))
channel = services.channel_create(owner=owner, data={"name": "n", "kind": "webhook", "target": "http://127.0.0.1:9/"})
services.rule_create(owner=owner, data={"task": task, "channel": channel, "on_failure": True, "on_retry": True})
ended = []
for outcome in ("succeed", "retry"):
    (pk,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, timezone.now() - timedelta(seconds=1), 5)], actor="t"
    )
    transitions.executions_take_due(limit=10, actor="m")
    assert transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id="w", lease_seconds=60)
    if outcome == "succeed":
        assert transitions.execution_succeed(execution_id=pk, attempt=1, worker_id="w", output="", max_chars=9)
    else:
        assert transitions.execution_fail(
            execution_id=pk, attempt=1, worker_id="w", error="boom", output="", retry_in=60, max_chars=9
        )
    ended.append(pk)
rows = RunRollup.objects.all()
late = [sum(getattr(r, f"lateness_{i:02d}") for r in rows) for i in range(21)]
print(sum(r.succeeded for r in rows), sum(r.retried for r in rows), sum(late), sum(late[7:9]))
print(sorted((t.attempts, t.failures) for t in TaskRollup.objects.all()))
print([(o.kind, o.execution_id == pk, o.attempt, o.detail) for o, pk in zip(Outbox.objects.order_by("id"), ended)])
print(sorted({e.task_version for e in task.executions.all()}))
"""


def test_the_status_trigger_counts_and_notifies_on_sqlite(tmp_path: Path):
    _migrate(tmp_path)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tms_project.settings.base",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'tms.sqlite3'}",
        "CELERY_BROKER_URL": f"filesystem://{tmp_path}",
        "TMS_VAR_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", _RUN],
        env=env,
        cwd=ROOT,
        timeout=300,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # A success and a retry, each due a second or so before it started (buckets from 1 s); the
    # task's hour counts both, the retry as a failure; the rule wants the retry, and the success
    # (a recovery). Each execution records the task's version (the insert trigger's twin).
    assert done.stdout.splitlines()[-4:] == [
        "1 1 2 2",
        "[(2, 1)]",
        "[('succeeded', True, 1, ''), ('retry', True, 1, 'boom')]",
        "[1]",
    ]
