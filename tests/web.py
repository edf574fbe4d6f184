"""A real web process (gunicorn, DEBUG off) for end-to-end tests of the API."""

from __future__ import annotations

import socket
import sys

import requests

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


def start_web_role(name: str = "web", *, workers: int = 1, wait: bool = True, **env: str) -> tuple[ManagedProcess, str]:
    """Start the production web role, as ``docker/entrypoint.sh web`` does (gunicorn with
    ``docker/gunicorn.conf.py``: its graceful timeout, worker recycling and logging), with the test
    settings, on a free port of 127.0.0.1. Returns the process and its base URL once ``/readyz``
    answers 200: the point at which a load balancer's health check would send it traffic.

    ``workers`` is gunicorn's ``WEB_CONCURRENCY``; ``env`` overrides the process's environment;
    ``wait=False`` returns at once (then :func:`wait_web_ready`)."""
    port = free_port()
    argv = [sys.executable, "-m", "gunicorn", "--config", "docker/gunicorn.conf.py", "tms_project.wsgi"]
    role_env = {
        "DJANGO_DEBUG": "false",
        "TMS_WEB_HOST": "127.0.0.1",
        "PORT": str(port),
        "WEB_CONCURRENCY": str(workers),
        "TMS_LOG_FORMAT": "plain",
    }
    web = ManagedProcess(name, argv, process_env(**role_env, **env), LOG_DIR)
    base = f"http://127.0.0.1:{port}"
    if wait:
        wait_web_ready(web, base)
    return web, base


def wait_web_ready(web: ManagedProcess, base: str, timeout: float = 60) -> None:
    """Wait until the web at ``base`` answers ``/readyz`` 200; stop it and fail if it does not."""

    def ready() -> bool:
        assert web.alive, f"{web.name} exited ({web.popen.returncode}):\n{web.log()[-3000:]}"
        try:
            return requests.get(f"{base}/readyz", timeout=5).status_code == 200
        except requests.RequestException:  # not listening yet, or its worker still booting
            return False

    try:
        wait_for(ready, timeout=timeout, interval=0.1, what=f"{web.name} /readyz 200")
    except AssertionError:
        web.stop()
        raise
