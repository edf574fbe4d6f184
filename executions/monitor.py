"""The monitor: publishes due executions to RabbitMQ.

Each pass takes due rows with ``FOR UPDATE SKIP LOCKED`` in batches, marks them PENDING and
publishes one message per row in the same transaction (publisher confirms on), then commits.
Several monitors share the work and never publish one row twice; if the broker is down the
transaction rolls back, the rows stay SCHEDULED and the monitor retries with backoff. Between
passes it sleeps until the next due time, a Postgres ``NOTIFY``, or ``MONITOR_MAX_SLEEP``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import DatabaseError, close_old_connections, connection, transaction
from kombu.exceptions import KombuError
from kombu.exceptions import OperationalError as KombuOperationalError

from executions import transitions
from executions.conf import TmsSettings, tms_settings
from executions.notify import DueListener

logger = logging.getLogger(__name__)

_BROKER_ERRORS = (KombuError, KombuOperationalError, ConnectionError, OSError, TimeoutError)


@dataclass
class MonitorStats:
    passes: int = 0
    published: int = 0
    republished: int = 0
    polls: int = 0
    errors: int = 0
    due_query_seconds: list[float] = field(default_factory=list)


class Monitor:
    """One monitor process. ``run()`` loops until ``stop()`` (or SIGTERM/SIGINT)."""

    def __init__(self, *, conf: TmsSettings | None = None, batch: int | None = None) -> None:
        self.conf = conf or tms_settings()
        self.batch = batch or self.conf.MONITOR_BATCH
        self.actor = f"monitor:{socket.gethostname()}:{os.getpid()}"
        self.listener = DueListener()
        self.stats = MonitorStats()
        self._running = False
        from executions.tasks import poll_execution, run_execution

        self._run_task = run_execution
        self._poll_task = poll_execution

    # -- one pass ---------------------------------------------------------------------------

    def _publish_batch(self, take: Callable[[], list[transitions.Dispatch]], task) -> int:  # type: ignore[no-untyped-def]
        with transaction.atomic():
            started = time.perf_counter()
            taken = take()
            self.stats.due_query_seconds.append(time.perf_counter() - started)
            if not taken:
                return 0
            with task.app.producer_or_acquire() as producer:
                for item in taken:
                    task.apply_async(
                        args=(item.execution_id, item.attempt),
                        task_id=item.message_id,
                        priority=item.priority,
                        producer=producer,
                        retry=False,
                    )
        return len(taken)

    def dispatch_once(self) -> int:
        """Publish everything due now (in batches); returns the number of messages sent."""
        sent = 0
        while True:
            n = self._publish_batch(
                lambda: transitions.executions_take_due(limit=self.batch, actor=self.actor), self._run_task
            )
            sent += n
            self.stats.published += n
            if n < self.batch:
                break
        n = self._publish_batch(
            lambda: transitions.executions_take_stale_pending(
                limit=self.batch, older_than=self.conf.PENDING_REPUBLISH_AFTER, actor=self.actor
            ),
            self._run_task,
        )
        self.stats.republished += n
        sent += n
        n = self._publish_batch(
            lambda: transitions.executions_take_polls(
                limit=self.batch, in_flight_for=self.conf.PENDING_REPUBLISH_AFTER, actor=self.actor
            ),
            self._poll_task,
        )
        self.stats.polls += n
        return sent + n

    # -- the loop ---------------------------------------------------------------------------

    def run(self, *, max_passes: int | None = None) -> None:
        self._running = True
        failures = 0
        logger.info("%s started (batch %d)", self.actor, self.batch)
        while self._running and (max_passes is None or self.stats.passes < max_passes):
            self.stats.passes += 1
            try:
                close_old_connections()
                sent = self.dispatch_once()
                failures = 0
            except (DatabaseError, *_BROKER_ERRORS) as exc:
                failures += 1
                self.stats.errors += 1
                delay = min(30.0, 0.5 * 2 ** min(failures, 6))
                logger.warning("monitor pass failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
                connection.close()
                self._sleep(delay)
                continue
            if sent:
                continue
            try:
                nxt = transitions.next_due_in()
            except DatabaseError:
                nxt = None
            wait = self.conf.MONITOR_MAX_SLEEP if nxt is None else min(nxt, self.conf.MONITOR_MAX_SLEEP)
            self.listener.wait(wait)
        self.listener.close()
        logger.info("%s stopped after %d passes, %d published", self.actor, self.stats.passes, self.stats.published)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self._running and time.monotonic() < deadline:
            time.sleep(min(0.2, deadline - time.monotonic()))

    def stop(self, *args: object) -> None:
        self._running = False

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
