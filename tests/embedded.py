"""Running a script against the embedded default (``make run`` with nothing configured): a fresh
SQLite file and the filesystem broker, migrated, in a subprocess of its own (the suite's own
database is PostgreSQL)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_on_embedded_sqlite(tmp_path: Path, script: str, *, timeout: float = 300) -> str:
    """Migrate a fresh SQLite database under ``tmp_path``, run ``script`` in ``manage.py shell``
    against it and return its standard output (the script's exit status must be 0)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tms_project.settings.base",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'tms.sqlite3'}",
        "CELERY_BROKER_URL": f"filesystem://{tmp_path}",
        "TMS_VAR_DIR": str(tmp_path),
    }
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, cwd=ROOT, check=True, timeout=300)
    result = subprocess.run(
        [*manage, "shell", "-v", "0", "-c", script],
        env=env,
        cwd=ROOT,
        timeout=timeout,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
