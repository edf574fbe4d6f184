"""Property-based test of the transitions: random interleavings of monitor takes, claims,
duplicate deliveries, heartbeats, lease expiry, hand-backs, stale writes and cancels never
break the design's invariants.

A model of the execution predicts, for every call, whether the conditional write must win;
after every step the row, the model and the event trail must agree.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from executions import transitions
from executions.models import TERMINAL_STATUSES, Execution
from executions.models import ExecutionStatus as S
from tests.factories import TaskFactory

WORKERS = ("w1:1:1", "w2:2:2", "w3:3:3")
MAX = 1000

workers = st.sampled_from(WORKERS)
#: The attempt a message or a worker believes in: the current one, or a stale/future one.
attempt_offsets = st.sampled_from([0, 0, 0, -1, 1])


@dataclass
class Model:
    status: str = S.SCHEDULED
    attempt: int = 1
    owner: str = ""
    lease_expired: bool = False
    due: bool = True
    poll_due: bool = False
    terminal_events: int = 0


class TransitionMachine(RuleBasedStateMachine):
    @initialize()
    def create(self) -> None:
        # A misfire grace longer than any lateness here: the misfire policy is not modelled.
        task = TaskFactory(misfire_grace=timedelta(days=30))
        (self.id,) = transitions.executions_create(
            rows=[transitions.NewExecution(task.pk, timezone.now(), 5)], actor="test"
        )
        self.model = Model()
        self.history: list[str] = [S.SCHEDULED]
        self.max_attempt_seen = 1

    # -- helpers ----------------------------------------------------------------------------

    def row(self) -> Execution:
        return Execution.objects.get(pk=self.id)

    def _ours(self, dispatches: list[transitions.Dispatch]) -> bool:
        return any(d.execution_id == self.id for d in dispatches)

    def _holds(self, worker: str, attempt: int) -> bool:
        m = self.model
        return m.status == S.RUNNING and m.attempt == attempt and m.owner == worker

    def _terminal(self, status: str) -> None:
        self.model.status = status
        self.model.owner = ""
        self.model.terminal_events += 1

    # -- monitor ----------------------------------------------------------------------------

    @rule()
    def monitor_takes_due(self) -> None:
        with transaction.atomic():
            taken = self._ours(transitions.executions_take_due(limit=1000, actor="monitor"))
        expected = self.model.status == S.SCHEDULED and self.model.due
        assert taken == expected
        if taken:
            self.model.status = S.PENDING

    @rule()
    def monitor_takes_polls(self) -> None:
        with transaction.atomic():
            taken = self._ours(transitions.executions_take_polls(limit=1000, in_flight_for=3600, actor="monitor"))
        m = self.model
        expected = m.status == S.RUNNING and ((m.owner == "" and m.poll_due) or (m.owner != "" and m.lease_expired))
        assert taken == expected
        if taken:
            m.owner, m.lease_expired, m.poll_due = "", False, False

    # -- workers ----------------------------------------------------------------------------

    @rule(worker=workers, offset=attempt_offsets)
    def claim(self, worker: str, offset: int) -> None:
        """Also models duplicate and stale deliveries of the run message."""
        attempt = self.model.attempt + offset
        claimed = transitions.execution_claim_loaded(
            execution_id=self.id, attempt=attempt, worker_id=worker, lease_seconds=60
        )
        won = claimed is not None
        assert won == (self.model.status == S.PENDING and offset == 0)
        if won:
            self.model.status, self.model.owner, self.model.lease_expired = S.RUNNING, worker, False

    @rule(worker=workers, offset=attempt_offsets)
    def acquire(self, worker: str, offset: int) -> None:
        attempt = self.model.attempt + offset
        won = transitions.execution_acquire(execution_id=self.id, attempt=attempt, worker_id=worker, lease_seconds=60)
        assert won == (self.model.status == S.RUNNING and self.model.owner == "" and offset == 0)
        if won:
            self.model.owner, self.model.lease_expired = worker, False

    @rule(worker=workers, offset=attempt_offsets)
    def heartbeat(self, worker: str, offset: int) -> None:
        attempt = self.model.attempt + offset
        won = transitions.execution_extend_lease(
            execution_id=self.id, attempt=attempt, worker_id=worker, lease_seconds=60
        )
        assert won == self._holds(worker, attempt)
        if won:
            self.model.lease_expired = False

    @rule()
    def time_passes_lease_expires(self) -> None:
        """The holder stops heartbeating (killed or paused) and its lease runs out."""
        Execution.objects.filter(pk=self.id, lease_expires_at__isnull=False).update(
            lease_expires_at=Now() - timedelta(days=1)
        )
        if self.model.status == S.RUNNING and self.model.owner:
            self.model.lease_expired = True

    @rule(worker=workers, offset=attempt_offsets)
    def record_async_run(self, worker: str, offset: int) -> None:
        attempt = self.model.attempt + offset
        won = transitions.execution_record_run(
            execution_id=self.id, attempt=attempt, worker_id=worker, external_run_id="run", run_handle={}, poll_in=0
        )
        assert won == self._holds(worker, attempt)
        if won:
            self.model.owner, self.model.lease_expired, self.model.poll_due = "", False, True

    @rule(worker=workers, offset=attempt_offsets)
    def succeed(self, worker: str, offset: int) -> None:
        attempt = self.model.attempt + offset
        holds = self._holds(worker, attempt)
        won = transitions.execution_succeed(
            execution_id=self.id, attempt=attempt, worker_id=worker, output="ok", max_chars=MAX
        )
        assert won == holds
        if won:
            self._terminal(S.SUCCEEDED)

    @rule(worker=workers, offset=attempt_offsets, retry=st.booleans())
    def fail(self, worker: str, offset: int, retry: bool) -> None:
        attempt = self.model.attempt + offset
        holds = self._holds(worker, attempt)
        outcome = transitions.execution_fail(
            execution_id=self.id,
            attempt=attempt,
            worker_id=worker,
            error="boom",
            output="",
            retry_in=0 if retry else None,
            max_chars=MAX,
        )
        if not holds:
            assert outcome is None
            return
        if retry:
            assert outcome == S.SCHEDULED
            m = self.model
            m.status, m.attempt, m.owner, m.due, m.poll_due, m.lease_expired = (
                S.SCHEDULED,
                attempt + 1,
                "",
                True,
                False,
                False,
            )
        else:
            assert outcome == S.FAILED
            self._terminal(S.FAILED)

    # -- users ------------------------------------------------------------------------------

    @rule()
    def cancel(self) -> None:
        outcome = transitions.execution_cancel(execution_id=self.id, actor="user")
        assert outcome.won == (self.model.status not in TERMINAL_STATUSES)
        if outcome.won:
            self._terminal(S.CANCELLED)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def row_matches_model(self) -> None:
        row = self.row()
        assert (row.status, row.attempt, row.lease_owner) == (self.model.status, self.model.attempt, self.model.owner)

    @invariant()
    def terminal_is_final_and_attempts_only_grow(self) -> None:
        row = self.row()
        if self.history[-1] in TERMINAL_STATUSES:
            assert row.status == self.history[-1]
        assert row.attempt >= self.max_attempt_seen
        self.max_attempt_seen = row.attempt
        self.history.append(row.status)

    @invariant()
    def event_trail_is_a_chain(self) -> None:
        events = list(self.row().events.order_by("id").values_list("from_status", "to_status", "attempt"))
        assert events[0][:2] == ("", S.SCHEDULED)
        for (_, before, attempt_before), (after_from, _, attempt_after) in itertools.pairwise(events):
            assert after_from == before
            assert attempt_after >= attempt_before
        assert events[-1][1] == self.model.status
        terminal = sum(1 for _, to, _ in events if to in TERMINAL_STATUSES)
        assert terminal == self.model.terminal_events <= 1

    def teardown(self) -> None:
        # Leave nothing takeable behind for the next example's monitor rules.
        if hasattr(self, "id"):
            transitions.execution_cancel(execution_id=self.id, actor="teardown")


@pytest.mark.django_db
def test_random_interleavings_keep_the_invariants():
    run_state_machine_as_test(
        TransitionMachine, settings=settings(max_examples=150, stateful_step_count=40, deadline=None)
    )
