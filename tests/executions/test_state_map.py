"""Every transition's WHERE clause matches the state map.

For each edge the package declares (``executions.transitions.states.EDGES``) and each status S,
a row is put in S and the transitions of that edge are called the way their callers call them:
the edge must win exactly from its declared sources, and the edges into each target must
together accept exactly the map's sources (``ALLOWED_SOURCES``). A transition whose query
accepted a status the map does not allow (or refused one it allows) fails here, whatever the
map says."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from executions import transitions
from executions.models import Execution, SkippedOccurrence
from executions.models import ExecutionStatus as S
from executions.transitions import states
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

STATUSES = list(S.values)
WORKER = "w:1:1"


def _row(status: str, *, task_fields: dict | None = None, sibling: str | None = None, **fields) -> Execution:
    """An execution in ``status`` (attempt 1, leased to WORKER, due and published long ago,
    created on request so no start rule looks at it unless ``fields`` say otherwise), with a
    RUNNING sibling if asked."""
    task = TaskFactory(**(task_fields or {}))
    now = timezone.now()
    if sibling:
        (other,) = transitions.executions_create(
            rows=[transitions.NewExecution(task.pk, now - timedelta(hours=2), 5)], actor="test"
        )
        Execution.objects.filter(pk=other).update(status=sibling, lease_owner="w0", started_at=now)
    (pk,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, now - timedelta(hours=1), 5)], actor="test"
    )
    values = {
        "status": status,
        "origin": "trigger",
        "lease_owner": WORKER,
        "lease_expires_at": now + timedelta(minutes=5),
        "message_id": f"m-{pk}",
        "enqueued_at": now - timedelta(hours=1),
        "due_at": now - timedelta(seconds=0.5),
    } | fields
    Execution.objects.filter(pk=pk).update(**values)
    row = Execution.objects.get(pk=pk)
    _ready()
    return row


#: Where the statements of the transition under test start in the query log (after the setup).
_MARK = [0]


def _ready() -> None:
    _MARK[0] = len(connection.queries_log)


#: A status condition in SQL as Django and psycopg2 write it.
_STATUS = re.compile(r'"status" (?:= \'(\w+)\'|IN \(([^)]*)\))')


#: An UPDATE of executions: what it sets, and its WHERE clause.
_UPDATE = re.compile(r'UPDATE "executions_execution" SET (.*?) WHERE (.*?)(?: RETURNING|$)', re.S)


def _statuses(text: str) -> set[str]:
    found = set()
    for single, many in _STATUS.findall(text):
        found |= {single} if single else {part.strip().strip("'") for part in many.split(",")}
    return found


def _check_sql(statements: list[str]) -> int:
    """Each UPDATE of an execution's row issued by a transition accepts, in its WHERE clause,
    only statuses the map allows for the status it sets (or, setting none, one status it keeps)."""
    checked = 0
    for text in statements:
        update = _UPDATE.search(text)
        if update is None:
            continue
        target, accepted = _statuses(update.group(1)), _statuses(update.group(2))
        assert accepted, f"an UPDATE without a status condition: {text}"
        if target:
            (status,) = target
            assert accepted <= states.ALLOWED_SOURCES[status], text
        else:
            assert len(accepted) == 1, text
        checked += 1
    return checked


def _claim_exclusive(row: Execution) -> str:
    return transitions.execution_claim_exclusive(
        execution_id=row.pk, attempt=1, worker_id="w:2:2", lease_seconds=60
    ).outcome


def _skipped(row: Execution) -> bool:
    row.refresh_from_db()
    return row.status == S.CANCELLED and SkippedOccurrence.objects.filter(execution_id=row.pk).exists()


def _stale(status: str, **fields) -> Execution:
    """A scheduled first attempt an hour late, of a task whose misfire policy drops it."""
    task_fields = {"misfire_policy": "skip", "misfire_grace": timedelta(seconds=1)}
    return _row(
        status, task_fields=task_fields, origin="schedule", due_at=timezone.now() - timedelta(hours=1), **fields
    )


def _take_drops(status: str) -> bool:
    row = _stale(status)
    transitions.executions_take_due(limit=1000, actor="m")
    return _skipped(row)


def _claim_drops(status: str) -> bool:
    row = _stale(status, exclusive=True)
    return _claim_exclusive(row) == "skipped" and _skipped(row)


def _overlap_skips(status: str) -> bool:
    row = _row(status, task_fields={"overlap_policy": "skip"}, sibling=S.RUNNING, exclusive=True)
    return _claim_exclusive(row) == "skipped" and _skipped(row)


def _taken(status: str) -> bool:
    row = _row(status)
    return row.pk in [d.execution_id for d in transitions.executions_take_due(limit=1000, actor="m")]


def _republished(status: str) -> bool:
    row = _row(status)
    taken = transitions.executions_take_stale_pending(limit=1000, older_than=60, actor="m")
    return row.pk in [d.execution_id for d in taken]


def _untaken(status: str) -> bool:
    row = _row(status)
    dispatch = transitions.Dispatch(row.pk, 1, 5, row.message_id)
    return transitions.executions_untake(dispatches=[dispatch], actor="m", reason="test") == 1


def _claimed(status: str) -> bool:
    row = _row(status)
    return (
        transitions.execution_claim_loaded(execution_id=row.pk, attempt=1, worker_id="w:2:2", lease_seconds=60)
        is not None
    )


def _claimed_together(status: str) -> bool:
    """A chunk of a message of several runs, claimed in one statement."""
    row = _row(status)
    return row.pk in transitions.executions_claim_loaded(items=[(row.pk, 1)], worker_id="w:2:2", lease_seconds=60)


def _claimed_late(status: str) -> bool:
    """A stale run its misfire policy runs as a catch-up: the fast claim refuses it, the checked
    claim takes it."""
    task_fields = {"misfire_policy": "run_once", "misfire_grace": timedelta(seconds=1)}
    row = _row(status, task_fields=task_fields, origin="schedule", due_at=timezone.now() - timedelta(hours=1))
    return _claim_exclusive(row) == "claimed"


def _outcome(status: str, retry_in: float | None) -> str | None:
    row = _row(status)
    return transitions.execution_fail(
        execution_id=row.pk, attempt=1, worker_id=WORKER, error="e", output="", retry_in=retry_in, max_chars=100
    )


def _succeeded(status: str) -> bool:
    row = _row(status)
    return transitions.execution_succeed(execution_id=row.pk, attempt=1, worker_id=WORKER, output="", max_chars=100)


def _succeeded_together(status: str) -> bool:
    row = _row(status)
    successes = [transitions.Success(row.pk, 1, "")]
    return row.pk in transitions.executions_succeed(successes=successes, worker_id=WORKER, max_chars=100)


def _queued(status: str) -> bool:
    row = _row(status, task_fields={"overlap_policy": "queue_one"}, sibling=S.RUNNING, exclusive=True)
    return _claim_exclusive(row) == "queued"


def _capped(status: str) -> bool:
    row = _row(status, task_fields={"max_concurrency": 1}, sibling=S.RUNNING, exclusive=True)
    return _claim_exclusive(row) == "waiting"


def _cancelled(status: str) -> bool:
    row = _row(status)
    return transitions.execution_cancel(execution_id=row.pk, actor="user").won


def _cancelled_previous(status: str) -> bool:
    """The overlap policy cancel_previous cancels the running sibling (here: the row itself)."""
    row = _row(status)
    task = row.task
    task.__class__.objects.filter(pk=task.pk).update(overlap_policy="cancel_previous")
    (next_id,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, timezone.now(), 5, exclusive=True)], actor="test"
    )
    Execution.objects.filter(pk=next_id).update(status=S.PENDING, origin="trigger")
    _ready()
    claim = transitions.execution_claim_exclusive(execution_id=next_id, attempt=1, worker_id="w:2:2", lease_seconds=60)
    return row.pk in [i for i, _ in claim.cancelled]


def _extended(status: str) -> bool:
    row = _row(status)
    return transitions.execution_extend_lease(execution_id=row.pk, attempt=1, worker_id=WORKER, lease_seconds=60)


def _handed_back(status: str) -> bool:
    row = _row(status, lease_expires_at=timezone.now() - timedelta(minutes=1))
    transitions.executions_take_polls(limit=1000, in_flight_for=60, actor="m")
    return row.events.filter(detail__contains="handed back").exists()


def _resumed(status: str) -> bool:
    row = _row(status, lease_owner="", orphaned=True)
    return transitions.execution_acquire(execution_id=row.pk, attempt=1, worker_id="w:2:2", lease_seconds=60)


def _taken_back(status: str) -> bool:
    """The claimant takes back its own claim whose answer it lost."""
    row = _row(status)
    taken = transitions.execution_take_back(execution_id=row.pk, attempt=1, worker_id=WORKER, lease_seconds=60)
    return taken is not None


def _released(status: str) -> bool:
    row = _row(
        status,
        task_fields={"max_concurrency": 1},
        waiting="max_concurrency 1",
        due_at=timezone.now() + timedelta(hours=1),
    )
    return transitions.executions_release_waiting(task_id=row.task_id) == 1


#: For each edge, the ways its transitions are called (each says whether it won).
DRIVERS: dict[str, list[Callable[[str], bool]]] = {
    "take": [_taken],
    "republish": [_republished],
    "untake": [_untaken],
    "claim": [_claimed, _claimed_together, _claimed_late],
    "succeed": [_succeeded, _succeeded_together],
    "fail": [lambda status: _outcome(status, None) == S.FAILED],
    "retry_later": [lambda status: _outcome(status, 5.0) == S.SCHEDULED],
    "wait": [_queued, _capped],
    "skip": [_take_drops, _claim_drops, _overlap_skips],
    "cancel": [_cancelled, _cancelled_previous],
    "lease": [_extended],
    "handback": [_handed_back],
    "resume": [_resumed],
    "take_back": [_taken_back],
    "release_waiting": [_released],
}


def test_every_edge_is_driven():
    assert set(DRIVERS) == set(states.EDGES)


def test_the_edges_into_each_target_accept_exactly_the_maps_sources():
    for target, sources in states.ALLOWED_SOURCES.items():
        edges = [e for e in states.EDGES.values() if e.target == target and not e.keeps]
        assert frozenset().union(*(e.sources for e in edges)) == sources, target
    assert transitions.ALLOWED_SOURCES is states.ALLOWED_SOURCES


@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_each_transition_wins_exactly_from_its_edges_sources(name):
    """Each way of calling an edge's transitions wins only from the edge's sources; together
    they win from every one of them."""
    edge = states.EDGES[name]
    accepted: set[str] = set()
    checked = 0
    for drive in DRIVERS[name]:
        won = set()
        for status in STATUSES:
            with CaptureQueriesContext(connection):
                if drive(status):
                    won.add(status)
                checked += _check_sql([query["sql"] for query in list(connection.queries_log)[_MARK[0] :]])
        assert won <= edge.sources, f"{name} via {getattr(drive, '__name__', drive)}: won from {won}"
        accepted |= won
    assert accepted == edge.sources, name
    assert checked >= len(edge.sources), "the statements it issued were read"


def test_the_fast_claim_refuses_exclusive_rows_whatever_their_status():
    for status in STATUSES:
        row = _row(status, exclusive=True)
        assert (
            transitions.execution_claim_loaded(execution_id=row.pk, attempt=1, worker_id="w", lease_seconds=60) is None
        )
    assert not Execution.objects.filter(status=S.RUNNING, lease_owner="w").exists()
