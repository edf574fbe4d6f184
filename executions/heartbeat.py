"""Worker registration, heartbeat and the liveness sweep.

A worker node (the Celery main process) registers a :class:`~executions.models.Worker` row and
heartbeats it every ``HEARTBEAT_INTERVAL`` seconds from a bootstep thread. The heartbeat also
ends at once the leases held by pool processes that died (SIGKILL, OOM), so their executions
are handed to another worker without waiting for the lease to run out. A node that cannot
heartbeat for ``WORKER_TIMEOUT`` seconds stops consuming and exits: by then its leases have
expired and other workers own its work. Leases themselves are extended by the process doing
the work (see :func:`executions.worker_services.keep_lease`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from celery import bootsteps
from django.db import DatabaseError, close_old_connections, connection
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from executions import transitions
from executions.models import Execution, ExecutionStatus, Worker, WorkerStatus
from executions.worker_identity import lease_owner_pid, node_id
from tms_core.conf import tms_settings

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


def worker_heartbeat(*, worker_id: str) -> int:
    """Refresh the worker row; end the leases of this node's dead pool processes.

    A row the liveness sweep marked DEAD while this worker was alive but could not heartbeat
    (paused, or its heartbeat blocked on a lock) comes back ALIVE, and so does a row that was
    removed meanwhile, each with a warning saying so. Its leases were handed back when it was
    marked DEAD; its pool processes' writes on those executions are fenced and fail.

    Returns how many leases were ended.
    """
    # One statement in the common case; only a row that is not ALIVE any more is looked at.
    if not Worker.objects.filter(id=worker_id, status=WorkerStatus.ALIVE).update(last_heartbeat=Now()):
        was = Worker.objects.filter(id=worker_id).values_list("status", flat=True).first()
        worker_register(worker_id=worker_id)
        if was is None:
            logger.warning("worker %s had no row any more; its heartbeat registered it again: ALIVE", worker_id)
        else:
            logger.warning(
                "worker %s was marked %s (its heartbeat was silent); its heartbeat resumed: ALIVE again "
                "(the executions it held were handed back to other workers)",
                worker_id,
                was,
            )
    owners = (
        Execution.objects.filter(status=ExecutionStatus.RUNNING, lease_owner__startswith=f"{worker_id}:")
        .values_list("lease_owner", flat=True)
        .distinct()
    )
    dead = [owner for owner in owners if (pid := lease_owner_pid(owner)) is not None and not _alive(pid)]
    if dead:
        logger.warning("pool processes %s died holding leases; handing their executions back", dead)
    return transitions.executions_expire_leases(owners=dead)


def worker_stopped(*, worker_id: str) -> None:
    Worker.objects.filter(id=worker_id).update(status=WorkerStatus.STOPPED, last_heartbeat=Now())


def workers_mark_dead(*, timeout: float) -> list[str]:
    """Liveness sweep: mark workers silent for ``timeout`` seconds DEAD and end their leases.

    Dead workers stay visible. Their executions are resumed by other workers once the monitor
    hands them back (same attempt, same external run).
    """
    cutoff = ExpressionWrapper(Now() - Value(timedelta(seconds=timeout)), output_field=DateTimeField())
    silent = list(
        Worker.objects.filter(status=WorkerStatus.ALIVE, last_heartbeat__lt=cutoff).values_list("id", flat=True)
    )
    if not silent:
        return []
    Worker.objects.filter(id__in=silent, status=WorkerStatus.ALIVE, last_heartbeat__lt=cutoff).update(
        status=WorkerStatus.DEAD
    )
    for worker_id in silent:
        owners = (
            Execution.objects.filter(status=ExecutionStatus.RUNNING, lease_owner__startswith=f"{worker_id}:")
            .values_list("lease_owner", flat=True)
            .distinct()
        )
        transitions.executions_expire_leases(owners=list(owners))
    logger.warning("workers marked dead: %s", ", ".join(silent))
    return silent


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
        last_ok = time.monotonic()
        while not self._stop.wait(conf.HEARTBEAT_INTERVAL):
            try:
                close_old_connections()
                worker_heartbeat(worker_id=self.worker_id)
                last_ok = time.monotonic()
            except Exception as exc:
                # Any error, not only the database's: a heartbeat thread that dies leaves a live,
                # consuming worker DEAD for good.
                connection.close()
                silent = time.monotonic() - last_ok
                if isinstance(exc, DatabaseError):
                    logger.warning("heartbeat of %s failed for %.0fs: %s", self.worker_id, silent, exc)
                else:
                    logger.exception("heartbeat of %s failed for %.0fs", self.worker_id, silent)
                if silent > conf.WORKER_TIMEOUT:
                    # Other workers own our executions by now: stop consuming and exit; the
                    # supervisor (systemd, Kubernetes, make run) starts a fresh worker.
                    logger.critical("worker %s could not heartbeat for %.0fs; shutting down", self.worker_id, silent)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
        connection.close()

    def stop(self, parent: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            worker_stopped(worker_id=self.worker_id)
        except DatabaseError:
            logger.exception("could not mark worker %s stopped", self.worker_id)
        finally:
            connection.close()
