"""Who is working: the worker node (``host:pid`` of the Celery main process) and, for leases,
the process that actually runs an execution (``host:pid:childpid``)."""

from __future__ import annotations

import os
import socket

_ENV = "TMS_WORKER_ID"


def set_node_id() -> str:
    """Called once in the worker's main process, before the pool forks; children inherit it."""
    node = f"{socket.gethostname()}:{os.getpid()}"
    os.environ[_ENV] = node
    return node


def node_id() -> str:
    return os.environ.get(_ENV) or f"{socket.gethostname()}:{os.getpid()}"


def lease_owner() -> str:
    """The lease owner for work done in this process: the node id plus this process's pid."""
    return f"{node_id()}:{os.getpid()}"


def lease_owner_pid(owner: str) -> int | None:
    try:
        return int(owner.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None
