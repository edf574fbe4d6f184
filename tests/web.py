"""A real web process (gunicorn, DEBUG off) for end-to-end tests of the API."""

from __future__ import annotations

import socket
import sys

from tests.processes import LOG_DIR, ManagedProcess, process_env, wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_web(name: str = "web", *, workers: int = 2, **env: str) -> tuple[ManagedProcess, str]:
    """Start gunicorn on a free port; return the process and its base URL once it listens.

    ``env`` overrides the process's environment (e.g. a ``DATABASE_URL`` through a proxy)."""
    port = free_port()
    argv = [sys.executable, "-m", "gunicorn", "tms_project.wsgi", "-b", f"127.0.0.1:{port}", "-w", str(workers)]
    web = ManagedProcess(name, argv, process_env(DJANGO_DEBUG="false", **env), LOG_DIR)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: f"Listening at: {base}" in web.log(), timeout=30, what="gunicorn to listen")
    except AssertionError:
        web.stop()
        raise
    return web, base
