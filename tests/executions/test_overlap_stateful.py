"""Property-based test of several executions of one task: occurrences materialised (and again
after being superseded), triggered and retried runs, monitor takes, fast and exclusive claims
under the task's overlap policy, worker outcomes, lease expiry, hand-backs and cancels.

A model of every execution of the task predicts the outcome of each call (win or lose; for an
exclusive claim: claimed, skipped, queued or lost, and which running siblings it cancels); after
every step the rows, the model and the event trails must agree, and the overlap policy must hold.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from hypothesis.stateful import run_state_machine_as_test as run_machine

from executions import transitions
from executions.models import TERMINAL_STATUSES, Execution, ExecutionEvent, ExecutionOrigin, SkippedOccurrence
from executions.models import ExecutionStatus as S
from tasks_api.replan import _supersede
from tasks_app.models import OverlapPolicy
from tests.factories import TaskFactory

WORKERS = ("w1:1:1", "w2:2:2", "w3:3:3")
MAX = 1000
#: Occurrences of the task's schedule the machine may materialise (and materialise again).
OCCURRENCES = 3
#: New executions are created only while fewer than this many are active (not terminal): a few
#: at a time is enough to overlap, and keeps the workers' picks on the ones that matter.
ACTIVE_CAP = 3

workers = st.sampled_from(WORKERS)
#: The attempt a message or a worker believes in: the current one, or a stale/future one.
attempt_offsets = st.sampled_from([0, 0, 0, -1, 1])
#: What a supersede may leave: a schedule edit (SCHEDULED | PENDING) or a pause (SCHEDULED).
supersede_sources = st.sampled_from([frozenset({S.SCHEDULED, S.PENDING}), frozenset({S.SCHEDULED})])


@dataclass
class ExecutionModel:
    """What one execution of the task must look like."""

    scheduled_for: datetime
    origin: str
    exclusive: bool
    attempt: int = 1
    retry_of: int | None = None
    status: str = S.SCHEDULED
    owner: str = ""
    #: SCHEDULED and its due time has come (a queued execution waits a little first).
    due: bool = True
    lease_expired: bool = False
    poll_due: bool = False
    #: Claimed at least once (``started_at`` is set): it can no longer be superseded.
    started: bool = False
    superseded: bool = False
    #: Retried once through ``execution_retry``: a second retry must lose.
    retried: bool = False
    terminal_events: int = 0
    #: The last worker that held a lease on it, and on which attempt (for stale writes).
    last_holder: tuple[str, int] | None = None
    first_attempt: int = field(init=False)

    def __post_init__(self) -> None:
        self.first_attempt = self.attempt

    def holds(self, worker: str, attempt: int) -> bool:
        return self.status == S.RUNNING and self.attempt == attempt and self.owner == worker

    def end(self, status: str) -> None:
        self.status, self.owner, self.lease_expired, self.poll_due = status, "", False, False
        self.terminal_events += 1


class OverlapMachine(RuleBasedStateMachine):
    """Several executions of one task, under one overlap policy per test (:func:`machine_for`).

    Executions come from materialising one of :data:`OCCURRENCES` fixed past instants (all three
    at the start; again later only while no non-superseded row holds the instant), from
    ``execution_trigger`` (due now, origin trigger) and from ``execution_retry`` (of a FAILED or
    CANCELLED execution only, once each; attempt + 1, ``retry_of`` set). At most
    :data:`ACTIVE_CAP` are active at once.

    The monitor takes due SCHEDULED rows (a run message each) and RUNNING rows whose poll is due
    or whose lease expired (a hand-back, and a poll message). Messages stay queued when
    redelivered, so workers also get duplicate and stale ones. A run message is handled as
    ``worker_services.execution_run`` does: the fast claim (which must lose on exclusive rows),
    then ``execution_claim_exclusive``, whose outcome the model derives from its docstring:
    with no RUNNING sibling, claimed; otherwise ``skip``: skipped (CANCELLED, recorded as a
    skipped occurrence); ``queue_one``: queued (back to SCHEDULED, due shortly) unless an older
    exclusive sibling is SCHEDULED or PENDING, then skipped; ``cancel_previous``: every RUNNING
    sibling cancelled, then claimed. A poll message leases a RUNNING execution nobody holds.

    Workers then write, fenced by lease and attempt: succeeded, failed (retry in place or
    final), asynchronous run started (lease released, poll due). Writers are the holder, the
    last holder (stale once it was cancelled or handed back) or any worker on a shifted attempt.
    Users cancel; schedule edits (SCHEDULED | PENDING) and pauses (SCHEDULED) supersede
    never-started occurrences, through ``tasks_api.replan._supersede`` or the transition on
    one execution. Time passes: queued executions come due, silent workers' leases run out.
    """

    #: The task's overlap policy: set by the subclass each test runs (see :func:`machine_for`).
    policy: str = OverlapPolicy.ALLOW

    @initialize()
    def create_task(self) -> None:
        """A task with the policy, its occurrences materialised (all due: their time has come)."""
        self.exclusive = self.policy != OverlapPolicy.ALLOW
        # A misfire grace longer than any lateness here: this machine models the overlap policy
        # (test_misfire_outage covers the misfire policy at dispatch and claim).
        self.task = TaskFactory(overlap_policy=self.policy, misfire_grace=timedelta(days=30))
        now = timezone.now()
        self.instants = [now - timedelta(seconds=10 * (OCCURRENCES - k)) for k in range(OCCURRENCES)]
        self.model: dict[int, ExecutionModel] = {}
        #: Skipped occurrences recorded by the overlap policy: instant -> the execution skipped.
        self.skipped: dict[datetime, int] = {}
        #: (status, attempt) of every row at the previous step.
        self.seen: dict[int, tuple[str, int]] = {}
        #: Messages published and not yet acknowledged: (execution id, attempt).
        self.runs: list[tuple[int, int]] = []
        self.polls: list[tuple[int, int]] = []
        rows = [
            transitions.NewExecution(self.task.pk, when, self.task.priority, exclusive=self.exclusive)
            for when in self.instants
        ]
        ids = transitions.executions_create(rows=rows, actor="materialiser")
        assert len(ids) == OCCURRENCES
        for new_id, when in zip(ids, self.instants, strict=True):
            self._add(new_id, ExecutionModel(when, ExecutionOrigin.SCHEDULE, self.exclusive))

    # -- helpers ----------------------------------------------------------------------------

    def _room(self) -> bool:
        return sum(e.status not in TERMINAL_STATUSES for e in self.model.values()) < ACTIVE_CAP

    def _add(self, new_id: int, entry: ExecutionModel) -> None:
        assert new_id not in self.model
        self.model[new_id] = entry

    def _pick(self, data: st.DataObject, among: str) -> int:
        """An execution: ``active`` ones (not terminal) if any, ``retryable`` ones (FAILED or
        CANCELLED) if any, or ``any``. Ids in creation order, so draws replay the same way."""
        wanted = {
            "active": lambda e: e.status not in TERMINAL_STATUSES,
            "retryable": lambda e: e.status in transitions.RETRYABLE_STATUSES,
            "any": lambda e: True,
        }[among]
        candidates = sorted(i for i, e in self.model.items() if wanted(e)) or sorted(self.model)
        return data.draw(st.sampled_from(candidates), label="execution")

    def _ours(self, dispatches: list[transitions.Dispatch]) -> set[int]:
        return {d.execution_id for d in dispatches} & self.model.keys()

    def _claimed(self, entry: ExecutionModel, worker: str) -> None:
        entry.status, entry.owner, entry.started, entry.last_holder = S.RUNNING, worker, True, (worker, entry.attempt)
        entry.lease_expired = entry.poll_due = False

    def _predict_exclusive(self, execution: int, attempt: int) -> tuple[str, list[int]]:
        """The outcome of an exclusive claim per its docstring, and the siblings it cancels."""
        entry = self.model[execution]
        if not (entry.status == S.PENDING and entry.attempt == attempt and entry.exclusive):
            return "lost", []
        others = {i: e for i, e in self.model.items() if i != execution}
        running = sorted(i for i, e in others.items() if e.status == S.RUNNING)
        if not running or self.policy == OverlapPolicy.ALLOW:
            return "claimed", []
        if self.policy == OverlapPolicy.CANCEL_PREVIOUS:
            return "claimed", running
        mine = (entry.scheduled_for, execution)
        waiting = [
            i
            for i, e in others.items()
            if e.status in (S.SCHEDULED, S.PENDING) and e.exclusive and (e.scheduled_for, i) < mine
        ]
        if self.policy == OverlapPolicy.QUEUE_ONE and not waiting:
            return "queued", []
        return "skipped", []

    def _time_passes(self) -> None:
        Execution.objects.filter(task=self.task, status=S.SCHEDULED).update(due_at=Now() - timedelta(days=1))
        Execution.objects.filter(task=self.task, lease_expires_at__isnull=False).update(
            lease_expires_at=Now() - timedelta(days=1)
        )
        for entry in self.model.values():
            entry.due = True
            if entry.status == S.RUNNING and entry.owner:
                entry.lease_expired = True

    # -- creation ---------------------------------------------------------------------------

    @precondition(_room)
    @rule(origin=st.sampled_from(["schedule", "trigger"]), k=st.integers(0, OCCURRENCES - 1))
    def create(self, origin: str, k: int) -> None:
        """Materialise occurrence ``k`` (refused while a non-superseded row holds its instant), or
        trigger a run now (always created, later than every other execution)."""
        if origin == "trigger":
            new_id = transitions.execution_trigger(task_id=self.task.pk, actor="user")
            assert new_id is not None
            when = Execution.objects.values_list("scheduled_for", flat=True).get(pk=new_id)
            assert all(when > e.scheduled_for for e in self.model.values())
            self._add(new_id, ExecutionModel(when, ExecutionOrigin.TRIGGER, self.exclusive))
            return
        when = self.instants[k]
        held = any(e.scheduled_for == when and not e.superseded for e in self.model.values())
        ids = transitions.executions_create(
            rows=[transitions.NewExecution(self.task.pk, when, self.task.priority, exclusive=self.exclusive)],
            actor="materialiser",
        )
        assert len(ids) == (0 if held else 1)
        if ids:
            self._add(ids[0], ExecutionModel(when, ExecutionOrigin.SCHEDULE, self.exclusive))

    @precondition(_room)
    @rule(data=st.data(), among=st.sampled_from(["retryable", "any"]))
    def retry(self, data: st.DataObject, among: str) -> None:
        """Run an execution again: only a FAILED or CANCELLED one, and only once."""
        old = self._pick(data, among)
        entry = self.model[old]
        expected = entry.status in transitions.RETRYABLE_STATUSES and not entry.retried
        new_id = transitions.execution_retry(execution_id=old, actor="user")
        assert (new_id is not None) == expected
        if new_id is None:
            return
        entry.retried = True
        when = Execution.objects.values_list("scheduled_for", flat=True).get(pk=new_id)
        new = ExecutionModel(when, ExecutionOrigin.RETRY, self.exclusive, attempt=entry.attempt + 1, retry_of=old)
        self._add(new_id, new)

    # -- monitor ----------------------------------------------------------------------------

    @precondition(lambda self: any(e.status in (S.SCHEDULED, S.RUNNING) for e in self.model.values()))
    @rule(later=st.booleans())
    def monitor_cycle(self, later: bool) -> None:
        """One pass of the monitor: take the due SCHEDULED rows, then the RUNNING rows whose poll
        is due or whose lease expired (handed back); each taken row becomes a message. With
        ``later``, time passes first: queued executions come due again, and the leases of
        workers that stopped heartbeating run out."""
        if later:
            self._time_passes()
        with transaction.atomic():
            dispatches = transitions.executions_take_due(limit=1000, actor="monitor")
        taken = self._ours(dispatches)
        assert taken == {i for i, e in self.model.items() if e.status == S.SCHEDULED and e.due}
        # Messages in id order: the draws that pick them must not depend on the order of rows
        # whose due times tie.
        for d in sorted(dispatches, key=lambda d: d.execution_id):
            if d.execution_id in taken:
                assert d.attempt == self.model[d.execution_id].attempt
                self.model[d.execution_id].status = S.PENDING
                self.runs.append((d.execution_id, d.attempt))
        with transaction.atomic():
            taken = self._ours(transitions.executions_take_polls(limit=1000, in_flight_for=3600, actor="monitor"))
        expected = {
            i
            for i, e in self.model.items()
            if e.status == S.RUNNING and ((e.owner == "" and e.poll_due) or (e.owner != "" and e.lease_expired))
        }
        assert taken == expected
        for i in sorted(taken):
            entry = self.model[i]
            entry.owner, entry.lease_expired, entry.poll_due = "", False, False
            self.polls.append((i, entry.attempt))

    # -- workers ----------------------------------------------------------------------------

    @precondition(lambda self: self.runs)
    @rule(data=st.data(), worker=workers, redeliver=st.booleans())
    def deliver_run_message(self, data: st.DataObject, worker: str, redeliver: bool) -> None:
        """A worker gets a run message, as ``worker_services.execution_run`` handles it: the fast
        claim first (it loses on exclusive rows), then the exclusive claim under the overlap
        policy. With ``redeliver`` the message stays queued: a duplicate or stale delivery."""
        execution, attempt = data.draw(st.sampled_from(self.runs), label="message")
        if not redeliver:
            self.runs.remove((execution, attempt))
        entry = self.model[execution]
        fast = entry.status == S.PENDING and entry.attempt == attempt and not entry.exclusive
        claimed = transitions.execution_claim_loaded(
            execution_id=execution, attempt=attempt, worker_id=worker, lease_seconds=60
        )
        won = claimed is not None
        assert won == fast
        if won:
            self._claimed(entry, worker)
            return
        outcome, cancels = self._predict_exclusive(execution, attempt)
        claim = transitions.execution_claim_exclusive(
            execution_id=execution, attempt=attempt, worker_id=worker, lease_seconds=60
        )
        assert claim.outcome == outcome
        assert [i for i, _ in claim.cancelled] == cancels
        assert all(c.won and c.from_status == S.RUNNING for _, c in claim.cancelled)
        assert (claim.execution.pk if claim.execution else None) == (execution if outcome == "claimed" else None)
        for i in cancels:
            self.model[i].end(S.CANCELLED)
        if outcome == "claimed":
            self._claimed(entry, worker)
        elif outcome == "queued":
            entry.status, entry.due = S.SCHEDULED, False
        elif outcome == "skipped":
            entry.end(S.CANCELLED)
            self.skipped.setdefault(entry.scheduled_for, execution)

    @precondition(lambda self: self.polls)
    @rule(data=st.data(), worker=workers, redeliver=st.booleans())
    def deliver_poll_message(self, data: st.DataObject, worker: str, redeliver: bool) -> None:
        """A poll message: the worker leases the RUNNING execution if nobody holds it (a due poll,
        or a hand-back it resumes)."""
        execution, attempt = data.draw(st.sampled_from(self.polls), label="poll")
        if not redeliver:
            self.polls.remove((execution, attempt))
        entry = self.model[execution]
        won = transitions.execution_acquire(execution_id=execution, attempt=attempt, worker_id=worker, lease_seconds=60)
        assert won == (entry.status == S.RUNNING and entry.owner == "" and entry.attempt == attempt)
        if won:
            entry.owner, entry.lease_expired, entry.last_holder = worker, False, (worker, attempt)

    @precondition(lambda self: any(e.last_holder for e in self.model.values()))
    @rule(
        data=st.data(),
        writer=st.sampled_from(["holder", "last holder", "other"]),
        worker=workers,
        offset=attempt_offsets,
        report=st.sampled_from(["succeeded", "failed, retry", "failed, retry", "failed", "async run started"]),
    )
    def worker_reports(self, data: st.DataObject, writer: str, worker: str, offset: int, report: str) -> None:
        """A worker's fenced write on an execution that was claimed: the run succeeded, failed
        (retried or final), or started asynchronously (the lease is released until its poll is
        due). The writer is the worker holding a lease now (if any), the last worker that held
        one (stale once it was cancelled, handed back, or lost its lease), or ``worker`` on the
        attempt shifted by ``offset``. Only the holder, on its attempt, wins."""
        held = sorted(i for i, e in self.model.items() if e.status == S.RUNNING and e.owner)
        if writer == "holder" and held:
            execution = data.draw(st.sampled_from(held), label="held")
        else:
            execution = data.draw(st.sampled_from(sorted(i for i, e in self.model.items() if e.last_holder)))
        entry = self.model[execution]
        if writer == "other":
            attempt = entry.attempt + offset
        else:
            assert entry.last_holder is not None
            worker, attempt = entry.last_holder
        holds = entry.holds(worker, attempt)
        fenced = {"execution_id": execution, "attempt": attempt, "worker_id": worker}
        if report == "succeeded":
            assert transitions.execution_succeed(**fenced, output="ok", max_chars=MAX) == holds
            if holds:
                entry.end(S.SUCCEEDED)
        elif report == "async run started":
            won = transitions.execution_record_run(**fenced, external_run_id="run", run_handle={}, poll_in=0)
            assert won == holds
            if holds:
                entry.owner, entry.lease_expired, entry.poll_due = "", False, True
        else:
            retry = report == "failed, retry"
            outcome = transitions.execution_fail(
                **fenced, error="boom", output="", retry_in=0 if retry else None, max_chars=MAX
            )
            assert outcome == ((S.SCHEDULED if retry else S.FAILED) if holds else None)
            if holds and retry:
                entry.status, entry.attempt, entry.owner, entry.due = S.SCHEDULED, attempt + 1, "", True
                entry.lease_expired = entry.poll_due = False
            elif holds:
                entry.end(S.FAILED)

    # -- users and schedule changes ---------------------------------------------------------

    @rule(
        data=st.data(),
        among=st.sampled_from(["active", "any"]),
        action=st.sampled_from(["cancel", "supersede one", "supersede all"]),
        only_from=supersede_sources,
    )
    def user_acts(self, data: st.DataObject, among: str, action: str, only_from: frozenset[str]) -> None:
        """A user cancels ``execution``; or the task's schedule is edited (superseding what is
        SCHEDULED or PENDING) or the task paused (SCHEDULED): ``supersede all`` is
        ``tasks_api.replan._supersede`` over the task, which supersedes the scheduled
        occurrences that never started (triggered runs and retries stay); ``supersede one`` is
        the transition behind it on ``execution`` alone, whatever its origin."""
        execution = self._pick(data, among)
        entry = self.model[execution]
        if action == "cancel":
            outcome = transitions.execution_cancel(execution_id=execution, actor="user")
            assert outcome.won == (entry.status not in TERMINAL_STATUSES)
            assert outcome.from_status == entry.status
            if outcome.won:
                entry.end(S.CANCELLED)
            return
        if action == "supersede all":
            targets = {
                i
                for i, e in self.model.items()
                if e.origin == ExecutionOrigin.SCHEDULE and e.status in only_from and not e.started
            }
            instants = _supersede(self.task, only_from=only_from, actor="user", reason="replaced")
            assert sorted(instants) == sorted(self.model[i].scheduled_for for i in targets)
        else:
            outcome = transitions.execution_cancel(
                execution_id=execution, actor="user", reason="replaced", only_from=only_from, supersede=True
            )
            assert outcome.won == (entry.status in only_from and not entry.started)
            targets = {execution} if outcome.won else set()
        for i in targets:
            self.model[i].end(S.CANCELLED)
            self.model[i].superseded = True

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def database_agrees_with_the_model(self) -> None:
        """After every step (three queries: the rows, their events, the skipped occurrences)."""
        rows = {
            r[0]: r[1:]
            for r in Execution.objects.filter(task=self.task).values_list(
                "id",
                "status",
                "attempt",
                "lease_owner",
                "superseded",
                "origin",
                "retry_of_id",
                "exclusive",
                "scheduled_for",
            )
        }
        self._check_rows(rows)
        self._check_events()
        skipped = SkippedOccurrence.objects.filter(task=self.task, reason="overlap")
        assert dict(skipped.values_list("scheduled_for", "execution_id")) == self.skipped

    def _check_rows(self, rows: dict[int, tuple]) -> None:
        expected = {
            i: (e.status, e.attempt, e.owner, e.superseded, e.origin, e.retry_of, e.exclusive, e.scheduled_for)
            for i, e in self.model.items()
        }
        assert rows == expected
        for i, (status, attempt, *_) in rows.items():
            # Terminal is final, the attempt only grows.
            before_status, before_attempt = self.seen.get(i, (status, attempt))
            if before_status in TERMINAL_STATUSES:
                assert status == before_status
            assert attempt >= before_attempt
            self.seen[i] = (status, attempt)
        statuses = [status for status, *_ in rows.values()]
        # A superseded row is CANCELLED and leaves its instant: one live row per occurrence.
        assert all(status == S.CANCELLED for status, _, _, superseded, *_ in rows.values() if superseded)
        live = Counter(when for *_, superseded, _, _, _, when in rows.values() if not superseded)
        assert set(live.values()) <= {1}
        retried = Counter(retry_of for *_, retry_of, _, _ in rows.values() if retry_of is not None)
        assert set(retried.values()) <= {1}
        if self.policy != OverlapPolicy.ALLOW:
            assert statuses.count(S.RUNNING) <= 1

    def _check_events(self) -> None:
        """Each trail is a chain from creation to the current status, with non-decreasing
        attempts and at most one terminal event."""
        trails: dict[int, list[tuple[str, str, int]]] = {i: [] for i in self.model}
        for execution_id, *event in (
            ExecutionEvent.objects.filter(execution__task=self.task)
            .order_by("id")
            .values_list("execution_id", "from_status", "to_status", "attempt")
        ):
            trails[execution_id].append(tuple(event))
        for i, events in trails.items():
            entry = self.model[i]
            assert events[0] == ("", S.SCHEDULED, entry.first_attempt)
            for (_, before, attempt_before), (after_from, _, attempt_after) in itertools.pairwise(events):
                assert after_from == before
                assert attempt_after >= attempt_before
            assert events[-1][1:] == (entry.status, entry.attempt)
            terminal = sum(1 for _, to, _ in events if to in TERMINAL_STATUSES)
            assert terminal == entry.terminal_events <= 1

    def teardown(self) -> None:
        # Leave nothing takeable behind for the next example's monitor rules.
        for i, entry in getattr(self, "model", {}).items():
            if entry.status not in TERMINAL_STATUSES:
                transitions.execution_cancel(execution_id=i, actor="teardown")


def machine_for(policy: str) -> type[OverlapMachine]:
    """The machine for tasks with ``policy``: one test per policy gives each its share of examples."""
    return type(f"OverlapMachine_{policy}", (OverlapMachine,), {"policy": policy})


@pytest.mark.django_db
@pytest.mark.parametrize("policy", list(OverlapPolicy))
def test_overlap_trigger_retry_and_supersede_keep_the_invariants(policy: str) -> None:
    # 4 policies x 30 examples x up to 40 steps: about 30 s.
    run_machine(machine_for(policy), settings=settings(max_examples=30, stateful_step_count=40, deadline=None))
