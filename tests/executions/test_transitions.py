"""Every transition is a conditional UPDATE that reports whether it won; a loser changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from executions import transitions
from executions.models import Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

MAX = 1000


def _execution(status: str = S.SCHEDULED, **fields) -> Execution:
    task = TaskFactory()
    ids = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, timezone.now() - timedelta(seconds=1), task.priority)], actor="test"
    )
    Execution.objects.filter(pk=ids[0]).update(status=status, **fields)
    return Execution.objects.get(pk=ids[0])


def _snapshot(execution: Execution) -> tuple:
    execution.refresh_from_db()
    return (
        execution.status,
        execution.attempt,
        execution.lease_owner,
        execution.output,
        execution.error,
        ExecutionEvent.objects.filter(execution=execution).count(),
    )


def test_create_is_idempotent_on_task_and_occurrence():
    task = TaskFactory()
    when = timezone.now()
    row = transitions.NewExecution(task.pk, when, 5)
    first = transitions.executions_create(rows=[row], actor="test")
    second = transitions.executions_create(rows=[row, row], actor="test")
    assert len(first) == 1
    assert second == []
    assert Execution.objects.filter(task=task).count() == 1
    assert ExecutionEvent.objects.filter(execution_id=first[0]).count() == 1


def test_take_due_moves_due_rows_to_pending_and_records_events():
    due = _execution()
    later = _execution(due_at=timezone.now() + timedelta(hours=1))
    with transaction.atomic():
        taken = transitions.executions_take_due(limit=10, actor="monitor:test")
    assert [d.execution_id for d in taken] == [due.pk]
    due.refresh_from_db()
    later.refresh_from_db()
    assert due.status == S.PENDING and due.enqueued_at is not None
    assert due.message_id == taken[0].message_id
    assert later.status == S.SCHEDULED
    assert list(due.events.values_list("from_status", "to_status")) == [("", S.SCHEDULED), (S.SCHEDULED, S.PENDING)]


def test_untake_returns_unpublished_executions_to_scheduled():
    execution = _execution()
    (taken,) = transitions.executions_take_due(limit=10, actor="monitor:test")
    assert transitions.executions_untake(dispatches=[taken], actor="monitor:test", reason="broker down") == 1
    execution.refresh_from_db()
    assert (execution.status, execution.message_id) == (S.SCHEDULED, "")
    assert list(execution.events.values_list("to_status", flat=True)) == [S.SCHEDULED, S.PENDING, S.SCHEDULED]
    # Taken again later, as if the broker were back.
    assert [d.execution_id for d in transitions.executions_take_due(limit=10, actor="monitor:test")] == [execution.pk]


def test_untake_leaves_an_execution_a_worker_already_claimed():
    execution = _execution()
    (taken,) = transitions.executions_take_due(limit=10, actor="monitor:test")
    assert transitions.execution_claim_loaded(execution_id=execution.pk, attempt=1, worker_id="w:1:1", lease_seconds=30)
    assert transitions.executions_untake(dispatches=[taken], actor="monitor:test", reason="broker down") == 0
    assert Execution.objects.get(pk=execution.pk).status == S.RUNNING


@pytest.mark.parametrize("status", [S.SCHEDULED, S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED])
def test_claim_from_wrong_state_loses_and_changes_nothing(status):
    execution = _execution(status)
    before = _snapshot(execution)
    assert (
        transitions.execution_claim_loaded(execution_id=execution.pk, attempt=1, worker_id="w:1:1", lease_seconds=30)
        is None
    )
    assert _snapshot(execution) == before


def test_claim_wins_once():
    execution = _execution(S.PENDING)
    assert transitions.execution_claim_loaded(execution_id=execution.pk, attempt=1, worker_id="w:1:1", lease_seconds=30)
    assert not transitions.execution_claim_loaded(
        execution_id=execution.pk, attempt=1, worker_id="w:2:2", lease_seconds=30
    )
    execution.refresh_from_db()
    assert execution.status == S.RUNNING and execution.lease_owner == "w:1:1"
    assert execution.lease_expires_at > timezone.now()


def test_claim_with_stale_attempt_loses():
    execution = _execution(S.PENDING, attempt=2)
    assert not transitions.execution_claim_loaded(
        execution_id=execution.pk, attempt=1, worker_id="w:1:1", lease_seconds=30
    )
    assert Execution.objects.get(pk=execution.pk).status == S.PENDING


@pytest.mark.parametrize(
    "fields",
    [
        {"status": S.RUNNING, "lease_owner": "someone-else"},  # lease taken over
        {"status": S.RUNNING, "lease_owner": "w:1:1", "attempt": 2},  # stale attempt
        {"status": S.CANCELLED, "lease_owner": ""},  # cancelled meanwhile
        {"status": S.SUCCEEDED, "lease_owner": ""},  # terminal is final
        {"status": S.PENDING, "lease_owner": ""},
    ],
)
def test_worker_writes_lose_without_lease_or_attempt(fields):
    execution = _execution(**fields)
    before = _snapshot(execution)
    common = {"execution_id": execution.pk, "attempt": 1, "worker_id": "w:1:1", "max_chars": MAX}
    assert transitions.execution_succeed(output="x", **common) is False
    assert transitions.execution_fail(error="e", output="", retry_in=1.0, **common) is None
    assert transitions.execution_fail(error="e", output="", retry_in=None, **common) is None
    assert not transitions.execution_record_run(
        execution_id=execution.pk, attempt=1, worker_id="w:1:1", external_run_id="r", run_handle={}, poll_in=None
    )
    assert _snapshot(execution) == before


def test_failed_attempt_is_rescheduled_with_the_next_attempt_number():
    execution = _execution(S.RUNNING, lease_owner="w:1:1")
    outcome = transitions.execution_fail(
        execution_id=execution.pk, attempt=1, worker_id="w:1:1", error="boom", output="", retry_in=30, max_chars=MAX
    )
    assert outcome == S.SCHEDULED
    execution.refresh_from_db()
    assert (execution.status, execution.attempt, execution.lease_owner) == (S.SCHEDULED, 2, "")
    assert execution.due_at > timezone.now() + timedelta(seconds=25)
    last = execution.events.last()
    assert (last.from_status, last.to_status, last.attempt) == (S.RUNNING, S.SCHEDULED, 2)


def test_final_failure_is_terminal():
    execution = _execution(S.RUNNING, lease_owner="w:1:1")
    assert (
        transitions.execution_fail(
            execution_id=execution.pk,
            attempt=1,
            worker_id="w:1:1",
            error="boom",
            output="",
            retry_in=None,
            max_chars=MAX,
        )
        == S.FAILED
    )
    assert transitions.execution_cancel(execution_id=execution.pk, actor="user").won is False
    assert Execution.objects.get(pk=execution.pk).status == S.FAILED


def test_output_and_error_are_bounded():
    execution = _execution(S.RUNNING, lease_owner="w:1:1")
    transitions.execution_succeed(
        execution_id=execution.pk, attempt=1, worker_id="w:1:1", output="x" * 5000, max_chars=100
    )
    execution.refresh_from_db()
    assert len(execution.output) == 100
    assert "characters cut" in execution.output


@pytest.mark.parametrize("status", [S.SCHEDULED, S.PENDING, S.RUNNING])
def test_cancel_from_active_states(status):
    execution = _execution(status, lease_owner="w:1:1" if status == S.RUNNING else "")
    outcome = transitions.execution_cancel(execution_id=execution.pk, actor="user:1", reason="no longer needed")
    assert outcome.won and outcome.from_status == status
    execution.refresh_from_db()
    assert execution.status == S.CANCELLED and execution.finished_at is not None
    # A worker that still runs it loses its next write.
    assert not transitions.execution_succeed(
        execution_id=execution.pk, attempt=1, worker_id="w:1:1", output="", max_chars=MAX
    )


@pytest.mark.parametrize("status", [S.SUCCEEDED, S.FAILED, S.CANCELLED])
def test_cancel_of_terminal_loses(status):
    execution = _execution(status)
    before = _snapshot(execution)
    assert transitions.execution_cancel(execution_id=execution.pk, actor="user:1").won is False
    assert _snapshot(execution) == before


def test_allowed_sources_never_leave_a_terminal_state():
    for target, sources in transitions.ALLOWED_SOURCES.items():
        assert not sources & {S.SUCCEEDED, S.FAILED, S.CANCELLED}, target


def test_expired_lease_is_handed_back_and_the_old_owner_is_fenced_out():
    execution = _execution(S.RUNNING, lease_owner="dead:1:1", lease_expires_at=timezone.now() - timedelta(seconds=5))
    with transaction.atomic():
        taken = transitions.executions_take_polls(limit=10, in_flight_for=60, actor="monitor:test")
    assert [d.execution_id for d in taken] == [execution.pk]
    assert transitions.execution_acquire(execution_id=execution.pk, attempt=1, worker_id="new:2:2", lease_seconds=30)
    assert not transitions.execution_succeed(
        execution_id=execution.pk, attempt=1, worker_id="dead:1:1", output="", max_chars=MAX
    )
    assert transitions.execution_succeed(
        execution_id=execution.pk, attempt=1, worker_id="new:2:2", output="", max_chars=MAX
    )


# --- cancel narrowed to sources, superseding, and executions created on request ---------------


def test_cancel_only_from_loses_for_other_statuses():
    execution = _execution(S.RUNNING, lease_owner="w:1:1")
    before = _snapshot(execution)
    outcome = transitions.execution_cancel(
        execution_id=execution.pk, actor="user:1", reason="replaced", only_from={S.SCHEDULED, S.PENDING}
    )
    assert not outcome.won and outcome.from_status == S.RUNNING
    assert _snapshot(execution) == before


def test_superseded_occurrence_can_be_created_again():
    execution = _execution(S.SCHEDULED)
    outcome = transitions.execution_cancel(execution_id=execution.pk, actor="user:1", reason="paused", supersede=True)
    assert outcome.won
    execution.refresh_from_db()
    assert execution.status == S.CANCELLED and execution.superseded
    row = transitions.NewExecution(execution.task_id, execution.scheduled_for, 5)
    (again,) = transitions.executions_create(rows=[row], actor="materialiser")
    assert again != execution.pk
    assert transitions.executions_create(rows=[row], actor="materialiser") == []  # and only once


def test_user_cancelled_occurrence_is_never_created_again():
    execution = _execution(S.SCHEDULED)
    assert transitions.execution_cancel(execution_id=execution.pk, actor="user:1").won
    row = transitions.NewExecution(execution.task_id, execution.scheduled_for, 5)
    assert transitions.executions_create(rows=[row], actor="materialiser") == []


def test_an_execution_that_ever_started_cannot_be_superseded():
    execution = _execution(S.SCHEDULED, attempt=2, started_at=timezone.now())  # a retry waiting
    before = _snapshot(execution)
    assert not transitions.execution_cancel(execution_id=execution.pk, actor="user:1", supersede=True).won
    assert _snapshot(execution) == before


def test_database_refuses_a_superseded_execution_that_is_not_cancelled():
    from django.db import IntegrityError

    execution = _execution(S.SCHEDULED)
    with pytest.raises(IntegrityError), transaction.atomic():
        Execution.objects.filter(pk=execution.pk).update(superseded=True)


def test_trigger_creates_an_execution_due_now_with_its_event():
    task = TaskFactory(priority=7)
    new_id = transitions.execution_trigger(task_id=task.pk, actor="user:alice")
    execution = Execution.objects.get(pk=new_id)
    assert (execution.status, execution.attempt, execution.origin, execution.priority) == (S.SCHEDULED, 1, "trigger", 7)
    assert execution.due_at == execution.scheduled_for
    assert abs(execution.scheduled_for - timezone.now()) < timedelta(seconds=5)
    assert list(execution.events.values_list("from_status", "to_status", "actor")) == [("", S.SCHEDULED, "user:alice")]


def test_trigger_of_a_deleted_task_creates_nothing():
    task = TaskFactory(status="DELETED")
    assert transitions.execution_trigger(task_id=task.pk, actor="user:alice") is None
    assert not Execution.objects.exists()


@pytest.mark.parametrize("status", [S.FAILED, S.CANCELLED])
def test_retry_creates_a_new_execution_with_the_next_attempt_and_leaves_the_old_one(status):
    old = _execution(status, attempt=3)
    before = _snapshot(old)
    new_id = transitions.execution_retry(execution_id=old.pk, actor="user:alice")
    new = Execution.objects.get(pk=new_id)
    assert (new.status, new.attempt, new.origin, new.retry_of_id, new.task_id) == (
        S.SCHEDULED,
        4,
        "retry",
        old.pk,
        old.task_id,
    )
    assert list(new.events.values_list("to_status", "attempt")) == [(S.SCHEDULED, 4)]
    assert _snapshot(old) == before  # terminal is final
    assert transitions.execution_retry(execution_id=old.pk, actor="user:alice") is None  # once only


@pytest.mark.parametrize("status", [S.SCHEDULED, S.PENDING, S.RUNNING, S.SUCCEEDED])
def test_retry_of_an_execution_that_did_not_fail_loses(status):
    execution = _execution(status)
    assert transitions.execution_retry(execution_id=execution.pk, actor="user:alice") is None
    assert Execution.objects.count() == 1


def test_retry_of_a_deleted_tasks_execution_loses():
    execution = _execution(S.FAILED)
    execution.task.__class__.objects.filter(pk=execution.task_id).update(status="DELETED")
    assert transitions.execution_retry(execution_id=execution.pk, actor="user:alice") is None


# --- overlap policies at claim time ------------------------------------------------------------


def _exclusive_pair(policy: str, *, previous_status: str = S.RUNNING):
    """A task with ``policy``: an older execution in ``previous_status`` and a newer PENDING one."""
    task = TaskFactory(overlap_policy=policy)
    now = timezone.now()
    rows = [
        transitions.NewExecution(task.pk, now - timedelta(seconds=2), task.priority, exclusive=policy != "allow"),
        transitions.NewExecution(task.pk, now - timedelta(seconds=1), task.priority, exclusive=policy != "allow"),
    ]
    previous_id, next_id = transitions.executions_create(rows=rows, actor="test")
    Execution.objects.filter(pk=previous_id).update(status=previous_status, lease_owner="w0", started_at=now)
    Execution.objects.filter(pk=next_id).update(status=S.PENDING)
    return task, Execution.objects.get(pk=previous_id), Execution.objects.get(pk=next_id)


def _claim_exclusive(execution: Execution, worker: str = "w1") -> transitions.ExclusiveClaim:
    return transitions.execution_claim_exclusive(
        execution_id=execution.pk, attempt=execution.attempt, worker_id=worker, lease_seconds=60
    )


def test_fast_claim_loses_on_an_exclusive_execution():
    _, _, pending = _exclusive_pair("skip")
    before = _snapshot(pending)
    assert (
        transitions.execution_claim_loaded(execution_id=pending.pk, attempt=1, worker_id="w1", lease_seconds=60) is None
    )
    assert _snapshot(pending) == before


def test_exclusive_claim_without_a_running_sibling_claims():
    _, _, pending = _exclusive_pair("skip", previous_status=S.SUCCEEDED)
    claim = _claim_exclusive(pending)
    assert claim.outcome == "claimed"
    assert claim.execution is not None and claim.execution.task.pk == pending.task_id
    pending.refresh_from_db()
    assert (pending.status, pending.lease_owner) == (S.RUNNING, "w1")
    assert pending.events.filter(from_status=S.PENDING, to_status=S.RUNNING).count() == 1


def test_overlap_skip_cancels_the_new_run_and_records_it():
    from executions.models import SkippedOccurrence

    task, previous, pending = _exclusive_pair("skip")
    claim = _claim_exclusive(pending)
    assert claim.outcome == "skipped"
    pending.refresh_from_db()
    previous.refresh_from_db()
    assert pending.status == S.CANCELLED
    assert previous.status == S.RUNNING
    event = pending.events.get(to_status=S.CANCELLED)
    assert event.detail == f"overlap: previous run {previous.pk} still running"
    skipped = SkippedOccurrence.objects.get(task=task)
    assert (skipped.scheduled_for, skipped.reason, skipped.execution_id) == (
        pending.scheduled_for,
        "overlap",
        pending.pk,
    )


def test_overlap_queue_one_puts_the_first_waiter_back_and_cancels_a_second():
    task, _, pending = _exclusive_pair("queue_one")
    claim = _claim_exclusive(pending)
    assert claim.outcome == "queued"
    pending.refresh_from_db()
    assert pending.status == S.SCHEDULED
    assert pending.due_at > timezone.now()
    assert pending.events.get(from_status=S.PENDING, to_status=S.SCHEDULED).detail.startswith("overlap: queued behind")
    (third_id,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, timezone.now(), task.priority, exclusive=True)], actor="test"
    )
    Execution.objects.filter(pk=third_id).update(status=S.PENDING)
    third = Execution.objects.get(pk=third_id)
    assert _claim_exclusive(third).outcome == "skipped"
    third.refresh_from_db()
    assert third.status == S.CANCELLED
    assert f"execution {pending.pk} is already waiting" in third.error


def test_overlap_cancel_previous_cancels_the_running_one_and_claims():
    _, previous, pending = _exclusive_pair("cancel_previous")
    Execution.objects.filter(pk=previous.pk).update(external_run_id="run-1", run_handle={"k": "v"})
    claim = _claim_exclusive(pending)
    assert claim.outcome == "claimed"
    ((cancelled_id, outcome),) = claim.cancelled
    assert cancelled_id == previous.pk
    assert (outcome.won, outcome.from_status, outcome.external_run_id) == (True, S.RUNNING, "run-1")
    previous.refresh_from_db()
    pending.refresh_from_db()
    assert previous.status == S.CANCELLED
    assert previous.events.get(to_status=S.CANCELLED).detail == f"cancelled by the next run ({pending.pk})"
    assert pending.status == S.RUNNING
    # The cancelled run's worker loses its next write.
    assert not transitions.execution_succeed(
        execution_id=previous.pk, attempt=1, worker_id="w0", output="", max_chars=MAX
    )


def test_exclusive_claim_loses_on_a_non_pending_or_non_exclusive_row():
    _, _, pending = _exclusive_pair("allow")
    assert _claim_exclusive(pending).outcome == "lost"  # not exclusive: the fast claim is the way
    _, _, other = _exclusive_pair("skip")
    Execution.objects.filter(pk=other.pk).update(status=S.CANCELLED)
    assert _claim_exclusive(other).outcome == "lost"


def test_triggered_and_retried_runs_of_an_exclusive_task_are_exclusive():
    task = TaskFactory(overlap_policy="skip")
    triggered = Execution.objects.get(pk=transitions.execution_trigger(task_id=task.pk, actor="test"))
    assert triggered.exclusive
    Execution.objects.filter(pk=triggered.pk).update(status=S.FAILED)
    retried = Execution.objects.get(pk=transitions.execution_retry(execution_id=triggered.pk, actor="test"))
    assert retried.exclusive
    plain = TaskFactory()
    assert not Execution.objects.get(pk=transitions.execution_trigger(task_id=plain.pk, actor="test")).exclusive


def test_exclusive_claim_decides_on_the_row_as_it_is_under_the_lock(monkeypatch):
    """A user cancels the PENDING execution after the claim first read it but before the claim
    got the task lock: the claim loses and cancel_previous leaves the running one alone (it used
    to cancel it for a successor that never ran, and drop the report that its run must stop)."""
    _, previous, pending = _exclusive_pair("cancel_previous")
    real_task = transitions.overlap.Task

    class TaskLockedAfterACancel:
        class objects:  # stands in for the manager
            @staticmethod
            def select_for_update(**kwargs):
                transitions.execution_cancel(execution_id=pending.pk, actor="user:alice")
                return real_task.objects.select_for_update(**kwargs)

    monkeypatch.setattr(transitions.overlap, "Task", TaskLockedAfterACancel)
    claim = _claim_exclusive(pending)
    assert (claim.outcome, claim.cancelled) == ("lost", ())
    previous.refresh_from_db()
    pending.refresh_from_db()
    assert (previous.status, pending.status) == (S.RUNNING, S.CANCELLED)
    assert not previous.events.filter(to_status=S.CANCELLED).exists()
