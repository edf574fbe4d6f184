"""The leases of a worker's runs: on its warm shutdown (executions.heartbeat.worker_hand_back), every
run the pool holds once the grace is over is handed back at once, also a run claimed after the
shutdown began (a real child process stands for a prefork pool process of the node: the hand-back
kills it by pid); and the lease keeper (executions.worker_services._LeaseKeeper) keeps extending a
run this process holds again while an extension of its previous hold loses. On the real
PostgreSQL."""

from __future__ import annotations

import subprocess
import threading

import pytest
from django.db import connection
from django.utils import timezone

from executions import transitions
from executions.heartbeat import worker_hand_back
from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.worker_services import _LeaseKeeper
from tests.factories import TaskFactory
from tests.processes import wait_for
from tms_core.conf import tms_settings

pytestmark = pytest.mark.django_db(transaction=True)

NODE = "lease-keeper-node"
GRACE = 0.5


def _pending_run() -> int:
    (pk,) = transitions.executions_create(
        rows=[transitions.NewExecution(TaskFactory().pk, timezone.now(), 5)], actor="test"
    )
    transitions.executions_take_due(limit=100, actor="monitor")
    return pk


class _Shutdown:
    """``worker_hand_back`` in a thread of its own, as the worker's shutdown thread runs it."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.handed: list[int] = []
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.handed.append(worker_hand_back(worker_id=NODE, grace=GRACE, stopped=self.stopped, poll=0.05))
        finally:
            connection.close()  # this thread's own, as the worker's shutdown thread closes it

    def end(self) -> int:
        """The pool has stopped (Celery's worker_shutdown): the hand-back returns its count."""
        self.stopped.set()
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.handed[0]


def test_a_run_claimed_after_the_shutdown_began_is_handed_back_once_the_grace_is_over():
    pk = _pending_run()
    pool = subprocess.Popen(["sleep", "60"])  # the pool process that will hold the run
    try:
        shutdown = _Shutdown()
        # The shutdown began with nothing held; then a pool process claims a run: a message it had
        # been handed as the shutdown began (or the next runs of a message of several). Before the
        # fix the hand-back looked once, at the start, found nothing and returned: this run kept its
        # lease on the stopping worker, and the stop waited for it, for as long as it lasted.
        owner = f"{NODE}:{pool.pid}"
        assert transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id=owner, lease_seconds=60)
        wait_for(lambda: pool.poll() is not None, timeout=10, what="the holding pool process to be stopped")
        assert shutdown.end() == 1
    finally:
        pool.kill()
        pool.wait()
    run = Execution.objects.get(pk=pk)
    # Its lease ended at once (not in 60 s): the monitor's next pass hands it to another worker.
    assert run.status == S.RUNNING and run.lease_owner == owner
    assert run.lease_expires_at <= timezone.now()


def test_a_run_that_ends_within_the_grace_keeps_its_pool_process():
    pk = _pending_run()
    pool = subprocess.Popen(["sleep", "60"])
    try:
        owner = f"{NODE}:{pool.pid}"
        assert transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id=owner, lease_seconds=60)
        shutdown = _Shutdown()
        assert transitions.execution_succeed(execution_id=pk, attempt=1, worker_id=owner, output="done", max_chars=100)
        # The pool stops once its runs have ended, within the grace: nothing is handed back.
        assert shutdown.end() == 0
        assert pool.poll() is None
    finally:
        pool.kill()
        pool.wait()
    assert Execution.objects.get(pk=pk).status == S.SUCCEEDED


def test_a_run_held_past_the_grace_is_handed_back_and_a_later_look_finds_nothing_more():
    pk = _pending_run()
    pool = subprocess.Popen(["sleep", "60"])
    try:
        owner = f"{NODE}:{pool.pid}"
        assert transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id=owner, lease_seconds=60)
        shutdown = _Shutdown()
        wait_for(lambda: pool.poll() is not None, timeout=10, what="the holding pool process to be stopped")
        wait_for(
            lambda: Execution.objects.get(pk=pk).lease_expires_at <= timezone.now(),
            timeout=10,
            what="the lease to be ended",
        )
        # The looks after the hand-back (every poll until the pool stops) find the same run, whose
        # row keeps the dead owner until the monitor hands it on: it is counted (and killed) once.
        assert shutdown.end() == 1
    finally:
        pool.kill()
        pool.wait()


def test_an_extension_that_lost_after_its_hold_ended_leaves_the_next_hold_of_the_run_in_place(monkeypatch):
    """The keeper thread extends the holds it read at the start of its round. One of them ended
    meanwhile (an asynchronous run released its lease for its first poll), so its extension loses;
    before the keeper drops it, this process holds the run again (the poll came, and its lease was
    taken). The keeper dropped the hold by execution id, the new one with it: the new lease was no
    longer extended and expired under the work, which was handed to another worker."""
    pk = _pending_run()
    owner = f"{NODE}:1"
    assert transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id=owner, lease_seconds=60)
    keeper = _LeaseKeeper()
    first, second = threading.Event(), threading.Event()
    # The holds as hold() records them, without the keeper's thread: its round is run by hand.
    keeper._held[pk] = (1, owner, first, False)
    # The run's start recorded its run id and released its lease (poll in 1 s); its hold ended.
    assert transitions.execution_release(execution_id=pk, attempt=1, worker_id=owner, poll_in=1)
    keeper.release(pk)
    extend = transitions.execution_extend_lease

    def extend_then_poll_taken(**kwargs):  # type: ignore[no-untyped-def]
        won = extend(**kwargs)
        # Between the losing extension and the keeper's next step, the poll's message is handled
        # in this process: it leases the run and holds it again.
        assert transitions.execution_acquire(execution_id=pk, attempt=1, worker_id=owner, lease_seconds=1)
        keeper._held[pk] = (1, owner, second, False)
        return won

    monkeypatch.setattr(transitions, "execution_extend_lease", extend_then_poll_taken)
    keeper._extend(tms_settings(), pk, 1, owner, first, False)

    assert first.is_set()  # the ended hold's extension lost: nothing works on it any more
    assert keeper._held.get(pk) == (1, owner, second, False)  # the poll's hold is kept, and extended
    assert not second.is_set()
    monkeypatch.undo()
    before = Execution.objects.get(pk=pk).lease_expires_at
    keeper._extend(tms_settings(), pk, 1, owner, second, False)
    assert Execution.objects.get(pk=pk).lease_expires_at > before
