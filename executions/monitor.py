"""The monitor: publishes due executions to RabbitMQ.

Each pass takes due rows with ``FOR UPDATE SKIP LOCKED`` in batches, marks them PENDING and
commits, then publishes one message per row (publisher confirms on). Several monitors share the
work and never publish one row twice. While the broker is unreachable the monitor takes
nothing, so rows stay SCHEDULED, and retries with backoff; a batch cut off mid-publish goes
back to SCHEDULED; a monitor that dies between commit and publish leaves PENDING rows that are
published again once unclaimed for ``PENDING_REPUBLISH_AFTER`` seconds. Between
passes it sleeps until the next due time, a Postgres ``NOTIFY``, or ``MONITOR_MAX_SLEEP``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import DatabaseError, close_old_connections, connection
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
    #: Durations of the latest takes (the due query with its update), for ``tms_bench``.
    due_query_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))

    def summary(self) -> dict[str, float | int]:
        takes = sorted(self.due_query_seconds)

        def quantile(q: float) -> float:
            return round(takes[min(len(takes) - 1, int(q * len(takes)))] * 1000, 3) if takes else 0.0

        return {
            "passes": self.passes,
            "published": self.published,
            "republished": self.republished,
            "polls": self.polls,
            "errors": self.errors,
            "take_p50_ms": quantile(0.50),
            "take_p99_ms": quantile(0.99),
            "take_max_ms": quantile(1.0),
        }


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
        """Take a batch (committed), then publish it with confirms; undo what was not published."""
        with task.app.producer_or_acquire() as producer:
            # Do not take work while the broker is unreachable: it would only have to be undone.
            producer.connection.ensure_connection(max_retries=1)
            started = time.perf_counter()
            taken = take()
            self.stats.due_query_seconds.append(time.perf_counter() - started)
            sent = 0
            try:
                for item in taken:
                    task.apply_async(
                        args=(item.execution_id, item.attempt),
                        task_id=item.message_id,
                        priority=item.priority,
                        producer=producer,
                        retry=False,
                    )
                    sent += 1
            except _BROKER_ERRORS:
                transitions.executions_untake(
                    dispatches=taken[sent:], actor=self.actor, reason="broker unavailable: not published"
                )
                raise
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
        logger.info("%s stopped; monitor stats %s", self.actor, json.dumps(self.stats.summary()))

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self._running and time.monotonic() < deadline:
            time.sleep(min(0.2, deadline - time.monotonic()))

    def stop(self, *args: object) -> None:
        self._running = False

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
