"""A claim whose answer was lost: the claim committed on the server and the connection dropped
before its answer reached the worker (a PostgreSQL failover). The worker claims again, finds the
run RUNNING and leased to itself, and takes its own claim back
(``transitions.execution_take_back``): the run is launched once and ends, instead of waiting,
launched by nobody, for its lease to run out (issue 45).

The answer is really lost: the worker's connection goes through a TCP proxy that drops
PostgreSQL's answer to the claim statement (up to its ReadyForQuery, so the claim has committed)
and cuts the connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connection

from executions import transitions, worker_services
from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.tasks import drop_unusable_connections
from executions.transitions.worker import TAKE_BACK_DETAIL
from tasks_api.creation import task_create
from tests.factories import TaskFactory, UserFactory
from tests.tcp_proxy import TcpProxy
from tooling.harness.ledger import LedgerServer

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "test-host:101:202"


@pytest.fixture
def ledger() -> Iterator[LedgerServer]:
    server = LedgerServer(default_duration=0.0).start()
    yield server
    server.stop()


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    """This process's database connection goes through a proxy that can lose an answer."""
    db = connection.settings_dict
    saved = (db["HOST"], db["PORT"])
    tcp = TcpProxy(int(db["PORT"] or 5432), db["HOST"] or "127.0.0.1")
    connection.close()
    db["HOST"], db["PORT"] = "127.0.0.1", str(tcp.port)
    yield tcp
    connection.close()
    db["HOST"], db["PORT"] = saved
    tcp.close()


def _is_claim(sql: str) -> bool:
    return sql.lstrip().startswith("WITH done AS (UPDATE") and '"started_at"' in sql and '"lease_owner"' in sql


def _losing_the_claims_answer(proxy: TcpProxy):
    """A query wrapper that loses the answer to the first claim statement."""

    def wrapper(execute, sql, params, many, context):
        if not proxy.answers_lost and not proxy._losing.is_set() and _is_claim(sql):
            proxy.lose_next_answer()
        return execute(sql, params, many, context)

    return wrapper


def _pending_runs(ledger: LedgerServer, count: int) -> list[Execution]:
    """``count`` runs of http tasks against the ledger, published (PENDING) as the monitor does."""
    owner = UserFactory()
    tasks = [
        task_create(owner=owner, runner="http", config={"url": ledger.url, "method": "POST"}, name=f"lost-{n}")
        for n in range(count)
    ]
    ids = list(Execution.objects.filter(task__in=tasks).values_list("pk", flat=True))
    assert len(ids) == count
    taken = transitions.executions_take_due(limit=count, actor="monitor", among=ids)
    assert len(taken) == count
    return list(Execution.objects.filter(pk__in=ids).order_by("pk"))


def _celery_retry(handle):
    """Handle a message as a worker process does: a lost connection ends the handling and Celery
    (``autoretry_for``) delivers the message again, here to the same process."""
    try:
        return handle()
    except worker_services.RETRIED_DB_ERRORS:
        drop_unusable_connections()  # what the worker does before each message (task_prerun)
        return handle()


def _assert_ran_once(run: Execution, ledger: LedgerServer) -> None:
    run.refresh_from_db()
    assert run.status == S.SUCCEEDED, (run.status, run.lease_owner, list(run.events.values_list("detail", flat=True)))
    assert run.attempt == 1
    claims = run.events.filter(from_status=S.PENDING, to_status=S.RUNNING).count()
    assert claims == 1
    assert run.events.filter(to_status=S.SUCCEEDED).count() == 1


def test_a_claim_whose_answer_was_lost_is_taken_back_and_the_run_launched_once(ledger, proxy):
    (run,) = _pending_runs(ledger, 1)

    with connection.execute_wrapper(_losing_the_claims_answer(proxy)):
        word = _celery_retry(lambda: worker_services.execution_run(execution_id=run.pk, attempt=1, worker_id=WORKER))

    assert proxy.answers_lost == 1  # the claim's answer really went missing
    assert word == "finished"
    _assert_ran_once(run, ledger)
    assert sum(ledger.ledger.launches.values()) == 1
    assert ledger.ledger.duplicate_launches() == 0
    assert run.events.filter(detail=TAKE_BACK_DETAIL, actor=WORKER).count() == 1


def test_a_batch_claim_whose_answer_was_lost_is_taken_back_run_by_run(ledger, proxy):
    runs = _pending_runs(ledger, 3)
    items = [(run.pk, 1) for run in runs]
    handed_on: list[list[tuple[int, int]]] = []

    def hand_on(rest: list[tuple[int, int]]) -> bool:
        handed_on.append(rest)
        return True

    worker_services._pace.seconds = 0.001  # the three runs in one chunk: one claim statement
    with connection.execute_wrapper(_losing_the_claims_answer(proxy)):
        outcomes = _celery_retry(
            lambda: worker_services.executions_run_batch(items=items, worker_id=WORKER, hand_on=hand_on)
        )

    assert proxy.answers_lost == 1
    assert outcomes["finished"] == 3, outcomes
    assert not handed_on
    for run in runs:
        _assert_ran_once(run, ledger)
    assert sum(ledger.ledger.launches.values()) == 3
    assert ledger.ledger.duplicate_launches() == 0


def test_only_the_claimant_takes_its_claim_back():
    """Another worker's claim, a run already launched, or one handed back is not taken back."""
    task = TaskFactory()
    (pk,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, task.start_at - timedelta(seconds=1), 5)], actor="test"
    )
    Execution.objects.filter(pk=pk).update(status=S.RUNNING, lease_owner="other:1:2")

    def take_back() -> Execution | None:
        return transitions.execution_take_back(execution_id=pk, attempt=1, worker_id=WORKER, lease_seconds=30)

    assert take_back() is None
    Execution.objects.filter(pk=pk).update(lease_owner=WORKER, external_run_id="run-1")
    assert take_back() is None
    Execution.objects.filter(pk=pk).update(external_run_id="", orphaned=True)
    assert take_back() is None
    Execution.objects.filter(pk=pk).update(orphaned=False)
    taken = take_back()
    assert taken is not None and taken.task.pk == task.pk and taken.lease_owner == WORKER
    assert Execution.objects.get(pk=pk).events.filter(detail=TAKE_BACK_DETAIL).count() == 1
