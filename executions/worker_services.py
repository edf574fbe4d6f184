"""What a worker does with an execution: claim it, drive its runner, record the outcome.

Every write goes through :mod:`executions.transitions` and is fenced by the attempt number and
this process's lease; a write that loses means another worker (or a cancel) took over, and this
worker stops working on the execution at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from executions import limits, traces, transitions
from executions.backoff import exponential_backoff
from executions.models import Execution, ExecutionStatus
from executions.notify import notify_due
from executions.runs import (
    describe_error,
    execution_record_outcome,
    load_execution,
    persist,
    redacted,
    run_spec,
    stop_external_run,
    task_for_run,
)
from runners.base import BaseRunner, RunHandle, RunnerError, RunResult, RunSpec, RunState
from runners.registry import get_runner
from tasks_app.models import Task
from tasks_app.quotas import rate_take
from tasks_app.secrets import secret_values
from tms_core import logcontext, tracing
from tms_core.clock import db_now
from tms_core.conf import tms_settings
from tms_core.logcontext import log_context

logger = logging.getLogger(__name__)

#: Polling of asynchronous runs: first delay, growth factor and cap, in seconds.
POLL_BASE, POLL_FACTOR, POLL_CAP = 1.0, 2.0, 60.0

#: A message of several runs (:func:`executions_run_batch`) hands the runs it has not claimed yet
#: on in a message of their own once it has worked this many seconds: slow launches hold the rest
#: back for about this long at most, and other pool processes take them meanwhile.
HAND_ON_AFTER = 1.0

#: Runs of a message claimed (and their successes recorded) together: as many as take about this
#: many seconds to launch, going by how long this process's latest launches took (the first run
#: of a process is handled alone). A run's start time is its claim's, so this bounds how much
#: earlier than its launch it may say it started when the runs before it in its chunk launch
#: quickly, as they did so far.
CHUNK_SECONDS = 0.05


class _LaunchPace:
    """Seconds a launch took in this process lately (its latest chunk's, per run): the size of
    the next chunk. Only the launches are timed, not the chunk's claim and its recorded
    successes, which are one statement each whatever the chunk's size: timed with them, a chunk of
    one run (a claim and an end of its own, a workflow step's creation with it: 15-60 ms on a
    busy machine) came out slower than :data:`CHUNK_SECONDS`, so the next chunk was of one run
    again, and so on; a chain's steps went out one per message for good. Kept across messages, so
    that a message's first run is not handled alone each time either."""

    seconds: float | None = None


_pace = _LaunchPace()

#: A chunk whose launches have taken this many seconds lets its claimed runs not launched yet go
#: (RUNNING without a lease, due for a poll at once), for another worker to launch.
LET_GO_AFTER = 1.0

#: Database errors after which a message is handled again later (the Celery tasks retry on them:
#: executions.tasks); any other error is one run's own.
RETRIED_DB_ERRORS = (OperationalError, InterfaceError)


class _LeaseKeeper:
    """One thread per worker process extends the leases of the executions the process works on.

    The lease lives exactly as long as the work: when this process dies (SIGKILL, OOM) or is
    paused (SIGSTOP), nobody extends it, it expires, and the monitor hands the execution to
    another worker. Work shorter than one heartbeat interval never touches the database from here.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: execution id -> (attempt, lease owner, set when the lease was lost, holds limit slots)
        self._held: dict[int, tuple[int, str, threading.Event, bool]] = {}
        self._thread: threading.Thread | None = None
        self._pid = 0

    def hold(self, execution_id: int, attempt: int, worker_id: str, *, slots: bool = False) -> threading.Event:
        lost = threading.Event()
        with self._lock:
            self._held[execution_id] = (attempt, worker_id, lost, slots)
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                # First use in this process (pool processes are forked without the thread).
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="tms-leases", daemon=True)
                self._thread.start()
        return lost

    def release(self, execution_id: int) -> None:
        with self._lock:
            self._held.pop(execution_id, None)

    def holds(self, execution_id: int) -> bool:
        """Whether this process works on the execution now (a lease it keeps)."""
        with self._lock:
            return execution_id in self._held and self._pid == os.getpid()

    def _forget(self, execution_id: int, lost: threading.Event) -> bool:
        """Drop the hold whose extension lost, if it is still held (``lost`` names the hold): the
        work may have ended meanwhile (its lease released, nothing lost), and this process may
        already hold the execution again (its next poll, or a resume), which must stay held.
        Returns whether the hold was still there."""
        with self._lock:
            held = self._held.get(execution_id)
            if held is None or held[2] is not lost:
                return False
            del self._held[execution_id]
            return True

    def _run(self) -> None:
        conf = tms_settings()
        while True:
            time.sleep(conf.HEARTBEAT_INTERVAL)
            with self._lock:
                due = [(i, *held) for i, held in self._held.items()]
            for execution_id, attempt, worker_id, lost, slots in due:
                with log_context(execution_id=execution_id, attempt=attempt, worker_id=worker_id):
                    self._extend(conf, execution_id, attempt, worker_id, lost, slots)
            if not due:
                connection.close()

    def _extend(
        self, conf: Any, execution_id: int, attempt: int, worker_id: str, lost: threading.Event, slots: bool
    ) -> None:
        try:
            if not transitions.execution_extend_lease(
                execution_id=execution_id, attempt=attempt, worker_id=worker_id, lease_seconds=conf.WORKER_TIMEOUT
            ):
                lost.set()
                if self._forget(execution_id, lost):
                    logger.warning("execution %s: lease lost to another worker", execution_id)
            elif slots:
                # Its named-limit slots are leases too: they live exactly as long as this one.
                limits.limits_extend_slots(execution_id=execution_id, seconds=conf.WORKER_TIMEOUT)
        except DatabaseError as exc:
            logger.warning("execution %s: lease extension failed (%s)", execution_id, exc)
            connection.close()


_keeper = _LeaseKeeper()


@contextmanager
def keep_lease(*, execution_id: int, attempt: int, worker_id: str, slots: bool = False) -> Iterator[threading.Event]:
    """Keep this process's lease on an execution while the block runs (see :class:`_LeaseKeeper`),
    and with ``slots`` the named-limit slots it holds. The yielded event is set if an extension
    lost: another worker took the execution over."""
    lost = _keeper.hold(execution_id, attempt, worker_id, slots=slots)
    try:
        yield lost
    finally:
        _keeper.release(execution_id)


#: Claims this process sent and got no answer to, by (execution id, attempt): the connection
#: dropped (a PostgreSQL failover) after the statement was sent, so the claim may have committed,
#: leased to this process. The next claim of one here takes it back first
#: (:func:`transitions.execution_take_back`): a fenced claim would lose to it, and the run would
#: wait, launched by nobody, for its lease to run out. An entry goes once a claim statement of
#: that run is answered.
_unanswered: set[tuple[int, int]] = set()


def execution_run(*, execution_id: int, attempt: int, worker_id: str) -> str:
    """Handle a ``run_execution`` message: claim, start the runner, record what it returns.

    An exclusive execution (its task's overlap policy is not "allow") is claimed through
    :func:`transitions.execution_claim_exclusive`, which may skip or queue it instead, or cancel
    the previous run (whose external run is then stopped through its runner).

    A claim that raised a lost-connection error may have committed with its answer lost: it is
    sent again here through the outage (for up to half a lease, :func:`persist`), taking back this
    process's own claim if it had committed (:data:`_unanswered`). If the database stays away
    longer, the error ends the message (the Celery task retries it; in this process, the retry
    takes the claim back too).

    Returns a short word for logs and tests: ``lost`` (the claim lost), ``skipped``, ``queued``,
    ``finished``, ``polling`` or ``deferred`` (the runner's launch rate is used up for the owner:
    the launch waits for a poll, see :func:`_start`).
    """
    claim = partial(_claim, execution_id=execution_id, attempt=attempt, worker_id=worker_id)
    claim_ns = tracing.now_ns() if tracing.ON else 0
    try:
        exclusive = claim()
    except RETRIED_DB_ERRORS as exc:
        logger.warning(
            "execution %s attempt %s: claim sent, answer lost (%s); claiming again", execution_id, attempt, exc
        )
        connection.close()
        exclusive = persist(claim, doing="claiming")
    if exclusive.cancelled:
        _stop_cancelled_runs(exclusive.cancelled)
    if exclusive.execution is None:
        detail = exclusive.detail or (
            "claim lost (already taken, cancelled or gone)" if exclusive.outcome == "lost" else ""
        )
        logger.info("execution %s attempt %s: %s %s", execution_id, attempt, exclusive.outcome, detail)
        return exclusive.outcome
    if claim_ns:
        traces.claimed(exclusive.execution, start_ns=claim_ns, worker_id=worker_id)
    return _run_claimed(exclusive.execution, worker_id)


def _claim(*, execution_id: int, attempt: int, worker_id: str) -> transitions.ExclusiveClaim:
    """Claim the run: the fast claim, else under its task's start rules; first, if a claim of it
    from this process went unanswered, take that claim back."""
    key, lease = (execution_id, attempt), tms_settings().WORKER_TIMEOUT
    ids: dict[str, Any] = {"execution_id": execution_id, "attempt": attempt, "worker_id": worker_id}
    try:
        if key in _unanswered and not _keeper.holds(execution_id):
            taken = transitions.execution_take_back(**ids, lease_seconds=lease)
            _unanswered.discard(key)
            if taken is not None:
                logger.warning("execution %s attempt %s: claim taken back (its answer was lost)", execution_id, attempt)
                return transitions.ExclusiveClaim("claimed", taken)
        execution = transitions.execution_claim_loaded(**ids, lease_seconds=lease)
        if execution is not None:
            _unanswered.discard(key)
            return transitions.ExclusiveClaim("claimed", execution)
        # Not claimable on the fast path: taken, cancelled, gone, or exclusive (overlap policy).
        exclusive = transitions.execution_claim_exclusive(**ids, lease_seconds=lease)
    except RETRIED_DB_ERRORS:
        _unanswered.add(key)
        raise
    _unanswered.discard(key)
    return exclusive


def _run_claimed(
    execution: Execution, worker_id: str, *, record: Callable[..., str] | None = None, lease: bool = True
) -> str:
    """Start the runner of an execution this worker claimed. ``record`` records an outcome the
    runner gave at once (:func:`execution_record_outcome` unless a chunk collects them);
    ``lease=False``: the caller keeps the lease."""
    task = task_for_run(execution, execution.task)
    with _working_on(execution, task, worker_id, lease=lease):
        logger.info(
            "execution %s attempt %s: claimed; starting runner %s", execution.pk, execution.attempt, task.runner
        )
        return _start(execution, task, worker_id, record=record or execution_record_outcome)


@contextmanager
def _working_on(execution: Execution, task: Task, worker_id: str, *, lease: bool = True) -> Iterator[None]:
    """While this worker starts or polls an execution's run: its ids in the log context, its task's
    secret values redacted from the log, and (``lease``) its lease kept from the keeper thread."""
    execution_id, attempt = execution.pk, execution.attempt
    keeping: AbstractContextManager[object] = (
        keep_lease(execution_id=execution_id, attempt=attempt, worker_id=worker_id, slots=task.has_limits)
        if lease
        else nullcontext()
    )
    with (
        log_context(
            execution_id=execution_id,
            attempt=attempt,
            worker_id=worker_id,
            **_task_ids(task),
            **traces.log_ids(execution),
        ),
        logcontext.redacting(secret_values(task.runner, task.config, task.secret_fields or [])),
        keeping,
    ):
        yield


def executions_run_batch(
    *,
    items: Sequence[Sequence[int]],
    worker_id: str,
    hand_on: Callable[[list[tuple[int, int]]], bool],
    more: list[transitions.Dispatch] | None = None,
) -> Counter[str]:
    """Handle a ``run_executions`` message: each (execution id, attempt), in order, in this
    process, with the outcome :func:`execution_run` gives it.

    The monitor groups the runs of a herd (many due at once) into such messages: one message,
    one acknowledgement and one task call for several runs instead of one each. The runs are
    handled in chunks (:data:`CHUNK_SECONDS`): a chunk's runs are claimed in one statement, and
    the successes its runners report at once are recorded in one statement at its end (a
    failure, a run that goes on, or a run under a start rule is recorded on its own, as ever).
    Each row is still fenced on its own (attempt and lease), so a message delivered again (its
    worker died mid-way) finds the runs it already handled taken, and their claims lose.

    After :data:`HAND_ON_AFTER` seconds the runs not claimed yet go to ``hand_on`` (a new
    message; it returns False if that could not be published, and this process carries on with
    them). A chunk whose launches turn out slow (:data:`LET_GO_AFTER`) lets its claimed runs not
    launched yet go for another worker to launch (``deferred``). A lost or unreachable database
    (:data:`RETRIED_DB_ERRORS`) ends the call: the Celery task retries the message, and what was
    handled loses its claims (a run claimed and not finished is resumed once its lease runs
    out). Any other error of one run is logged and the next run goes on, as a failing message of
    its own would not stop the others.

    ``more``: runs this process took while handling the message (the workflow steps its own ends
    created, which ``transitions.publishing_steps`` adds there when they commit): handled after
    the message's own, the same way and within the same budget, so that a chain's next step costs
    no message; what the budget leaves is handed on with the rest.

    Returns how many runs ended with each of :func:`execution_run`'s words, and ``handed_on``.
    """
    began = time.monotonic()
    outcomes: Counter[str] = Counter()
    can_hand_on = True
    pairs = [(execution_id, attempt) for execution_id, attempt in items]
    index = 0
    try:
        while True:
            if more and not can_hand_on:
                # Its budget is spent and nothing can be handed on: the runs it has are run here,
                # the steps that keep coming are the monitor's (a chain must not hold it for good).
                _give_back(more, worker_id)
            elif more:
                pairs.extend((taken.execution_id, taken.attempt) for taken in more)
                more.clear()
            if index >= len(pairs):
                break
            if can_hand_on and index and time.monotonic() - began > HAND_ON_AFTER:
                rest = pairs[index:]
                if hand_on(rest):
                    outcomes["handed_on"] += len(rest)
                    logger.info("batch: %d run(s) handed on after %.1fs", len(rest), time.monotonic() - began)
                    break
                can_hand_on = False
            pace = _pace.seconds
            size = 1 if pace is None else max(1, int(CHUNK_SECONDS / max(pace, 1e-4)))
            chunk = pairs[index : index + size]
            words, launching = _run_chunk(chunk, worker_id)
            outcomes.update(words)
            _pace.seconds = launching / len(chunk)
            index += len(chunk)
    except RETRIED_DB_ERRORS:
        # The message is retried with its own runs; the steps this process took and did not get
        # to go in a message of their own (claims are fenced: one already claimed loses).
        taken = pairs[max(index, len(items)) :] + [(step.execution_id, step.attempt) for step in more or ()]
        if more:
            more.clear()
        if taken:
            hand_on(taken)
        raise
    return outcomes


def _give_back(steps: list[transitions.Dispatch], worker_id: str) -> None:
    """Workflow steps this process took and will not run: back to SCHEDULED, for the monitor."""
    given, steps[:] = list(steps), []
    # On a database error they stay PENDING: published again once unclaimed for too long.
    with contextlib.suppress(*RETRIED_DB_ERRORS), transaction.atomic():
        transitions.executions_untake(dispatches=given, actor=worker_id, reason="left to the monitor")
        notify_due()


def _run_one(execution_id: int, attempt: int, worker_id: str) -> str:
    return _handled(
        execution_id,
        attempt,
        worker_id,
        partial(execution_run, execution_id=execution_id, attempt=attempt, worker_id=worker_id),
    )


def _handled(execution_id: int, attempt: int, worker_id: str, handle: Callable[[], str]) -> str:
    """One run of a message of several: a lost database ends the message (it is retried), any
    other error is this run's alone (logged; the next run goes on)."""
    with log_context(execution_id=execution_id, attempt=attempt, worker_id=worker_id):
        try:
            return handle()
        except RETRIED_DB_ERRORS:
            raise
        except Exception:
            logger.exception("execution %s attempt %s: handling failed", execution_id, attempt)
            return "error"


class _Successes:
    """The successes runners of a chunk reported at once, recorded together at its end
    (:func:`transitions.executions_succeed`). Any other outcome, and the outcome of a run under
    a start rule (whose slot must be freed), is recorded at once, as :func:`_start` would."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.pending: list[transitions.Success] = []
        #: With tracing on, the runs of ``pending``, for their end spans once recorded.
        self.traced: dict[int, tuple[Execution, Task]] = {}

    def record(
        self,
        *,
        execution: Execution,
        task: Task,
        worker_id: str | None,
        result: RunResult,
        external_run_id: str | None = None,
    ) -> str:
        if result.state is not RunState.SUCCEEDED or execution.exclusive or task.has_limits:
            return execution_record_outcome(
                execution=execution, task=task, worker_id=worker_id, result=result, external_run_id=external_run_id
            )
        output = redacted(task, result).output
        if tracing.ON:
            self.traced[execution.pk] = (execution, task)
        self.pending.append(
            transitions.Success(execution.pk, execution.attempt, output, external_run_id or "", execution.followed)
        )
        return "finished"

    def flush(self) -> set[int]:
        """Record the collected successes; returns the ids whose write lost (lease lost)."""
        if not self.pending:
            return set()
        successes, self.pending = self.pending, []
        won = persist(
            lambda: transitions.executions_succeed(
                successes=successes, worker_id=self.worker_id, max_chars=tms_settings().OUTPUT_MAX_CHARS
            )
        )
        lost = {success.execution_id for success in successes} - won
        for execution_id in sorted(won) if self.traced else ():
            if execution_id in self.traced:
                traces.ended(*self.traced[execution_id], status=ExecutionStatus.SUCCEEDED)
        self.traced.clear()
        for execution_id in sorted(lost):
            logger.warning("execution %s: outcome not recorded, lease lost", execution_id)
        return lost


def _run_chunk(chunk: list[tuple[int, int]], worker_id: str) -> tuple[list[str], float]:
    """Claim the chunk's runs in one statement, start each, record their immediate successes in
    one statement; a run the claim did not take goes the one-by-one way (:func:`_run_one`).
    Returns each run's word and the seconds the launches took (the claim and the recorded
    successes left out: see :class:`_LaunchPace`)."""
    claim_ns = tracing.now_ns() if tracing.ON else 0
    try:
        claimed = transitions.executions_claim_loaded(
            items=chunk, worker_id=worker_id, lease_seconds=tms_settings().WORKER_TIMEOUT
        )
    except RETRIED_DB_ERRORS as exc:
        # Sent, and no answer: the claims may have committed. Each run goes the one-by-one way,
        # which claims again through the outage and takes back what this one took.
        logger.warning("%d claim(s) sent, answer lost (%s); claiming one by one", len(chunk), exc)
        _unanswered.update((execution_id, attempt) for execution_id, attempt in chunk)
        connection.close()
        claimed = {}
    # Every claimed run is leased from its claim until its outcome is written (a run waiting
    # behind a slow launch in the chunk keeps its lease).
    for held in claimed.values():
        _keeper.hold(held.pk, held.attempt, worker_id)
        if claim_ns:
            traces.claimed(held, start_ns=claim_ns, worker_id=worker_id)
    successes = _Successes(worker_id)
    words: list[str] = []
    deferred: dict[int, int] = {}  # execution id -> its place in words, while its success waits
    began = time.monotonic()
    try:
        for execution_id, attempt in chunk:
            # Popped: the same run twice in a message is claimed (and started) once.
            execution = claimed.pop(execution_id) if execution_id in claimed else None
            if execution is None:
                words.append(_run_one(execution_id, attempt, worker_id))
                continue
            if time.monotonic() - began > LET_GO_AFTER:
                # The chunk's launches turned out slow: the claimed runs not launched yet are let
                # go, RUNNING without a lease and due for a poll at once, so another worker
                # launches them (execution_resume) instead of them waiting here.
                release = partial(
                    transitions.execution_release,
                    execution_id=execution_id,
                    attempt=attempt,
                    worker_id=worker_id,
                    poll_in=0,
                )
                released = persist(release)
                words.append("deferred" if released else "lost")
                _keeper.release(execution_id)
                continue
            start = partial(_run_claimed, execution, worker_id, record=successes.record, lease=False)
            words.append(_handled(execution_id, attempt, worker_id, start))
            if successes.pending and successes.pending[-1].execution_id == execution_id:
                deferred[execution_id] = len(words) - 1
            else:
                _keeper.release(execution_id)  # its outcome is written, or it is polled
        launching = time.monotonic() - began
        for execution_id in successes.flush():
            words[deferred[execution_id]] = "lost"
    finally:
        for execution_id, _ in chunk:
            _keeper.release(execution_id)
    return words, launching


def _task_ids(task: Task) -> dict[str, object]:
    """The task's ids for the log context (tms_core.logcontext), also added to the binding of the
    Celery task handling the message, whose own lines come after this service returns."""
    ids = {"task_id": task.pk, "tracing_id": task.tracing_id}
    logcontext.add(**ids)
    return ids


def _stop_cancelled_runs(cancelled: tuple[tuple[int, transitions.CancelOutcome], ...]) -> None:
    """Stop, through their runner, the external runs of executions the overlap policy
    cancel_previous cancelled (called after that transaction committed)."""
    for execution_id, outcome in cancelled:
        loaded = load_execution(execution_id)
        if loaded is not None:
            report = stop_external_run(loaded[0], loaded[1], outcome)
            logger.info("execution %s cancelled by the next run: %s", execution_id, report.external_run)


def execution_resume(*, execution_id: int, attempt: int, worker_id: str) -> str:
    """Handle a ``poll_execution`` message: lease the RUNNING execution, then poll its external
    run, or, if its worker died before a run id was recorded, start it again with the same
    idempotency key (the runner adopts an existing run instead of launching a second one)."""
    conf = tms_settings()
    claim_ns = tracing.now_ns() if tracing.ON else 0
    if not transitions.execution_acquire(
        execution_id=execution_id, attempt=attempt, worker_id=worker_id, lease_seconds=conf.WORKER_TIMEOUT
    ):
        return "lost"
    loaded = load_execution(execution_id)
    if loaded is None:
        return "lost"
    execution, task = loaded
    if claim_ns:
        traces.claimed(execution, start_ns=claim_ns, worker_id=worker_id, resumed=True)
    if task.has_limits:
        wait = _limits_on_resume(execution, task)
        if wait is not None:
            # It starts again, and its named limits have no room: it waits, RUNNING without a
            # lease, like a launch over the runner's rate, until a poll message resumes it.
            logger.info("execution %s: resumed; named limits full, start deferred %.1fs", execution_id, wait)
            released = persist(
                lambda: transitions.execution_release(
                    execution_id=execution_id, attempt=attempt, worker_id=worker_id, poll_in=wait
                )
            )
            return "deferred" if released else "lost"
    with _working_on(execution, task, worker_id):
        logger.info("execution %s attempt %s: leased; resuming", execution_id, attempt)
        return _resume(execution, task, worker_id)


def _limits_on_resume(execution: Execution, task: Task) -> float | None:
    """Named-limit slots of a leased RUNNING execution: kept (taken again if they lapsed) while
    its external run goes on; taken anew, behind the runs waiting for them, if it must start
    again (its worker died before the run id was recorded). None, or the seconds to wait."""
    seconds = tms_settings().WORKER_TIMEOUT
    ids = {"execution_id": execution.pk, "task_id": task.pk, "runner": task.runner, "config": task.config}
    if execution.external_run_id:
        limits.limits_retake(**ids, seconds=seconds)
        return None
    return limits.limits_take_again(**ids, seconds=seconds)


def _resume(execution: Execution, task: Task, worker_id: str) -> str:
    if not execution.external_run_id:
        # Its worker died before a run id was recorded. Start again with the same idempotency
        # key (the runner adopts a run it already launched), unless this keeps happening.
        if execution.handbacks > tms_settings().MAX_HANDBACKS:
            error = f"worker lost {execution.handbacks} times before the run started; giving up on this attempt"
            return execution_record_outcome(
                execution=execution, task=task, worker_id=worker_id, result=RunResult.failed(error)
            )
        return _start(execution, task, worker_id, resend=True)
    run = traces.trace_of(execution) if tracing.ON else None
    try:
        runner = get_runner(task.runner)
        spec = run_spec(execution, task, handed_on=_unsampled_context(run))
        handle = RunHandle(execution.external_run_id, execution.run_handle)
    except Exception as exc:  # noqa: BLE001 - a bad config or a lost runner must end the attempt, not loop
        return execution_record_outcome(
            execution=execution,
            task=task,
            worker_id=worker_id,
            result=RunResult.failed(describe_error(exc), retryable=False),
        )
    if run is not None:
        result = _traced_call("tms.runner.poll", run, execution, task, runner.poll, spec, handle)
    else:
        result = _call(runner.poll, spec, handle, transient_is_running=True)
    if result.state is RunState.RUNNING:
        elapsed = (db_now() - execution.started_at) if execution.started_at else timedelta(0)
        if elapsed > task.timeout:
            _call(runner.cancel, spec, handle)
            result = RunResult.failed(f"timed out after {task.timeout.total_seconds():g}s; external run cancelled")
        else:
            delay = exponential_backoff(attempt=execution.poll_count, base=POLL_BASE, factor=POLL_FACTOR, cap=POLL_CAP)
            if result.poll_at is not None:
                delay = _poll_in_at(execution, task, result.poll_at)
            persist(
                lambda: transitions.execution_release(
                    execution_id=execution.pk, attempt=execution.attempt, worker_id=worker_id, poll_in=delay
                )
            )
            _keep_slots_until_poll(execution, task, delay)
            return "polling"
    return execution_record_outcome(
        execution=execution, task=task, worker_id=worker_id, result=result, external_run_id=handle.external_run_id
    )


def _start(
    execution: Execution,
    task: Task,
    worker_id: str,
    *,
    resend: bool = False,
    record: Callable[..., str] = execution_record_outcome,
) -> str:
    """Launch the leased RUNNING execution's external run and record what came of it."""
    run = traces.trace_of(execution) if tracing.ON else None
    try:
        runner: BaseRunner = get_runner(task.runner)
        spec = run_spec(execution, task, starting=True, resend=resend, handed_on=_unsampled_context(run))
    except Exception as exc:  # noqa: BLE001 - as in _resume
        return execution_record_outcome(
            execution=execution,
            task=task,
            worker_id=worker_id,
            result=RunResult.failed(describe_error(exc), retryable=False),
        )
    deferred = _defer_over_send_rate(execution, task, runner, worker_id)
    if deferred is not None:
        return deferred
    try:
        if run is not None:
            with tracing.run_span("tms.runner.start", run, _span_ids(execution, task, run)) as span:
                handle = runner.start(_in_trace(spec, run))
                if handle.external_run_id:
                    span.set_attribute("tms.external_run_id", handle.external_run_id)
        else:
            handle = runner.start(spec)
    except RunnerError as exc:
        return execution_record_outcome(
            execution=execution,
            task=task,
            worker_id=worker_id,
            result=RunResult.failed(str(exc), retryable=exc.retryable),
        )
    except Exception as exc:
        logger.exception("runner %s crashed starting execution %s", task.runner, execution.pk)
        return execution_record_outcome(
            execution=execution, task=task, worker_id=worker_id, result=RunResult.failed(describe_error(exc))
        )
    if handle.result is not None:
        return record(
            execution=execution,
            task=task,
            worker_id=worker_id,
            result=handle.result,
            external_run_id=handle.external_run_id,
        )
    # Asynchronous run: store its id before anything waits on it, then let the monitor poll it.
    return _record_async_run(execution, task, runner, spec, handle, worker_id)


def _defer_over_send_rate(execution: Execution, task: Task, runner: BaseRunner, worker_id: str) -> str | None:
    """Defer the launch when it is over the runner's send rate: ``deferred`` or ``lost``, else None."""
    rate = runner.launch_rate()
    if rate is None:
        return None
    # The runner's send rate, per team across every worker: counted in PostgreSQL (runners never
    # touch the database). Over it, the launch waits, still RUNNING without a run id and without a
    # lease, until a poll message resumes it (_resume starts it again): no attempt is used up and
    # no worker is held.
    wait = rate_take(team_id=task.team_id, kind=f"send:{task.runner}", limit=rate[0], window=rate[1])
    if not wait:
        return None
    logger.info(
        "execution %s: runner %s allows %s launches per %gs per team; deferred %.1fs",
        execution.pk,
        task.runner,
        rate[0],
        rate[1],
        wait,
    )
    released = persist(
        lambda: transitions.execution_release(
            execution_id=execution.pk, attempt=execution.attempt, worker_id=worker_id, poll_in=wait
        )
    )
    if released:
        _keep_slots_until_poll(execution, task, wait)
    return "deferred" if released else "lost"


def _record_async_run(
    execution: Execution, task: Task, runner: BaseRunner, spec: RunSpec, handle: RunHandle, worker_id: str
) -> str:
    """Store an asynchronous run's id and hand it to the monitor's polls: ``polling`` or ``lost``."""
    poll_in = POLL_BASE if handle.poll_at is None else _poll_in_at(execution, task, handle.poll_at)
    recorded = persist(
        lambda: transitions.execution_record_run(
            execution_id=execution.pk,
            attempt=execution.attempt,
            worker_id=worker_id,
            external_run_id=handle.external_run_id,
            run_handle=handle.data,
            poll_in=poll_in,
        )
    )
    if not recorded:
        logger.warning("execution %s: lease lost before the run id was recorded; cancelling run", execution.pk)
        _call(runner.cancel, spec, handle)
        return "lost"
    _keep_slots_until_poll(execution, task, poll_in)
    return "polling"


#: A poll a runner asked for past the attempt's timeout comes this long after it instead, so that
#: the poll finds the timeout passed (:func:`_resume` ends the attempt there).
TIMEOUT_POLL_MARGIN = 1.0


def _poll_in_at(execution: Execution, task: Task, poll_at: float) -> float:
    """Seconds until the poll a runner asked for at ``poll_at`` (epoch seconds; at once if it is
    past), never later than just after the attempt's timeout."""
    delay = max(0.0, poll_at - time.time())
    if execution.started_at is not None:
        left = (execution.started_at + task.timeout - db_now()).total_seconds()
        delay = min(delay, max(left, 0.0) + TIMEOUT_POLL_MARGIN)
    return delay


def _keep_slots_until_poll(execution: Execution, task: Task, poll_in: float) -> None:
    """An asynchronous run keeps its named-limit slots while no worker holds it: until its next
    poll is due plus one lease (the poll's worker renews them; if none comes, they lapse)."""
    if task.has_limits:
        persist(
            lambda: limits.limits_extend_slots(
                execution_id=execution.pk, seconds=poll_in + tms_settings().WORKER_TIMEOUT
            )
        )


def _span_ids(execution: Execution, task: Task, run: tracing.RunTrace) -> dict[str, Any] | None:
    """A runner call's span attributes; None for an unsampled run, which makes no span."""
    if not run.sampled:
        return None
    return {
        "tms.execution_id": execution.pk,
        "tms.attempt": execution.attempt,
        "tms.runner": task.runner,
        "tms.process": os.getpid(),
    }


def _unsampled_context(run: tracing.RunTrace | None) -> tuple[str, str]:
    """The trace context an unsampled run hands its external run (its root's, flagged
    unsampled), known before its runner call, so that its spec is built with it; a sampled run's
    is its call's span's, known inside it (:func:`_in_trace`)."""
    return tracing.handed_on(run) if run is not None and not run.sampled else ("", "")


def _in_trace(spec: RunSpec, run: tracing.RunTrace) -> RunSpec:
    """``spec`` with the trace context of ``run``'s runner call (inside its span): handed on. An
    unsampled run's spec already has it: copying a spec (``dataclasses.replace``) on every launch
    was 4 % of a pool process's samples in a herd with tracing on (docs/operations.md)."""
    if not run.sampled:
        return spec
    traceparent, tracestate = tracing.handed_on(run)
    return replace(spec, traceparent=traceparent, tracestate=tracestate)


def _traced_call(
    name: str,
    run: tracing.RunTrace,
    execution: Execution,
    task: Task,
    method: Callable[..., RunResult | None],
    spec: RunSpec,
    handle: RunHandle,
) -> RunResult:
    """:func:`_call` of a poll in a span of the run (its trace context given to the runner)."""
    ids = _span_ids(execution, task, run)
    attributes = None if ids is None else {**ids, "tms.poll": execution.poll_count + 1}
    with tracing.run_span(name, run, attributes) as span:
        result = _call(method, _in_trace(spec, run), handle, transient_is_running=True)
        span.set_attribute("tms.result", result.state.value)
    return result


def _call(method: Callable[..., RunResult | None], *args: Any, transient_is_running: bool = False) -> RunResult:
    """Call a runner method; its exceptions become a failed result. For polls, a retryable
    error means "could not ask now": the run is still considered running (the timeout bounds it)."""
    try:
        result = method(*args)
    except RunnerError as exc:
        if transient_is_running and exc.retryable:
            logger.warning("poll failed, will ask again: %s", exc)
            return RunResult.running()
        return RunResult.failed(str(exc), retryable=exc.retryable)
    except Exception as exc:
        logger.exception("runner call %s failed", getattr(method, "__qualname__", method))
        return RunResult.failed(describe_error(exc))
    return result if isinstance(result, RunResult) else RunResult.running()
