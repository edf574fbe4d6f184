"""Worker registration and heartbeat, as a Celery worker bootstep.

The main process registers a :class:`~executions.models.Worker` row and, every
``HEARTBEAT_INTERVAL`` seconds, refreshes it and extends the leases of the executions held by
its live pool processes. A pool process that died (SIGKILL, OOM) stops being extended, so its
executions' leases expire and the monitor hands them to another worker.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from celery import bootsteps
from django.db import close_old_connections, connection
from django.db.models.functions import Now

from executions import transitions
from executions.conf import tms_settings
from executions.models import Execution, ExecutionStatus, Worker, WorkerStatus
from executions.worker_identity import lease_owner_pid, node_id

logger = logging.getLogger(__name__)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - not ours, but it exists
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def worker_register(*, worker_id: str) -> None:
    """Create or revive this worker's row."""
    Worker.objects.update_or_create(
        id=worker_id,
        defaults={
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "status": WorkerStatus.ALIVE,
            "last_heartbeat": Now(),
        },
    )


def worker_heartbeat(*, worker_id: str, lease_seconds: float) -> int:
    """Refresh the worker row and the leases of its live processes; returns leases extended."""
    Worker.objects.filter(id=worker_id).update(last_heartbeat=Now(), status=WorkerStatus.ALIVE)
    owners = (
        Execution.objects.filter(status=ExecutionStatus.RUNNING, lease_owner__startswith=f"{worker_id}:")
        .values_list("lease_owner", flat=True)
        .distinct()
    )
    live = [owner for owner in owners if (pid := lease_owner_pid(owner)) is not None and _alive(pid)]
    return transitions.execution_extend_leases(owners=live, lease_seconds=lease_seconds)


def worker_stopped(*, worker_id: str) -> None:
    Worker.objects.filter(id=worker_id).update(status=WorkerStatus.STOPPED, last_heartbeat=Now())


class HeartbeatStep(bootsteps.StartStopStep):
    """Runs the heartbeat in a thread of the worker's main process."""

    requires = ("celery.worker.components:Pool",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, parent: Any) -> None:
        self.worker_id = node_id()
        conf = tms_settings()
        worker_register(worker_id=self.worker_id)
        connection.close()
        self._thread = threading.Thread(target=self._loop, args=(conf,), name="tms-heartbeat", daemon=True)
        self._thread.start()
        logger.info("worker %s registered; heartbeat every %ss", self.worker_id, conf.HEARTBEAT_INTERVAL)

    def _loop(self, conf: Any) -> None:
        while not self._stop.wait(conf.HEARTBEAT_INTERVAL):
            try:
                close_old_connections()
                worker_heartbeat(worker_id=self.worker_id, lease_seconds=conf.WORKER_TIMEOUT)
            except Exception:
                logger.exception("heartbeat of %s failed", self.worker_id)
                connection.close()
        connection.close()

    def stop(self, parent: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            worker_stopped(worker_id=self.worker_id)
        except Exception:
            logger.exception("could not mark worker %s stopped", self.worker_id)
