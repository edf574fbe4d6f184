"""The monitor: publishes due executions to RabbitMQ.

Each pass takes due rows with ``FOR UPDATE SKIP LOCKED`` in batches, marks them PENDING and
commits, then publishes one message per row, or per group of rows when a pass takes many at
once (a herd: ``DISPATCH_BATCH``; publisher confirms on). Several monitors share the
work and never publish one row twice. While the broker is unreachable the monitor takes
nothing, so rows stay SCHEDULED, and retries with backoff; a batch cut off mid-publish goes
back to SCHEDULED; a monitor that dies between commit and publish leaves PENDING rows that are
published again once unclaimed for ``PENDING_REPUBLISH_AFTER`` seconds plus the queue's estimated
drain time (:class:`Backlog`). Between
passes it sleeps until the next due time, a Postgres ``NOTIFY``, or ``MONITOR_MAX_SLEEP``.

Fair share (:mod:`executions.fairness`): when more is due than the workers start, the monitor
publishes only enough to keep about ``MONITOR_QUEUE_SECONDS`` of work queued, chosen by weighted
round-robin between teams, and tops the queue up every ``MONITOR_TOPUP_INTERVAL``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amqp.exceptions import AMQPError, ChannelError
from django.db import DatabaseError, close_old_connections, connection, transaction
from kombu import Producer
from kombu.exceptions import KombuError
from kombu.exceptions import OperationalError as KombuOperationalError

from executions import fairness, traces, transitions
from executions.messages import Publish, PublishMany, group_runs, send, send_many
from executions.notify import DueListener
from executions.publishing import Confirms, confirmed_batches
from tms_core import metrics, tracing
from tms_core.conf import TmsSettings, tms_settings
from tms_core.logcontext import log_context
from tms_core.queue_type import queue_type_mismatch

logger = logging.getLogger(__name__)

#: What a pass takes for the broker failing, not the monitor: the batch in hand goes back to
#: SCHEDULED and the loop retries. AMQP's own errors are among them: a channel error (404
#: NOT_FOUND for a queue whose home node of a cluster is down, 406 for a refused declare) and a
#: connection closed by the broker (ConnectionForced: a node stopping) are not OSErrors, and
#: ended the monitor with its batch PENDING and no message (issue 45).
_BROKER_ERRORS = (KombuError, KombuOperationalError, ConnectionError, OSError, TimeoutError, AMQPError)

#: The longest wait between passes that failed on a channel error: the broker answers, the queue
#: is what is missing (its home node is down), and a declare to see whether it is back costs one
#: round trip. Runs resume within this long of the node's return, not the 30 s backoff's.
CHANNEL_ERROR_RETRY_MAX = 2.0

#: The waits before the retries of a pass that failed on the database, then the longest one. A
#: PostgreSQL failover (Patroni promoting the standby, libpq's multi-host URL finding it) takes 2-4
#: s; the 1, 2 and 4 s backoff of the broker errors added about 3 s to the resume time after it.
#: A connection attempt to a server that is down (refused, or a standby refused by
#: ``target_session_attrs=read-write``) costs a few milliseconds, so the first retry is at once
#: and the next ones at most a second apart, however long the database is away.
DATABASE_ERROR_RETRY = (0.0, 0.1, 0.25, 0.5)
DATABASE_ERROR_RETRY_MAX = 1.0

#: A PENDING row still PENDING this many seconds (plus three broker heartbeats) after a look found
#: the execution queue without a ready message, and PENDING since before that look, has no
#: message: a message in the queue would have been counted, and one delivered to a worker would
#: have been claimed since. A live worker holds a message unclaimed only for its ETA (within the
#: lookahead) or about a second of a grouped message's wait (prefetch 1); a paused or dead one
#: until RabbitMQ closes its connection, three heartbeats at most (settings: 15 s), and the
#: message then goes back to the queue. Such rows are published again at once, not after
#: PENDING_REPUBLISH_AFTER, and the pacer never holds the queue back for them for long. They come
#: from a monitor killed between its commit and its publish, and from messages a cluster confirmed
#: into a queue whose home node was down. A false positive costs a duplicate message, which the
#: worker's conditional claim refuses.
UNCARRIED_AFTER = 5.0

#: Seconds between the monitor's ``close_old_connections`` (``CONN_MAX_AGE``, and with
#: ``CONN_HEALTH_CHECKS`` a ``SELECT 1`` on the next query). Not every pass: a pass whose statement
#: fails closes the connection (the loop's error path) and the next one reconnects, so a check
#: per pass only added a statement and a commit a second to an idle monitor.
CONNECTION_CHECK_INTERVAL = 30.0


@dataclass
class MonitorStats:
    passes: int = 0
    published: int = 0
    republished: int = 0
    polls: int = 0
    #: Messages sent: fewer than the runs published when a herd's runs share messages.
    messages: int = 0
    errors: int = 0
    #: Passes that left due runs SCHEDULED because the queue was deep enough (fair share).
    held_back: int = 0
    #: Durations of the latest due queries (the SKIP LOCKED select, and the fair-share pick
    #: before it), for ``tms_bench``.
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
            "messages": self.messages,
            "errors": self.errors,
            "held_back": self.held_back,
            "due_query_p50_ms": quantile(0.50),
            "due_query_p99_ms": quantile(0.99),
            "due_query_max_ms": quantile(1.0),
        }


@dataclass
class Backlog:
    """How long a message published now waits in the execution queue, estimated from the
    queue's depth and how fast the workers drain it.

    A PENDING row is republished once unclaimed for ``PENDING_REPUBLISH_AFTER`` seconds *plus*
    this wait: behind a deep queue a message is late, not lost, and publishing it again only adds
    a duplicate the workers must read and refuse (the chaos run's RabbitMQ restart left 243). The
    drain rate comes from the monitor's own counts: what it published since the last look, less
    what is still queued (with several monitors it sees only its own publishes, so it
    underestimates the rate and waits longer, never shorter). Until it has a rate, nothing is added.
    """

    depth: int = 0
    published: int = 0
    at: float | None = None
    #: Messages consumed per second (moving average); 0 while unknown.
    rate: float = 0.0

    def observe(self, *, depth: int, published: int, now: float) -> None:
        """Record the queue's ready messages ``depth`` and the monitor's ``published`` total."""
        if self.at is not None and now > self.at:
            consumed = self.depth + (published - self.published) - depth
            if consumed >= 0:
                sample = consumed / (now - self.at)
                self.rate = sample if not self.rate else 0.7 * self.rate + 0.3 * sample
        self.depth, self.published, self.at = depth, published, now

    def republish_after(self, base: float) -> float:
        """The age at which an unclaimed PENDING row is taken as lost: ``base`` plus the queue's
        wait, at most ten times ``base`` (a stuck estimate never stops republishing)."""
        if not self.depth or self.rate <= 0:
            return base
        return min(base + self.depth / self.rate, 10 * base)


class Monitor:
    """One monitor process. ``run()`` loops until ``stop()`` (or SIGTERM/SIGINT).

    ``publish`` sends each message (:func:`send` unless a test puts a failing one in its place).
    """

    def __init__(
        self,
        *,
        conf: TmsSettings | None = None,
        batch: int | None = None,
        publish: Publish = send,
        publish_many: PublishMany = send_many,
    ) -> None:
        self.conf = conf or tms_settings()
        self.batch = batch or self.conf.MONITOR_BATCH
        #: Runs due within this many seconds are taken and published now, with their due time as
        #: the message's ETA (TMS_MONITOR_LOOKAHEAD; 0 on quorum queues, whose consumers cannot
        #: hold an ETA message: TMS_QUEUE_TYPE).
        self.ahead = self.conf.lookahead
        #: A pass takes every run due within the lookahead, but the loop wakes for the next one
        #: only once it is due within half of it: at a steady rate each pass then takes half a
        #: lookahead's runs, still each ahead of its time, where waking at the lookahead's edge
        #: took them one pass each (1,799 passes for 2,470 runs at 123 runs/s), and a pass costs
        #: about as much for one run as for twenty.
        self.wake_ahead = self.ahead / 2
        self.publish = publish
        #: With tracing on, the span of the pass under way (tms.monitor.pass).
        self._pass_span: Any = None
        self.publish_many = publish_many
        self.actor = f"monitor:{socket.gethostname()}:{os.getpid()}"
        self.listener = DueListener()
        #: Fair share (executions.fairness): keeps the queue shallow and fills it team by team;
        #: None when TMS_MONITOR_QUEUE_SECONDS is 0 (everything due is published at once).
        self.pacer = fairness.Pacer(self.conf) if self.conf.MONITOR_QUEUE_SECONDS > 0 else None
        self.stats = MonitorStats()
        self.backlog = Backlog()
        #: When (monotonic) housekeeping looks found the execution queue without a ready message,
        #: oldest first, for :meth:`_uncarried_for`; emptied when a look gets no answer.
        self._empty_looks: deque[float] = deque()
        #: The last pass published due runs or held some back: the next one goes straight to its
        #: takes (the outlook would only say that work is there; a herd's top-ups come ten a
        #: second). Polls and republished runs do not count: they seldom come in a run.
        self._busy = False
        #: When (monotonic) the pass read the ``next_due`` it returns: the loop sleeps until then
        #: plus that wait, not that wait after the publishing that followed the read.
        self._looked_at = 0.0
        self._running = False
        #: Set by :meth:`stop`: a pass in progress ends after its current batch.
        self._stop_requested = False
        from executions.tasks import poll_execution, run_execution, run_executions

        self._run_task = run_execution
        #: Seconds a look that found the queue empty must age before rows PENDING since are taken as
        #: carried by no message (UNCARRIED_AFTER, beyond the broker heartbeat's bound).
        self.uncarried_after = UNCARRIED_AFTER + 3 * float(run_execution.app.conf.broker_heartbeat or 0)
        self._runs_task = run_executions
        self._poll_task = poll_execution

    # -- one pass ---------------------------------------------------------------------------

    def _publish(
        self,
        taken: list[transitions.Dispatch],
        task: Any,
        producer: Producer,
        confirms: Confirms,
        *,
        group: bool = False,
    ) -> None:
        """Publish taken rows (with ``group``, several runs per message: :func:`group_runs`),
        then wait once for the broker's confirms of them all; undo (back to SCHEDULED) what could
        not be published, or the whole batch if it was not confirmed (a worker that already got
        one of its messages finds the row SCHEDULED and its claim loses)."""
        sent = 0
        start_ns = tracing.now_ns() if tracing.ON and taken else 0
        if group and self.conf.DISPATCH_BATCH > 1:
            # Spread a take over at least MONITOR_MIN_PENDING messages, so that every pool process
            # gets work at once; unless that many runs are queued already (the workers have work):
            # then the take goes in as few messages as it fits. Runs that become due a few at a
            # time under load (workflow steps, each due when the one before ends) were otherwise
            # sent one per message.
            queued = self.pacer.queued if self.pacer is not None else 0
            spread = 1 if queued >= self.conf.MONITOR_MIN_PENDING else self.conf.MONITOR_MIN_PENDING
            groups = group_runs(taken, most=self.conf.DISPATCH_BATCH, spread=spread, window=self.conf.DISPATCH_WINDOW)
        else:
            groups = [[item] for item in taken]
        try:
            # Outside the pass's span: in a sampled pass every message (a burst's thousands) made
            # Celery's publish and run spans and its runs' SQL spans, whatever the runs' own sampling;
            # a run's message is told by its own spans, in its own trace (traces.published).
            with tracing.untraced():
                for items in groups:
                    first = items[0]
                    if len(items) == 1:
                        with log_context(
                            execution_id=first.execution_id, attempt=first.attempt, celery_task_id=first.message_id
                        ):
                            self.publish(task, first, producer)
                            logger.debug(
                                "execution %s attempt %s: published (%s)", first.execution_id, first.attempt, first.kind
                            )
                    else:
                        self.publish_many(self._runs_task, items, producer)
                        logger.debug("executions %s: published in one message", [i.execution_id for i in items])
                    # Groups are slices of taken, in order: taken[sent:] is what was not published.
                    sent += len(items)
                    self.stats.messages += 1
            if taken:
                try:
                    confirms.wait()
                except _BROKER_ERRORS:
                    sent = 0
                    raise
                if start_ns:
                    traces.published(
                        taken, taken_ns=start_ns, start_ns=start_ns, end_ns=tracing.now_ns(), span=self._pass_span
                    )
        except _BROKER_ERRORS:
            metrics.MONITOR_PUBLISH_ERRORS.inc()
            transitions.executions_untake(
                dispatches=taken[sent:], actor=self.actor, reason="broker unavailable: not published"
            )
            raise

    def dispatch_once(self, *, housekeeping: bool = True) -> tuple[int, float | None]:
        """Publish everything due now, in batches. Returns (messages sent, seconds until the next
        due execution or None). Each batch takes its rows and looks up the next due time in one
        transaction (one commit); ``housekeeping`` also republishes lost messages and dispatches
        polls, which the loop does about once per ``MONITOR_MAX_SLEEP``. Messages go out on a
        channel of the pass's own, each batch confirmed by one wait (executions.publishing).

        A pass after one that found nothing first reads the outlook (one statement): when
        nothing is due, nothing is PENDING and no poll is due, that is the whole pass, with no
        transaction and no broker channel. A pass after one that published due runs or held some
        back skips the outlook: work was there a moment ago."""
        if not self._busy:
            self._looked_at = time.monotonic()  # the outlook's now() is its statement's start
            outlook = transitions.dispatch_outlook()
            runs_in = self._until_takeable(outlook.runs_in)
            if runs_in != 0.0 and not outlook.pending and not outlook.polls:
                if self.pacer is not None:
                    self.pacer.idle()
                # Nothing queued of ours to estimate: the next backlog is measured afresh.
                self.backlog = Backlog()
                return 0, runs_in
        # Until the pass has shown otherwise, the next one reads the outlook (a failed pass too).
        self._busy = False
        published, held_back = self.stats.published, self.stats.held_back
        with contextlib.ExitStack() as stack:
            if tracing.ON:
                self._pass_span = stack.enter_context(tracing.pass_span("tms.monitor.pass"))
                stack.callback(setattr, self, "_pass_span", None)
            with self._run_task.app.producer_or_acquire() as pooled:
                # Take nothing while the broker is unreachable: it would only have to be undone.
                pooled.connection.ensure_connection(max_retries=1)
                with confirmed_batches(pooled) as (producer, confirms):
                    self._declare_queue(producer)
                    sent, next_due = self._dispatch(producer, confirms, housekeeping=housekeeping)
            if self._pass_span is not None:
                self._pass_span.set_attribute("tms.messages", sent)
                if not sent:
                    tracing.drop(self._pass_span)  # a pass that published nothing is not worth a trace
        self._busy = self.stats.published > published or self.stats.held_back > held_back
        return sent, next_due

    def _declare_queue(self, producer: Producer) -> None:
        """Declare the execution queue (as Celery does, with its arguments) before taking
        anything, on the pass's channel. Celery declares it once per connection; on a cluster
        whose node holding the queue went down while this connection (to another node) lived on,
        publishes were then confirmed and dropped. The declare is refused instead (404: its home
        node is down) and the pass takes nothing: the runs stay SCHEDULED until the queue is back."""
        app = self._run_task.app
        queue = app.amqp.queues[app.conf.task_default_queue]
        try:
            queue(producer.channel).queue_declare()
        except ChannelError as exc:
            # A queue declared with another type (TMS_QUEUE_TYPE changed under an existing queue)
            # is refused for good: stop with what to do, not a retry every 2 s for ever.
            mismatch = queue_type_mismatch(exc, self.conf.QUEUE_TYPE)
            if mismatch is not None:
                raise mismatch from exc
            raise

    def _dispatch(self, producer: Producer, confirms: Confirms, *, housekeeping: bool) -> tuple[int, float | None]:
        sent, next_due = 0, None
        while True:
            limit = self.batch
            # PostgreSQL's now() is the transaction's start: the next_due read below counts from
            # here, not from the commit after the take (a slow take once made every sleep as late).
            looked_at = time.monotonic()
            # One transaction (one commit) per batch, the queue count of the pacer included: a
            # held-back monitor tops up ten times a second, whatever the rate.
            with transaction.atomic():
                if self.pacer is None:
                    taken = transitions.executions_take_due(limit=self.batch, actor=self.actor, ahead=self.ahead)
                    next_due = self._until_takeable(transitions.next_due_in()) if len(taken) < self.batch else 0.0
                elif limit := min(self.batch, self.pacer.room()):
                    taken = fairness.take_due_fairly(limit=limit, actor=self.actor, ahead=self.ahead)
                    next_due = self._until_takeable(transitions.next_due_in()) if len(taken) < self.batch else 0.0
                else:
                    # The queue is deep enough: take nothing (top up again soon if runs are due,
                    # below; else sleep until the next is due, as ever).
                    taken, next_due = [], self._until_takeable(transitions.next_due_in())
            self._looked_at = looked_at
            self._publish(taken, self._run_task, producer, confirms, group=True)
            sent += len(taken)
            self.stats.published += len(taken)
            metrics.MONITOR_PUBLISHED.labels("run").inc(len(taken))
            if self.pacer is not None:
                self.pacer.published(len(taken))
                if next_due == 0.0 and len(taken) >= limit and limit < self.batch:
                    # Runs are due but held back: the pacer's room, not what was due, bounded the
                    # take (the queue is deep enough). Top up soon. A take that got fewer than its
                    # room took all that was due: runs due now became due since (the due time is
                    # each statement's own), and the loop takes them at once, as without a pacer;
                    # waiting a top-up for them added MONITOR_TOPUP_INTERVAL to most runs of a
                    # steady load (p50 ~110 ms at any rate).
                    self.stats.held_back += 1
                    next_due = self.conf.MONITOR_TOPUP_INTERVAL
                    self._looked_at = time.monotonic()  # a top-up interval from now, not a due time
                    break
            # A stop (SIGTERM) ends the pass between batches: every batch taken so far has
            # been published; the rest of a backlog stays SCHEDULED for another monitor.
            if len(taken) < self.batch or self._stop_requested:
                break
        if housekeeping and not self._stop_requested:
            self._observe_queue(producer)
            older_than = float(round(self.backlog.republish_after(self.conf.PENDING_REPUBLISH_AFTER)))
            uncarried = self._uncarried_for()
            if uncarried is not None and uncarried < older_than:
                older_than = round(uncarried, 1)
            stale = transitions.executions_take_stale_pending(limit=self.batch, older_than=older_than, actor=self.actor)
            self._publish(stale, self._run_task, producer, confirms)
            polls = transitions.executions_take_polls(
                limit=self.batch, in_flight_for=self.conf.PENDING_REPUBLISH_AFTER, actor=self.actor
            )
            self._publish(polls, self._poll_task, producer, confirms)
            self.stats.republished += len(stale)
            self.stats.polls += len(polls)
            metrics.MONITOR_PUBLISHED.labels("republish").inc(len(stale))
            metrics.MONITOR_PUBLISHED.labels("poll").inc(len(polls))
            sent += len(stale) + len(polls)
        return sent, next_due

    def _until_takeable(self, due_in: float | None) -> float | None:
        """Seconds until the next pass takes the next run (its due time less half the lookahead:
        :attr:`wake_ahead`), or None."""
        return None if due_in is None else max(0.0, due_in - self.wake_ahead)

    def _observe_queue(self, producer: Producer) -> None:
        """Feed :attr:`backlog` the execution queue's depth (a passive declare on a channel of its
        own: a refused one closes only that channel). Without an answer, the fixed age holds."""
        queue = self._run_task.app.conf.task_default_queue
        try:
            connection: Any = producer.connection
            with connection.channel() as channel:
                depth = channel.queue_declare(queue=queue, passive=True).message_count
        except Exception as exc:  # noqa: BLE001 - a hint only: a missing queue, a closed channel
            logger.debug("queue depth of %s unknown (%s)", queue, exc)
            self.backlog = Backlog()
            self._empty_looks.clear()
            return
        now = time.monotonic()
        if depth == 0:
            self._empty_looks.append(now)
        # The queue counts messages, so the drain rate is in messages too.
        self.backlog.observe(depth=depth, published=self.stats.messages, now=time.monotonic())

    def _uncarried_for(self) -> float | None:
        """Seconds since the latest look that found the queue without a ready message and is at
        least :attr:`uncarried_after` old (None: no such look). PENDING rows enqueued before it and
        still PENDING have no message (:data:`UNCARRIED_AFTER`)."""
        now = time.monotonic()
        found = None
        while self._empty_looks and now - self._empty_looks[0] >= self.uncarried_after:
            found = self._empty_looks.popleft()
        if found is None:
            return None
        self._empty_looks.appendleft(found)  # still the latest such look until a later one ages
        return now - found

    def _time_due_query(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        """Execute wrapper: records how long the due query (the SKIP LOCKED select) takes."""
        if ("SKIP LOCKED" not in sql or '"due_at" <=' not in sql) and "OVER (PARTITION BY" not in sql:
            return execute(sql, params, many, context)
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.stats.due_query_seconds.append(time.perf_counter() - started)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, *, max_passes: int | None = None) -> None:
        self._running = True
        failures, last_housekeeping, connection_checked = 0, 0.0, 0.0
        logger.info("%s started (batch %d)", self.actor, self.batch)
        while self._running and (max_passes is None or self.stats.passes < max_passes):
            self.stats.passes += 1
            housekeeping = time.monotonic() - last_housekeeping >= self.conf.MONITOR_MAX_SLEEP
            started = time.perf_counter()
            try:
                if time.monotonic() - connection_checked >= CONNECTION_CHECK_INTERVAL:
                    close_old_connections()
                    connection_checked = time.monotonic()
                with connection.execute_wrapper(self._time_due_query):
                    sent, next_due = self.dispatch_once(housekeeping=housekeeping)
                failures = 0
            except (DatabaseError, *_BROKER_ERRORS) as exc:
                metrics.MONITOR_PASS_SECONDS.observe(time.perf_counter() - started)
                metrics.MONITOR_PASS_ERRORS.inc()
                failures += 1
                self.stats.errors += 1
                delay = min(30.0, 0.5 * 2 ** min(failures, 6))
                if isinstance(exc, ChannelError):
                    delay = min(delay, CHANNEL_ERROR_RETRY_MAX)
                elif isinstance(exc, DatabaseError):
                    delay = (
                        DATABASE_ERROR_RETRY[failures - 1]
                        if failures <= len(DATABASE_ERROR_RETRY)
                        else DATABASE_ERROR_RETRY_MAX
                    )
                logger.warning("monitor pass failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
                connection.close()
                self._sleep(delay)
                continue
            metrics.MONITOR_PASS_SECONDS.observe(time.perf_counter() - started)
            if housekeeping:
                last_housekeeping = time.monotonic()
            if sent and next_due == 0.0:
                continue
            if next_due is not None:
                # The next run is due next_due after the pass read it, and publishing (its confirm
                # wait) came after the read: sleeping next_due from now would start it that late.
                next_due = max(0.0, next_due - (time.monotonic() - self._looked_at))
            wait = self.conf.MONITOR_MAX_SLEEP if next_due is None else min(next_due, self.conf.MONITOR_MAX_SLEEP)
            self.listener.wait(wait)
        self.listener.close()
        logger.info("%s stopped; monitor stats %s", self.actor, json.dumps(self.stats.summary()))

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self._running and time.monotonic() < deadline:
            time.sleep(min(0.2, deadline - time.monotonic()))

    def stop(self, *args: object) -> None:
        """Stop between batches (also the SIGTERM/SIGINT handler: it only sets a flag, so a batch
        being taken or published is finished, never cut in half). The loop ends after the batch in
        hand, or within ``MONITOR_MAX_SLEEP`` when it is sleeping."""
        self._running = False
        self._stop_requested = True

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
