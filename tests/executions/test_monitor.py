"""The monitor's dispatch step, in-process against the real database and broker connection,
with a publisher that records each message and fails on the Nth as a broker that went away.

What is asserted is what the rows and their timelines say afterwards: which executions were
published (PENDING with the published message id), which were undone back to SCHEDULED (and
stay due), which were never taken, and the events of each.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from amqp.exceptions import ConnectionForced, NotFound
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError

from executions import transitions
from executions.messages import send
from executions.models import Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from executions.monitor import Monitor
from tests.factories import ExecutionFactory, TaskFactory
from tms_core.conf import tms_settings

pytestmark = pytest.mark.django_db

UNDONE = "broker unavailable: not published"


class FlakyPublisher:
    """Records each message instead of sending it; the ``fail_at``-th call (1-based) raises."""

    def __init__(self, fail_at: int | None = None, error: Exception | None = None) -> None:
        self.fail_at = fail_at
        self.error = error or KombuOperationalError("[Errno 104] Connection reset by peer")
        self.calls = 0
        #: (Celery task name, execution id, attempt, message id) of each message "sent".
        self.sent: list[tuple[str, int, int, str]] = []

    def __call__(self, task, item, producer) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error
        self.sent.append((task.name, item.execution_id, item.attempt, item.message_id))

    @property
    def ids(self) -> list[int]:
        return [execution_id for _, execution_id, _, _ in self.sent]


def _due(count: int) -> list[int]:
    """``count`` SCHEDULED executions of one task, all due, oldest first (the order they are taken in)."""
    # A misfire grace longer than their lateness: this is about publishing, not the misfire policy.
    task = TaskFactory(misfire_grace=timedelta(hours=1))
    now = timezone.now()
    return [ExecutionFactory(task=task, scheduled_for=now - timedelta(seconds=60 - index)).pk for index in range(count)]


def _timeline(execution_id: int) -> list[tuple[str, str, str]]:
    """(from, to, detail) of each event after the creation event."""
    return list(
        ExecutionEvent.objects.filter(execution_id=execution_id)
        .exclude(from_status="")
        .order_by("id")
        .values_list("from_status", "to_status", "detail")
    )


def _state(execution_id: int) -> tuple[str, str, bool]:
    row = Execution.objects.get(pk=execution_id)
    return row.status, row.message_id, row.enqueued_at is not None


def test_a_pass_with_a_working_broker_publishes_every_due_row_once_in_due_order():
    ids = _due(5)
    publisher = FlakyPublisher()
    monitor = Monitor(batch=2, publish=publisher)

    sent, next_due = monitor.dispatch_once(housekeeping=False)

    assert (sent, next_due) == (5, None)
    assert publisher.ids == ids
    assert {name for name, *_ in publisher.sent} == {"tms.run_execution"}
    for _, execution_id, attempt, message_id in publisher.sent:
        assert _state(execution_id) == (S.PENDING, message_id, True)
        assert attempt == 1
        assert _timeline(execution_id) == [(S.SCHEDULED, S.PENDING, "")]
    assert set(ExecutionEvent.objects.exclude(from_status="").values_list("actor", flat=True)) == {monitor.actor}
    assert monitor.stats.published == 5


def test_the_monitor_sends_through_the_broker_unless_told_otherwise():
    assert Monitor().publish is send


def test_the_rest_of_a_batch_cut_off_mid_publish_goes_back_to_scheduled():
    ids = _due(5)
    publisher = FlakyPublisher(fail_at=3)
    monitor = Monitor(batch=10, publish=publisher)

    with pytest.raises(KombuOperationalError):
        monitor.dispatch_once(housekeeping=False)

    assert publisher.ids == ids[:2]
    for _, execution_id, _, message_id in publisher.sent:
        assert _state(execution_id) == (S.PENDING, message_id, True)
        assert _timeline(execution_id) == [(S.SCHEDULED, S.PENDING, "")]
    for execution_id in ids[2:]:
        assert _state(execution_id) == (S.SCHEDULED, "", False)
        assert _timeline(execution_id) == [(S.SCHEDULED, S.PENDING, ""), (S.PENDING, S.SCHEDULED, UNDONE)]
    assert ExecutionEvent.objects.filter(to_status=S.SCHEDULED, detail=UNDONE).count() == 3

    # The undone rows are still due: the next pass publishes them, and only them.
    retry = FlakyPublisher()
    assert Monitor(batch=10, publish=retry).dispatch_once(housekeeping=False) == (3, None)
    assert retry.ids == ids[2:]
    assert Execution.objects.filter(pk__in=ids, status=S.PENDING).count() == 5
    assert len({message_id for *_, message_id in publisher.sent + retry.sent}) == 5


@pytest.mark.parametrize(
    "error",
    [
        # The declare Celery makes before its first publish on a connection, on a cluster node
        # whose peer holding the queue is down (issue 45: the monitor died, its batch PENDING).
        NotFound("Queue.declare: (404) NOT_FOUND - home node 'rabbit1@a' of durable queue 'q' is down"),
        ConnectionForced("CONNECTION_FORCED - shutdown"),
    ],
    ids=["not-found", "connection-forced"],
)
def test_an_amqp_error_mid_publish_gives_the_rest_of_the_batch_back_as_a_broker_error(error):
    ids = _due(4)
    publisher = FlakyPublisher(fail_at=2, error=error)

    with pytest.raises(type(error)):
        Monitor(batch=10, publish=publisher).dispatch_once(housekeeping=False)

    assert publisher.ids == ids[:1]
    assert [_state(i)[0] for i in ids] == [S.PENDING, S.SCHEDULED, S.SCHEDULED, S.SCHEDULED]
    assert ExecutionEvent.objects.filter(to_status=S.SCHEDULED, detail=UNDONE).count() == 3


@pytest.mark.django_db(transaction=True)  # the loop closes the database connection after a failed pass
def test_a_monitor_loop_survives_a_channel_error_and_retries_soon(monkeypatch):
    ids = _due(2)
    publisher = FlakyPublisher(fail_at=1, error=NotFound("Queue.declare: (404) NOT_FOUND - no queue"))
    monitor = Monitor(batch=10, publish=publisher)
    sleeps: list[float] = []
    monkeypatch.setattr(monitor, "_sleep", sleeps.append)

    monitor.run(max_passes=2)

    # The first pass failed and gave its batch back; the second, after a short wait, published it.
    assert monitor.stats.errors == 1
    assert sleeps and sleeps[0] <= 2.0
    assert [_state(i)[0] for i in ids] == [S.PENDING, S.PENDING]
    assert publisher.ids == ids


def test_batches_committed_before_the_failure_stay_published_and_later_rows_are_never_taken():
    ids = _due(5)
    publisher = FlakyPublisher(fail_at=3)  # the first message of the second batch of two

    with pytest.raises(KombuOperationalError):
        Monitor(batch=2, publish=publisher).dispatch_once(housekeeping=False)

    assert publisher.ids == ids[:2]
    assert [_state(i)[0] for i in ids] == [S.PENDING, S.PENDING, S.SCHEDULED, S.SCHEDULED, S.SCHEDULED]
    assert [len(_timeline(i)) for i in ids] == [1, 1, 2, 2, 0]  # the fifth row was never taken
    assert _timeline(ids[2]) == [(S.SCHEDULED, S.PENDING, ""), (S.PENDING, S.SCHEDULED, UNDONE)]


def test_a_broker_that_fails_the_first_message_leaves_nothing_pending():
    ids = _due(3)
    publisher = FlakyPublisher(fail_at=1)

    with pytest.raises(KombuOperationalError):
        Monitor(batch=10, publish=publisher).dispatch_once(housekeeping=False)

    assert publisher.sent == []
    assert not Execution.objects.filter(status=S.PENDING).exists()
    assert all(_state(i) == (S.SCHEDULED, "", False) for i in ids)
    assert ExecutionEvent.objects.filter(to_status=S.SCHEDULED, detail=UNDONE).count() == 3


def test_a_failed_republish_leaves_the_row_pending_for_the_next_republish():
    (execution_id,) = _due(1)
    long_ago = timezone.now() - timedelta(hours=1)
    Execution.objects.filter(pk=execution_id).update(status=S.PENDING, message_id="lost-message", enqueued_at=long_ago)
    publisher = FlakyPublisher(fail_at=1)
    monitor = Monitor(batch=10, publish=publisher)

    with pytest.raises(KombuOperationalError):
        monitor.dispatch_once(housekeeping=True)

    row = Execution.objects.get(pk=execution_id)
    # Not undone to SCHEDULED: it is PENDING either way, and is published again once unclaimed
    # for PENDING_REPUBLISH_AFTER more seconds.
    assert row.status == S.PENDING and row.enqueued_at > long_ago
    assert row.message_id not in ("", "lost-message")
    assert _timeline(execution_id) == [
        (S.PENDING, S.PENDING, f"unclaimed for {monitor.conf.PENDING_REPUBLISH_AFTER:g}s: published again")
    ]


def test_a_failed_poll_message_makes_the_poll_due_again_at_once():
    (execution_id,) = _due(1)
    Execution.objects.filter(pk=execution_id).update(
        status=S.RUNNING, lease_owner="", next_poll_at=timezone.now() - timedelta(seconds=10)
    )
    publisher = FlakyPublisher(fail_at=1)
    monitor = Monitor(batch=10, publish=publisher)

    with pytest.raises(KombuOperationalError):
        monitor.dispatch_once(housekeeping=True)

    row = Execution.objects.get(pk=execution_id)
    # Taking the poll moved next_poll_at PENDING_REPUBLISH_AFTER ahead; the undo brings it back.
    assert row.status == S.RUNNING and row.next_poll_at <= timezone.now()
    assert _timeline(execution_id) == []

    retry = FlakyPublisher()
    assert Monitor(batch=10, publish=retry).dispatch_once(housekeeping=True)[0] == 1
    assert [(name, i) for name, i, _, _ in retry.sent] == [("tms.poll_execution", execution_id)]


def _slowly(call):
    def slow(*args, **kwargs):
        import time

        time.sleep(1.0)  # a slow broker's confirm, a loaded database or machine
        return call(*args, **kwargs)

    return slow


@pytest.mark.parametrize("slow_step", ["publish", "take"])
def test_the_monitor_sleeps_until_the_next_due_time_it_read_not_that_long_after(monkeypatch, slow_step):
    """Issue 33: the loop slept the wait it read as if read at the end of the pass, so each run
    started as much later as the pass took after the read: the publishing (and its confirm wait)
    after it, and the take before it in the same transaction (PostgreSQL's now() is the
    transaction's start, so the next due time counts from there)."""
    task = TaskFactory(misfire_grace=timedelta(hours=1))
    now = timezone.now()
    ExecutionFactory(task=task, scheduled_for=now - timedelta(seconds=1))
    ExecutionFactory(task=task, scheduled_for=now + timedelta(seconds=4))
    published = FlakyPublisher()
    if slow_step == "take":
        monkeypatch.setattr(transitions, "executions_take_due", _slowly(transitions.executions_take_due))
    # No pacing, and a longest sleep above the wait, which would cap it.
    conf = dataclasses.replace(tms_settings(), MONITOR_MAX_SLEEP=30.0, MONITOR_QUEUE_SECONDS=0.0)
    monitor = Monitor(conf=conf, batch=100, publish=_slowly(published) if slow_step == "publish" else published)
    # The loop's connection check would close the test's connection (its transaction).
    monkeypatch.setattr("executions.monitor.close_old_connections", lambda: None)
    read: list[float | None] = []
    look = transitions.next_due_in
    monkeypatch.setattr(transitions, "next_due_in", lambda: read.append(look()) or read[-1])
    waits: list[float] = []
    monitor.listener.wait = lambda timeout: bool(waits.append(timeout))  # type: ignore[method-assign]
    monitor.run(max_passes=1)
    assert len(published.ids) == 1
    # The wait read (about 4 s) less the second the slow step took (without the fixes: the
    # wait read, whole).
    assert len(read) == 1 and read[0] is not None and read[0] > 1.0
    assert len(waits) == 1 and waits[0] <= read[0] - 0.9
