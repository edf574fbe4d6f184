"""Transitions on the hot path compile their UPDATE once per process (``sql.write_prepared``) and
bind each call's values into it: the statement they run must be, to the character, the one the
ORM compiles for the same values (``sql.write``), whatever the shape and on every later call."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from executions import transitions
from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.transitions import sql, states
from executions.transitions.worker import _CLAIMED, _CLAIMED_SEVERAL, claim_write, succeed_alone_write
from tests.factories import ExecutionFactory, TaskFactory

pytestmark = pytest.mark.django_db
WORKER = "host:1:1"


def _statement(call) -> str:
    with CaptureQueriesContext(connection) as queries:
        call()
    (query,) = queries.captured_queries
    return query["sql"]


def _pending(task) -> Execution:
    execution = ExecutionFactory(task=task)
    Execution.objects.filter(pk=execution.pk).update(status=S.PENDING)
    return execution


@pytest.mark.parametrize("exclusive", [False, True])
def test_the_claim_runs_the_statement_the_orm_compiles(exclusive):
    task = TaskFactory()
    for execution in (_pending(task), _pending(task), _pending(task)):  # the first call compiles
        Execution.objects.filter(pk=execution.pk).update(exclusive=exclusive)
        prepared = _statement(
            lambda e=execution: transitions.execution_claim_loaded(
                execution_id=e.pk, attempt=1, worker_id=WORKER, lease_seconds=30, exclusive=exclusive
            )
        )
        assert Execution.objects.get(pk=execution.pk).status == S.RUNNING
        Execution.objects.filter(pk=execution.pk).update(status=S.PENDING)
        condition, values = claim_write(
            execution.pk, 1, WORKER, timedelta(seconds=30), exclusive=exclusive, checked=False
        )
        compiled = _statement(
            lambda c=condition, v=values: sql.write(states.CLAIM, c, v, actor=WORKER, returning="*", select=_CLAIMED)
        )
        assert prepared == compiled
        assert str(execution.pk) in prepared and WORKER in prepared


@pytest.mark.parametrize("worker_id", [WORKER, None])
@pytest.mark.parametrize("external_run_id", ["", "run-7"])
def test_the_success_runs_the_statement_the_orm_compiles(worker_id, external_run_id):
    task = TaskFactory()
    for index in range(3):
        execution = ExecutionFactory(task=task)
        Execution.objects.filter(pk=execution.pk).update(status=S.RUNNING, lease_owner=WORKER)
        output = f"output {index} with 'quotes' and %s"
        prepared = _statement(
            lambda e=execution, o=output: transitions.execution_succeed(
                execution_id=e.pk,
                attempt=1,
                worker_id=worker_id,
                output=o,
                max_chars=10_000,
                external_run_id=external_run_id or None,
            )
        )
        assert Execution.objects.get(pk=execution.pk).status == S.SUCCEEDED
        Execution.objects.filter(pk=execution.pk).update(status=S.RUNNING, lease_owner=WORKER)
        bound = {"worker_id": worker_id} if worker_id else {}
        if external_run_id:
            bound["external_run_id"] = external_run_id
        # A task nobody follows: the success is written alone (its condition says so).
        condition, values = succeed_alone_write(execution.pk, 1, output, **bound)
        compiled = _statement(
            lambda c=condition, v=values: sql.write(states.SUCCEED, c, v, actor=worker_id or "callback")
        )
        assert prepared == compiled
        assert output.replace("'", "''") in prepared


def test_a_value_that_does_not_reach_the_statement_is_refused():
    def build(execution_id: int, ignored: str):
        return sql.Q(pk=execution_id), {"lease_owner": "x"}

    with pytest.raises(ValueError, match="ignored"):
        sql.write_prepared(
            states.LEASE, "test-unbound", build, {"execution_id": 1, "ignored": "y"}, actor="t", source=S.RUNNING
        )


@pytest.mark.parametrize("count", [2, 5])
def test_the_claim_of_several_runs_the_statement_the_orm_compiles(count):
    from executions.transitions.worker import claim_several_write

    task = TaskFactory()
    for _ in range(3):  # the first call compiles
        executions = [_pending(task) for _ in range(count)]
        items = [(execution.pk, 1) for execution in executions]
        prepared = _statement(
            lambda i=items: transitions.executions_claim_loaded(items=i, worker_id=WORKER, lease_seconds=30)
        )
        assert set(Execution.objects.filter(pk__in=[i for i, _ in items]).values_list("status", flat=True)) == {
            S.RUNNING
        }
        Execution.objects.filter(pk__in=[i for i, _ in items]).update(status=S.PENDING)
        ids = {f"id{index}": execution_id for index, (execution_id, _) in enumerate(items)}
        condition, values = claim_several_write(1, WORKER, timedelta(seconds=30), **ids)
        compiled = _statement(
            lambda c=condition, v=values: sql.write(
                states.CLAIM, c, v, actor=WORKER, returning="*", select=_CLAIMED_SEVERAL
            )
        )
        assert prepared == compiled
        assert all(str(execution_id) in prepared for execution_id, _ in items)
