"""The monitor's idle pass: one statement, and what it must still notice.

An idle monitor used to make, every second, a health-check ``SELECT 1``, a transaction of three
statements (the pacer's count, the fair pick, the next due time), two more transactions for its
housekeeping and two broker channels. Now it reads the outlook (one statement) and goes back
to sleep unless a run is due, a run is PENDING or a poll is due; then the pass is as before.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from executions import fairness, transitions
from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.monitor import Monitor
from executions.transitions import dispatch
from tests.executions.test_monitor import FlakyPublisher
from tests.factories import ExecutionFactory, TaskFactory
from tms_core.conf import tms_settings

pytestmark = pytest.mark.django_db


def _no_broker(*args, **kwargs):
    raise AssertionError("an idle pass must not touch the broker")


def _execution(status: str, *, due_in: float = -1.0, **fields) -> Execution:
    task = TaskFactory(misfire_grace=timedelta(hours=1))
    return ExecutionFactory(
        task=task, status=status, scheduled_for=timezone.now() + timedelta(seconds=due_in), **fields
    )


def test_an_idle_pass_is_one_statement_and_opens_no_broker_channel(monkeypatch):
    _execution(S.SCHEDULED, due_in=40)  # materialised ahead: not due yet
    _execution(S.SUCCEEDED)
    monitor = Monitor(publish=FlakyPublisher())
    monkeypatch.setattr(monitor._run_task.app, "producer_or_acquire", _no_broker)

    with CaptureQueriesContext(connection) as queries:
        sent, next_due = monitor.dispatch_once(housekeeping=True)

    assert sent == 0
    assert next_due is not None and 38 < next_due <= 40
    assert len(queries) == 1, [q["sql"][:120] for q in queries.captured_queries]
    assert Execution.objects.filter(status=S.SCHEDULED).count() == 1


def _past() -> object:
    return timezone.now() - timedelta(seconds=1)


@pytest.mark.parametrize(
    ("status", "fields", "pending", "polls"),
    [
        (S.PENDING, lambda: {"enqueued_at": timezone.now()}, True, False),
        (S.RUNNING, lambda: {"lease_owner": "", "next_poll_at": _past()}, False, True),
        (S.RUNNING, lambda: {"lease_owner": "w:1", "lease_expires_at": _past()}, False, True),
    ],
    ids=["pending", "poll-due", "lease-expired"],
)
def test_runs_in_flight_make_the_pass_a_full_one(status, fields, pending, polls):
    """A PENDING run (its message may be lost, the pacer counts it) or a RUNNING one due for a
    poll or with an expired lease: the pass does its takes, as before."""
    row = _execution(status, **fields())
    outlook = transitions.dispatch_outlook()
    assert (outlook.runs_in, outlook.pending, outlook.polls, outlook.idle) == (None, pending, polls, False)

    publisher = FlakyPublisher()
    monitor = Monitor(publish=publisher)
    monitor.dispatch_once(housekeeping=True)
    sent = [(name, execution_id) for name, execution_id, _, _ in publisher.sent]
    # The poll (or, for an expired lease, the hand-back's poll) went out; a fresh PENDING run is
    # neither lost nor republished.
    assert sent == ([("tms.poll_execution", row.pk)] if polls else [])
    assert monitor.stats.polls == (1 if polls else 0)
    assert monitor.stats.republished == 0


def test_a_run_in_flight_with_a_live_lease_and_no_poll_due_leaves_the_pass_idle():
    _execution(
        S.RUNNING,
        lease_owner="w:1",
        lease_expires_at=timezone.now() + timedelta(seconds=30),
        next_poll_at=timezone.now() + timedelta(seconds=30),
    )
    outlook = transitions.dispatch_outlook()
    assert (outlook.runs_in, outlook.pending, outlook.polls, outlook.idle) == (None, False, False, True)


def test_a_run_that_falls_due_after_idle_passes_is_published_by_the_next_pass():
    publisher = FlakyPublisher()
    monitor = Monitor(publish=publisher)
    assert monitor.dispatch_once(housekeeping=True) == (0, None)
    due = _execution(S.SCHEDULED, due_in=-0.5)
    outlook = transitions.dispatch_outlook()
    assert outlook.runs_in == 0.0 and not outlook.idle

    sent, _ = monitor.dispatch_once(housekeeping=True)

    assert sent == 1 and publisher.ids == [due.pk]
    assert Execution.objects.get(pk=due.pk).status == S.PENDING


def test_an_idle_look_keeps_the_herd_start_of_the_pacer(monkeypatch):
    """Idle passes no longer ask the pacer for room; they tell it that nothing is queued, so
    the first look after them still offers MONITOR_MIN_PENDING full messages (a herd's start)
    and not the doubling of a queue that drained."""
    conf = dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.5, MONITOR_MIN_PENDING=8, DISPATCH_BATCH=16)
    now = [0.0]
    pacer = fairness.Pacer(conf, clock=lambda: now[0])
    queued = [5]
    monkeypatch.setattr(fairness, "published_unstarted", lambda **_: queued[0])
    monkeypatch.setattr(fairness, "steps_published", lambda: 0)
    pacer.room()  # runs were queued at the last busy look
    for second in range(1, 4):  # then they started and the monitor's passes were idle
        now[0] = float(second)
        pacer.idle()
    queued[0] = 0
    now[0] = 4.0
    assert pacer.room() == 8 * 16


def _outlook_reads(queries: CaptureQueriesContext) -> int:
    statement, _ = dispatch._outlook_statement()
    return sum(1 for query in queries.captured_queries if query["sql"].startswith(statement[:40]))


def test_a_pass_after_one_that_published_skips_the_outlook():
    """A herd's monitor tops up ten times a second: after a pass that published due runs the
    next goes straight to its takes; after one that found nothing it reads the outlook again."""
    publisher = FlakyPublisher()
    monitor = Monitor(publish=publisher)
    first = _execution(S.SCHEDULED, due_in=-0.5)

    with CaptureQueriesContext(connection) as busy:
        assert monitor.dispatch_once(housekeeping=False)[0] == 1
    second = _execution(S.SCHEDULED, due_in=-0.5)
    with CaptureQueriesContext(connection) as after_busy:
        assert monitor.dispatch_once(housekeeping=False)[0] == 1
    with CaptureQueriesContext(connection) as drained:
        assert monitor.dispatch_once(housekeeping=False)[0] == 0
    with CaptureQueriesContext(connection) as after_drained:
        assert monitor.dispatch_once(housekeeping=False)[0] == 0

    # The drained pass was a full one that found nothing; the one after it read the outlook
    # (not idle: the two runs are PENDING, so it went on to its takes).
    assert [_outlook_reads(q) for q in (busy, after_busy, drained, after_drained)] == [1, 0, 0, 1]
    assert publisher.ids == [first.pk, second.pk]
