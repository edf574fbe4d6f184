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

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from celery import bootsteps
from celery.signals import worker_shutdown, worker_shutting_down
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


def worker_register(*, worker_id: str, node_name: str = "") -> None:
    """Create or revive this worker's row; ``node_name`` is Celery's name for it (``-n``)."""
    Worker.objects.update_or_create(
        id=worker_id,
        defaults={
            "node_name": node_name,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "status": WorkerStatus.ALIVE,
            "last_heartbeat": Now(),
        },
    )


def worker_heartbeat(*, worker_id: str, node_name: str = "") -> int:
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
        worker_register(worker_id=worker_id, node_name=node_name)
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


def _held_by_pool(worker_id: str) -> list[str]:
    """Lease owners (``node:pid``) among this node's pool processes holding a RUNNING execution."""
    return list(
        Execution.objects.filter(status=ExecutionStatus.RUNNING, lease_owner__startswith=f"{worker_id}:")
        .values_list("lease_owner", flat=True)
        .distinct()
    )


def worker_hand_back(*, worker_id: str, grace: float, stopped: threading.Event, poll: float = 0.1) -> int:
    """Graceful shutdown of a worker node: let runs end for ``grace`` seconds, then, until the
    pool has stopped (``stopped``), stop every pool process holding a lease and hand its
    executions back at once.

    Runs shorter than the grace end normally (their outcome recorded). A longer one is given to
    another worker without waiting for its lease to run out: its pool process is killed first
    (so it can no longer write, or start anything after the hand-back), then its lease ends, as
    for a pool process that died (:func:`transitions.executions_expire_leases`); the monitor's next
    pass publishes a resume, and the next worker resumes the same attempt with the same
    idempotency key (the runner adopts the run it already launched). The message the killed
    process held goes back to the queue (``task_reject_on_worker_lost``) and finds the execution
    taken.

    The leases are looked at until the pool has stopped, not only when the shutdown begins: a
    pool process may claim a run after it (a message it had been handed as the shutdown began, or
    the next runs of a message of several), and that run must be bounded by the grace too. A look
    at the start alone found nothing held, returned, and let such a run keep its lease on the
    stopping worker for as long as it lasted (the stop with it). Returns how many executions were
    handed back.
    """
    if stopped.wait(grace):
        return 0  # the pool stopped within the grace: every run ended on this worker
    handed = 0
    done: set[str] = set()  # owners stopped already (their rows keep the owner until handed back)
    while True:
        handed += _stop_holders(worker_id, grace, done)
        if stopped.wait(poll):
            return handed


def _stop_holders(worker_id: str, grace: float, done: set[str]) -> int:
    """Kill the pool processes of this node holding a lease now (but those in ``done``), end their
    leases, and add them to ``done``."""
    owners = [owner for owner in _held_by_pool(worker_id) if owner not in done]
    # Only prefork pool processes can be stopped apart from the node (threads and solo pools run
    # in the node itself, which then exits after its work, as Celery's warm shutdown does).
    pids = {pid for owner in owners if (pid := lease_owner_pid(owner)) is not None and pid != os.getpid()}
    if not pids:
        return 0
    logger.warning(
        "worker %s shutting down: %d run(s) still going after %.1fs; stopping pool processes %s and handing back",
        worker_id,
        len(owners),
        grace,
        sorted(pids),
    )
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stop_by = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < stop_by:
        time.sleep(0.02)
    stopped = [owner for owner in owners if lease_owner_pid(owner) in pids]
    done.update(stopped)
    return transitions.executions_expire_leases(owners=stopped)


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
        self._shutting_down = threading.Event()
        #: Set once Celery has stopped the worker, its pool included: no run can start any more.
        self._pool_stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._hand_back: threading.Thread | None = None

    def start(self, parent: Any) -> None:
        self.worker_id = node_id()
        conf = tms_settings()
        # parent.hostname is the node name with -n's %h/%n/%d expanded (celery@vm by default).
        self.node_name = parent.hostname
        worker_register(worker_id=self.worker_id, node_name=self.node_name)
        connection.close()
        self._thread = threading.Thread(target=self._loop, args=(conf,), name="tms-heartbeat", daemon=True)
        self._thread.start()
        # SIGTERM (a warm shutdown): Celery stops consuming and waits for the running tasks; this
        # thread bounds that wait for long runs by handing them back (worker_hand_back).
        worker_shutting_down.connect(self._on_shutting_down, weak=False)
        worker_shutdown.connect(self._on_pool_stopped, weak=False)
        # A daemon, which _on_pool_stopped waits for: a cold shutdown (no worker_shutdown signal)
        # must not be kept alive by it.
        self._hand_back = threading.Thread(
            target=self._hand_back_on_shutdown, args=(conf,), name="tms-shutdown", daemon=True
        )
        self._hand_back.start()
        logger.info("worker %s registered; heartbeat every %ss", self.worker_id, conf.HEARTBEAT_INTERVAL)

    def _on_shutting_down(self, **kwargs: Any) -> None:
        # Runs inside the signal handler: only wake the thread.
        self._shutting_down.set()

    def _on_pool_stopped(self, **kwargs: Any) -> None:
        # Celery has stopped the worker (sent once its pool has stopped): the hand-back ends; the
        # process waits for a hand-back being written before it exits.
        self._shutting_down.set()
        self._pool_stopped.set()
        if self._hand_back is not None:
            self._hand_back.join(timeout=8)

    def _hand_back_on_shutdown(self, conf: Any) -> None:
        self._shutting_down.wait()
        try:
            handed = worker_hand_back(worker_id=self.worker_id, grace=conf.SHUTDOWN_GRACE, stopped=self._pool_stopped)
            if handed:
                logger.warning("worker %s handed back %d execution(s) on shutdown", self.worker_id, handed)
        except DatabaseError:
            logger.exception("worker %s could not hand its executions back; their leases will expire", self.worker_id)
        finally:
            connection.close()

    def _loop(self, conf: Any) -> None:
        last_ok = time.monotonic()
        while not self._stop.wait(conf.HEARTBEAT_INTERVAL):
            try:
                close_old_connections()
                worker_heartbeat(worker_id=self.worker_id, node_name=self.node_name)
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
        # Also a shutdown without SIGTERM (a remote "shutdown" control command) hands back.
        self._shutting_down.set()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            worker_stopped(worker_id=self.worker_id)
        except DatabaseError:
            logger.exception("could not mark worker %s stopped", self.worker_id)
        finally:
            connection.close()
