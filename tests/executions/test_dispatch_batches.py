"""Several runs in one message: the monitor groups a herd (``TMS_DISPATCH_BATCH``), a worker
handles each run of the message as a message of its own would be handled.

In-process against the real database (the monitor with recording publishers), then on the
running system: a real monitor and worker start a herd each run exactly once.
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError

from executions import worker_services
from executions.messages import group_runs, send_many
from executions.models import Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from executions.monitor import Monitor
from executions.transitions import Dispatch
from tasks_api.creation import task_bulk_create
from tests.executions.test_monitor import FlakyPublisher
from tests.factories import ExecutionFactory, TaskFactory, UserFactory
from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready
from tms_core.clock import db_now
from tms_core.conf import tms_settings

UNDONE = "broker unavailable: not published"


class ManyPublisher:
    """Records each several-run message instead of sending it; the ``fail_at``-th call raises."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.calls = 0
        #: (Celery task name, [execution ids]) of each message "sent".
        self.sent: list[tuple[str, list[int]]] = []

    def __call__(self, task, items, producer) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise KombuOperationalError("[Errno 104] Connection reset by peer")
        self.sent.append((task.name, [item.execution_id for item in items]))


def _dispatch(execution_id: int, priority: int = 5) -> Dispatch:
    return Dispatch(execution_id=execution_id, attempt=1, priority=priority, message_id=f"{execution_id}-x")


def _conf(**changes):
    # No pacing: what is due is taken in one pass (fair share is test_fairness's).
    return dataclasses.replace(tms_settings(), MONITOR_QUEUE_SECONDS=0.0, **changes)


def _due(count: int, *, priority: int = 5) -> list[int]:
    task = TaskFactory(misfire_grace=timedelta(hours=1), priority=priority)
    now = timezone.now()
    return [ExecutionFactory(task=task, scheduled_for=now - timedelta(seconds=90 - i)).pk for i in range(count)]


# --- grouping ------------------------------------------------------------------------------------


def test_a_herd_is_split_into_messages_of_at_most_the_batch_and_at_least_the_spread():
    taken = [_dispatch(i) for i in range(100)]
    groups = group_runs(taken, most=16, spread=8)
    assert [len(g) for g in groups] == [12] * 8 + [4]  # 100 // 8 = 12 per message
    assert [item for group in groups for item in group] == taken  # slices of taken, in order
    assert [len(g) for g in group_runs(taken, most=5, spread=8)] == [5] * 20
    # Fewer runs than twice the spread: a message each, as without grouping.
    assert [len(g) for g in group_runs(taken[:15], most=16, spread=8)] == [1] * 15
    assert group_runs([], most=16, spread=8) == []


def test_a_message_holds_runs_of_one_priority_only():
    taken = [_dispatch(i, priority=p) for i, p in enumerate([5, 5, 5, 9, 9, 5, 5, 5, 5, 5])]
    groups = group_runs(taken, most=4, spread=1)
    assert [[d.execution_id for d in g] for g in groups] == [[0, 1, 2], [3, 4], [5, 6, 7, 8], [9]]
    assert all(len({d.priority for d in g}) == 1 for g in groups)


# --- the monitor ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_monitor_publishes_a_herd_in_messages_of_several_runs_each_run_once():
    ids = _due(40)
    single, many = FlakyPublisher(), ManyPublisher()
    monitor = Monitor(conf=_conf(DISPATCH_BATCH=4, MONITOR_MIN_PENDING=8), publish=single, publish_many=many)

    assert monitor.dispatch_once(housekeeping=False) == (40, None)

    assert single.sent == []
    assert {name for name, _ in many.sent} == {"tms.run_executions"}
    assert [len(group) for _, group in many.sent] == [4] * 10
    assert [i for _, group in many.sent for i in group] == ids
    assert (monitor.stats.published, monitor.stats.messages) == (40, 10)
    # Each row keeps its own message id (an undo finds its rows by it).
    rows = Execution.objects.filter(pk__in=ids)
    assert {row.status for row in rows} == {S.PENDING}
    assert len({row.message_id for row in rows}) == 40


class _Pacer:
    """The monitor's pacer with the queue as deep as a test says (room for everything due)."""

    def __init__(self, queued: int) -> None:
        self.queued = queued

    def room(self) -> int:
        return 1000

    def published(self, count: int) -> None:
        pass

    def idle(self) -> None:
        pass


@pytest.mark.django_db
@pytest.mark.parametrize(("queued", "messages"), [(0, [1, 1, 1]), (7, [1, 1, 1]), (8, [3])])
def test_a_few_runs_due_while_the_workers_have_work_queued_go_in_one_message(queued, messages):
    """Runs that become due a few at a time (workflow steps, each due when the one before ended)
    are spread over messages only while the queue is short of MONITOR_MIN_PENDING runs (every
    pool process gets work at once); with that many queued, the workers have work, and the few
    go in one message (a chain of steps went out nearly one per message)."""
    ids = _due(3)
    single, many = FlakyPublisher(), ManyPublisher()
    monitor = Monitor(conf=_conf(DISPATCH_BATCH=16, MONITOR_MIN_PENDING=8), publish=single, publish_many=many)
    monitor.pacer = _Pacer(queued)  # type: ignore[assignment]
    monitor.dispatch_once(housekeeping=False)
    assert [len(group) for _, group in many.sent] + [1] * len(single.ids) == messages
    assert sorted([i for _, group in many.sent for i in group] + single.ids) == ids


@pytest.mark.django_db
def test_with_a_batch_of_one_every_run_has_its_own_message():
    ids = _due(40)
    single, many = FlakyPublisher(), ManyPublisher()
    monitor = Monitor(conf=_conf(DISPATCH_BATCH=1), publish=single, publish_many=many)
    assert monitor.dispatch_once(housekeeping=False) == (40, None)
    assert many.sent == [] and single.ids == ids
    assert monitor.stats.messages == 40


@pytest.mark.django_db
def test_runs_of_a_message_the_broker_did_not_take_go_back_to_scheduled_and_the_rest_stay_published():
    ids = _due(40)
    many = ManyPublisher(fail_at=3)
    monitor = Monitor(conf=_conf(DISPATCH_BATCH=4, MONITOR_MIN_PENDING=8), publish=FlakyPublisher(), publish_many=many)

    with pytest.raises(KombuOperationalError):
        monitor.dispatch_once(housekeeping=False)

    published = [i for _, group in many.sent for i in group]
    assert published == ids[:8]
    assert set(Execution.objects.filter(status=S.PENDING).values_list("id", flat=True)) == set(ids[:8])
    assert set(Execution.objects.filter(status=S.SCHEDULED).values_list("id", flat=True)) == set(ids[8:])
    assert ExecutionEvent.objects.filter(to_status=S.SCHEDULED, detail=UNDONE).count() == 32

    retry = ManyPublisher()
    assert Monitor(
        conf=_conf(DISPATCH_BATCH=4, MONITOR_MIN_PENDING=8), publish=FlakyPublisher(), publish_many=retry
    ).dispatch_once(housekeeping=False) == (32, None)
    assert sorted(i for _, group in retry.sent for i in group) == ids[8:]


def test_the_monitor_sends_several_runs_through_the_broker_unless_told_otherwise():
    assert Monitor().publish_many is send_many


# --- the worker's service ------------------------------------------------------------------------


def _pending_noops(count: int) -> list[tuple[int, int]]:
    task = TaskFactory(runner="noop", misfire_grace=timedelta(hours=1))
    now = timezone.now()
    rows = [
        ExecutionFactory(task=task, scheduled_for=now - timedelta(seconds=i), status=S.PENDING) for i in range(count)
    ]
    return [(row.pk, row.attempt) for row in rows]


def _starts(execution_id: int) -> int:
    return ExecutionEvent.objects.filter(execution_id=execution_id, to_status=S.RUNNING).count()


@pytest.mark.django_db
def test_each_run_of_a_message_is_claimed_and_finished_and_a_redelivery_changes_nothing():
    items = _pending_noops(6)
    handed: list[list[tuple[int, int]]] = []

    def hand_on(rest):
        handed.append(rest)
        return True

    outcomes = worker_services.executions_run_batch(items=items, worker_id="w:1", hand_on=hand_on)
    assert outcomes == {"finished": 6} and handed == []
    assert set(Execution.objects.values_list("status", flat=True)) == {S.SUCCEEDED}

    # The same message again (its worker died before the ack): every claim loses, nothing reruns.
    again = worker_services.executions_run_batch(items=[list(i) for i in items], worker_id="w:2", hand_on=hand_on)
    assert again == {"lost": 6}
    assert [_starts(i) for i, _ in items] == [1] * 6


@pytest.mark.django_db
def test_runs_not_started_within_the_budget_are_handed_on_in_a_message_of_their_own(monkeypatch):
    items = _pending_noops(5)
    monkeypatch.setattr(worker_services, "HAND_ON_AFTER", -1.0)  # every run after the first is late
    handed: list[list[tuple[int, int]]] = []

    def hand_on(rest):
        handed.append(rest)
        return True

    outcomes = worker_services.executions_run_batch(items=items, worker_id="w:1", hand_on=hand_on)
    assert outcomes == {"finished": 1, "handed_on": 4}
    assert handed == [items[1:]]
    assert Execution.objects.get(pk=items[0][0]).status == S.SUCCEEDED
    assert set(Execution.objects.filter(pk__in=[i for i, _ in items[1:]]).values_list("status", flat=True)) == {
        S.PENDING
    }


@pytest.mark.django_db
def test_runs_that_could_not_be_handed_on_are_run_here(monkeypatch):
    items = _pending_noops(4)
    monkeypatch.setattr(worker_services, "HAND_ON_AFTER", -1.0)
    tries: list[int] = []

    def broker_down(rest):
        tries.append(len(rest))
        return False

    outcomes = worker_services.executions_run_batch(items=items, worker_id="w:1", hand_on=broker_down)
    assert outcomes == {"finished": 4}
    assert tries == [3]  # tried once, then carried on without asking again
    assert [_starts(i) for i, _ in items] == [1] * 4


# --- the running system --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_herd_published_in_shared_messages_starts_every_run_exactly_once():
    owner = UserFactory()
    env = {"TMS_MONITOR_MAX_SLEEP": "0.3", "TMS_DISPATCH_BATCH": "8", "TMS_MONITOR_QUEUE_SECONDS": "0"}
    worker, monitor = start_worker("herd", concurrency=2, **env), start_monitor("herd-monitor", **env)
    with running(worker, monitor):
        wait_worker_ready(worker)
        # One instant for all, a few seconds ahead: the monitor takes them in one pass.
        due = db_now() + timedelta(seconds=3)
        tasks = task_bulk_create(
            owner=owner, specs=[{"runner": "noop", "name": f"herd {i}", "start_at": due} for i in range(120)]
        )
        runs = Execution.objects.filter(task__owner=owner)
        wait_for(lambda: runs.filter(status=S.SUCCEEDED).count() == len(tasks), timeout=90, what="every run to succeed")
        monitor.stop()
        stats = json.loads(re.findall(r"monitor stats (\{.*\})", monitor.log())[-1])
    assert runs.count() == len(tasks)
    assert [_starts(i) for i in runs.values_list("id", flat=True)] == [1] * len(tasks)
    assert stats["published"] == len(tasks)
    # The runs shared messages: fewer messages than runs (each run was published once).
    assert stats["messages"] < stats["published"]


# Not inside the test's transaction: the task's start checks its connection (executions.tasks).
@pytest.mark.django_db(transaction=True)
def test_the_celery_task_hands_the_rest_on_with_the_message_priority_or_runs_it_if_the_broker_refuses(monkeypatch):
    from executions import tasks

    items = _pending_noops(3)
    monkeypatch.setattr(worker_services, "HAND_ON_AFTER", -1.0)
    sent: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(tasks.run_executions, "apply_async", lambda *args, **kwargs: sent.append((args, kwargs)))

    outcome = tasks.run_executions.apply(args=([list(i) for i in items],)).get()

    assert outcome == {"finished": 1, "handed_on": 2}
    assert sent == [((), {"args": (items[1:],), "priority": None, "retry": False})]

    def refused(*args, **kwargs):
        raise KombuOperationalError("[Errno 111] Connection refused")

    more = _pending_noops(3)
    monkeypatch.setattr(tasks.run_executions, "apply_async", refused)
    assert tasks.run_executions.apply(args=([list(i) for i in more],)).get() == {"finished": 3}


def test_a_lost_database_ends_the_message_for_a_retry_and_any_other_error_is_one_runs_own(monkeypatch):
    from django.db import OperationalError

    seen: list[int] = []

    def run(*, execution_id, attempt, worker_id):
        seen.append(execution_id)
        if execution_id == 2:
            raise failure
        return "finished"

    monkeypatch.setattr(worker_services, "execution_run", run)
    monkeypatch.setattr(worker_services, "CHUNK_SECONDS", 0.0)  # one by one
    # A chunk's claim takes none of them (as for runs of an exclusive task): each goes alone.
    monkeypatch.setattr(worker_services.transitions, "executions_claim_loaded", lambda **kwargs: {})
    items = [(1, 1), (2, 1), (3, 1)]

    failure: Exception = ValueError("a bug in one run's handling")
    assert worker_services.executions_run_batch(items=items, worker_id="w:1", hand_on=lambda rest: True) == {
        "finished": 2,
        "error": 1,
    }
    seen.clear()
    failure = OperationalError("server closed the connection unexpectedly")
    with pytest.raises(OperationalError):
        worker_services.executions_run_batch(items=items, worker_id="w:1", hand_on=lambda rest: True)
    assert seen == [1, 2]


# --- chunks: claimed together, successes recorded together ----------------------------------------


def _row_state(execution_id: int) -> tuple:
    row = Execution.objects.get(pk=execution_id)
    return (
        row.status,
        row.output,
        row.error,
        row.lease_owner,
        row.lease_expires_at,
        row.next_poll_at,
        row.started_at is not None,
        row.finished_at is not None and row.finished_at >= row.started_at,
        bool(row.external_run_id),
    )


def _events(execution_id: int) -> list[tuple[str, str, str, int]]:
    return list(
        ExecutionEvent.objects.filter(execution_id=execution_id)
        .order_by("id")
        .values_list("from_status", "to_status", "actor", "attempt")
    )


def _updates(queries) -> int:
    return sum(1 for query in queries if query["sql"].startswith("WITH done AS (") and "UPDATE " in query["sql"])


@pytest.mark.django_db
def test_a_slow_end_does_not_shrink_the_chunks_only_slow_launches_do(monkeypatch):
    # A chunk's claim and its successes are a statement each whatever its size: timed with the
    # launches, a slow end (a busy database, a workflow step created with it) made every chunk one
    # run, and a chain's steps went out one per message for good.
    import time

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    items = _pending_noops(4)
    real = worker_services.transitions.executions_succeed

    def slow(**kwargs):
        time.sleep(worker_services.CHUNK_SECONDS * 2)
        return real(**kwargs)

    monkeypatch.setattr(worker_services.transitions, "executions_succeed", slow)
    with CaptureQueriesContext(connection) as queries:
        assert worker_services.executions_run_batch(items=items, worker_id="w:1", hand_on=lambda rest: True) == {
            "finished": 4
        }
    assert _updates(queries.captured_queries) == 2 + 2  # the first alone, then the other three together


@pytest.mark.django_db
def test_a_chunk_writes_what_one_by_one_writes_in_a_statement_for_its_claims_and_one_for_its_successes(
    monkeypatch,
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    one_by_one, chunked = _pending_noops(6), _pending_noops(6)
    monkeypatch.setattr(worker_services, "CHUNK_SECONDS", 0.0)
    with CaptureQueriesContext(connection) as single:
        assert worker_services.executions_run_batch(items=one_by_one, worker_id="w:1", hand_on=lambda rest: True) == {
            "finished": 6
        }
    # Everything in one chunk: the pace of launches the first message measured carries over (a
    # process's first message handles its first run alone: test_runs_not_started_within_...).
    monkeypatch.setattr(worker_services, "CHUNK_SECONDS", 10.0)
    with CaptureQueriesContext(connection) as chunk:
        assert worker_services.executions_run_batch(items=chunked, worker_id="w:1", hand_on=lambda rest: True) == {
            "finished": 6
        }
    assert _updates(single.captured_queries) == 12  # a claim and a success each
    assert _updates(chunk.captured_queries) == 2  # one claim, one success for the six
    for (a, _), (b, _) in zip(one_by_one, chunked, strict=True):
        assert _row_state(a) == _row_state(b)
        assert _events(a) == _events(b)
    last, _ = chunked[-1]
    assert _row_state(last)[0] == S.SUCCEEDED
    assert [to for _, to, _, _ in _events(last)] == [S.SCHEDULED, S.RUNNING, S.SUCCEEDED]


@pytest.mark.django_db
def test_in_a_chunk_failures_and_runs_under_start_rules_are_recorded_one_by_one(monkeypatch):
    monkeypatch.setattr(worker_services, "CHUNK_SECONDS", 10.0)
    now = timezone.now()
    noop = TaskFactory(runner="noop", misfire_grace=timedelta(hours=1))
    failing = TaskFactory(
        runner="sleep", config={"duration": "1ms", "fail": True}, max_attempts=1, misfire_grace=timedelta(hours=1)
    )
    capped = TaskFactory(runner="noop", max_concurrency=1, misfire_grace=timedelta(hours=1))
    rows = [
        ExecutionFactory(task=noop, scheduled_for=now, status=S.PENDING),
        ExecutionFactory(task=failing, scheduled_for=now, status=S.PENDING),
        ExecutionFactory(task=noop, scheduled_for=now - timedelta(seconds=1), status=S.PENDING),
        ExecutionFactory(task=capped, scheduled_for=now, status=S.PENDING, exclusive=True),
        ExecutionFactory(task=noop, scheduled_for=now - timedelta(seconds=2), status=S.SUCCEEDED),  # taken already
    ]
    items = [(row.pk, row.attempt) for row in rows]

    outcomes = worker_services.executions_run_batch(items=items, worker_id="w:1", hand_on=lambda rest: True)

    assert outcomes == {"finished": 4, "lost": 1}
    assert [Execution.objects.get(pk=row.pk).status for row in rows] == [
        S.SUCCEEDED,
        S.FAILED,
        S.SUCCEEDED,
        S.SUCCEEDED,
        S.SUCCEEDED,
    ]
    assert [_starts(row.pk) for row in rows[:4]] == [1, 1, 1, 1]


@pytest.mark.django_db
def test_successes_written_together_are_each_fenced_by_attempt_and_lease():
    from executions import transitions

    items = _pending_noops(3)
    claimed = transitions.executions_claim_loaded(items=items, worker_id="w:1", lease_seconds=60)
    assert sorted(claimed) == sorted(i for i, _ in items)
    assert all(execution.task.runner == "noop" for execution in claimed.values())
    # The second lost its lease to another worker; the third is asked for with a stale attempt.
    Execution.objects.filter(pk=items[1][0]).update(lease_owner="w:2")
    successes = [
        transitions.Success(items[0][0], 1, 'out "quoted" \\ back\nline', "run-0"),
        transitions.Success(items[1][0], 1, "x"),
        transitions.Success(items[2][0], 2, "x"),
    ]
    won = transitions.executions_succeed(successes=successes, worker_id="w:1", max_chars=1000)
    assert won == {items[0][0]}
    first = Execution.objects.get(pk=items[0][0])
    assert (first.status, first.output, first.external_run_id, first.lease_owner) == (
        S.SUCCEEDED,
        'out "quoted" \\ back\nline',
        "run-0",
        "",
    )
    assert [Execution.objects.get(pk=i).status for i, _ in items[1:]] == [S.RUNNING, S.RUNNING]
    assert ExecutionEvent.objects.filter(to_status=S.SUCCEEDED).count() == 1
    # Claimed already: a second claim of the same runs takes nothing.
    assert transitions.executions_claim_loaded(items=items, worker_id="w:3", lease_seconds=60) == {}


@pytest.mark.django_db
def test_claimed_runs_behind_a_slow_launch_are_let_go_for_another_worker_to_launch(monkeypatch):
    monkeypatch.setattr(worker_services, "CHUNK_SECONDS", 10.0)
    monkeypatch.setattr(worker_services, "LET_GO_AFTER", 0.2)
    now = timezone.now()
    noop = TaskFactory(runner="noop", misfire_grace=timedelta(hours=1))
    slow = TaskFactory(runner="sleep", config={"duration": "400ms"}, misfire_grace=timedelta(hours=1))
    rows = [
        ExecutionFactory(task=noop, scheduled_for=now, status=S.PENDING),  # alone: measured fast
        ExecutionFactory(task=slow, scheduled_for=now, status=S.PENDING),  # then the chunk: slow first
        ExecutionFactory(task=noop, scheduled_for=now - timedelta(seconds=1), status=S.PENDING),
        ExecutionFactory(task=noop, scheduled_for=now - timedelta(seconds=2), status=S.PENDING),
    ]
    items = [(row.pk, row.attempt) for row in rows]

    outcomes = worker_services.executions_run_batch(items=items, worker_id="w:1", hand_on=lambda rest: True)

    assert outcomes == {"finished": 2, "deferred": 2}
    let_go = [Execution.objects.get(pk=row.pk) for row in rows[2:]]
    assert all(row.status == S.RUNNING and row.lease_owner == "" for row in let_go)
    assert all(row.next_poll_at <= timezone.now() for row in let_go)
    # The poll the monitor dispatches for them launches each on another worker, once.
    for row in let_go:
        assert worker_services.execution_resume(execution_id=row.pk, attempt=1, worker_id="w:2") == "finished"
    assert [Execution.objects.get(pk=row.pk).status for row in rows] == [S.SUCCEEDED] * 4
    assert [_starts(row.pk) for row in rows] == [1] * 4
