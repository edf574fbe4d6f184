"""On the embedded SQLite default, TMS's triggers survive migrations that rebuild their tables."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {
    "tms_rollup_attempt_ended",
    "tms_notify_execution",
    "tms_notify_skipped",
    "tms_task_deleted_without_executions",
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
    # Back before a migration that rebuilds the execution table (the table the triggers are on),
    # and forward again: the triggers are back each time.
    assert _migrate(tmp_path, "executions", "0009") >= {"tms_rollup_attempt_ended"}
    assert _migrate(tmp_path) >= EXPECTED
    # Before the rollup existed: no rollup trigger is left behind on tables that predate it.
    assert "tms_rollup_attempt_ended" not in _migrate(tmp_path, "executions", "0005")
    assert _migrate(tmp_path) >= EXPECTED
