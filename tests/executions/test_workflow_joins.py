"""Workflows round 2 (issue 48, item 2): conditions on ``after`` links, join rules over them, and
skipped steps (recorded with their reason, followed by their followers' join rules, exactly once).

These drive the ends through the transitions directly (no monitor, no worker), as
tests/executions/test_workflows.py does; the API's side is tests/tasks_api/test_workflow_joins_api.py.
"""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connections

from executions import transitions
from executions.models import Execution, ExecutionOrigin, WorkflowSkip
from executions.models import ExecutionStatus as S
from executions.workflow_runs import SKIPPED, WAITING, workflow_run_read
from tasks_api.creation import task_create
from tasks_api.lifecycle import task_pause
from tasks_app.workflow_rules import condition_holds
from tests.workflows import WORKER, end

pytestmark = pytest.mark.django_db


def _link(task, on: str = "success", condition=None) -> dict:
    entry = {"task": str(task.pk), "on": on}
    if condition is not None:
        entry["condition"] = condition
    return entry


def _root(task) -> int:
    return Execution.objects.get(task=task).pk


def _step(task, workflow_run: int) -> Execution | None:
    return Execution.objects.filter(task=task, workflow_run=workflow_run, origin=ExecutionOrigin.WORKFLOW).first()


def _skip(task, workflow_run: int) -> str | None:
    return WorkflowSkip.objects.filter(task=task, workflow_run=workflow_run).values_list("reason", flat=True).first()


def test_conditions_on_the_upstream_s_output():
    doc = {"status": "ok", "items": [1, 2, 3], "n": 2.0, "flag": True, "nested": {"a b": [{"x": 1}]}}
    assert condition_holds({"path": "$.status", "op": "==", "value": "ok"}, doc)
    assert condition_holds({"path": "$.items.length", "op": ">=", "value": 3}, doc)
    assert condition_holds({"path": "$.items[-1]", "op": "==", "value": 3}, doc)
    assert condition_holds({"path": '$.nested["a b"][0].x', "op": "in", "value": [1, 5]}, doc)
    assert condition_holds({"path": "$.n", "op": "==", "value": 2}, doc)
    assert not condition_holds({"path": "$.flag", "op": "==", "value": 1}, doc), "true is not 1"
    assert not condition_holds({"path": "$.status", "op": "<", "value": 3}, doc), "a text against a number"
    # A missing path: exists is false, and every comparison is false, != and not in too.
    assert condition_holds({"path": "$.missing", "op": "exists", "value": False}, doc)
    assert not condition_holds({"path": "$.missing", "op": "!=", "value": 1}, doc)
    assert not condition_holds({"path": "$.missing", "op": "not in", "value": [1]}, doc)
    assert condition_holds(
        {"any": [{"path": "$.missing", "op": "exists"}, {"all": [{"not": {"path": "$.n", "op": ">", "value": 5}}]}]},
        doc,
    )


def test_a_condition_decides_whether_the_follower_runs_or_is_skipped_with_its_reason(user):
    a = task_create(owner=user, runner="noop", name="extract")
    big = task_create(
        owner=user, runner="noop", name="big", after=[_link(a, condition={"path": "$.rows", "op": ">", "value": 10})]
    )
    small = task_create(
        owner=user, runner="noop", name="small", after=[_link(a, condition={"path": "$.rows", "op": "<=", "value": 10})]
    )
    after_big = task_create(owner=user, runner="noop", name="after big", after=[_link(big)])
    root = _root(a)
    end(root, output=json.dumps({"rows": 3}))
    assert _step(big, root) is None and _step(small, root) is not None
    assert _skip(big, root) == "the condition on extract's output is false ($.rows > 10)"
    # Skipped transitively (all_success: a skipped upstream is not a success), once.
    assert _skip(after_big, root) == "big did not run"
    assert WorkflowSkip.objects.filter(workflow_run=root).count() == 2
    run = workflow_run_read(Execution.objects.get(pk=root))
    assert run.steps[big.pk].state == SKIPPED and "condition" in run.steps[big.pk].note
    assert run.steps[after_big.pk].note == "big did not run"


def test_join_rules_over_a_failed_and_a_succeeded_upstream(user):
    """a -> (ok, bad); each join's follower of (ok, bad) as the table in docs/workflows.md says."""
    a = task_create(owner=user, runner="noop", name="a")
    ok = task_create(owner=user, runner="noop", name="ok", after=[_link(a)])
    bad = task_create(owner=user, runner="noop", name="bad", after=[_link(a)])
    joins = {}
    for join in ("all_success", "all_done", "one_success", "one_failed", "none_failed"):
        joins[join] = task_create(owner=user, runner="noop", name=join, join=join, after=[_link(ok), _link(bad)])
    root = _root(a)
    end(root)
    end(_step(ok, root).pk, output='{"v": 1}')
    # As soon as one upstream satisfies: one_success runs now, from ok alone; all_done waits.
    early = _step(joins["one_success"], root)
    assert early is not None and early.input == {str(ok.pk): {"v": 1}} and early.upstream == [_step(ok, root).pk]
    assert _step(joins["all_done"], root) is None and _skip(joins["all_done"], root) is None
    end(_step(bad, root).pk, ok=False)
    ran = {join for join, task in joins.items() if _step(task, root) is not None}
    assert ran == {"all_done", "one_success", "one_failed"}
    assert _skip(joins["all_success"], root) == "bad failed; it runs on success"
    assert _skip(joins["none_failed"], root) == "bad failed (join none_failed)"
    assert _step(joins["one_failed"], root).upstream == [_step(bad, root).pk]
    assert sorted(_step(joins["all_done"], root).upstream) == sorted([_step(ok, root).pk, _step(bad, root).pk])
    assert Execution.objects.filter(workflow_run=root).count() == 1 + 2 + 3


def test_a_skipped_upstream_is_neither_a_success_nor_a_failure(user):
    """gate is skipped by its condition: all_done and none_failed followers still run, all_success
    and one_success are skipped, transitively and once each."""
    a = task_create(owner=user, runner="noop", name="a")
    other = task_create(owner=user, runner="noop", name="other", after=[_link(a)])
    gate = task_create(
        owner=user, runner="noop", name="gate", after=[_link(a, condition={"path": "$.go", "op": "==", "value": True})]
    )
    done = task_create(owner=user, runner="noop", name="done", join="all_done", after=[_link(gate), _link(other)])
    none_failed = task_create(
        owner=user, runner="noop", name="nf", join="none_failed", after=[_link(gate), _link(other)]
    )
    strict = task_create(owner=user, runner="noop", name="strict", after=[_link(gate), _link(other)])
    one = task_create(owner=user, runner="noop", name="one", join="one_success", after=[_link(gate)])
    below = task_create(owner=user, runner="noop", name="below", join="all_done", after=[_link(one)])
    root = _root(a)
    end(root, output='{"go": false}')
    assert _skip(gate, root) and _skip(strict, root) == "gate did not run"
    assert _skip(one, root) == "none of gate ended as asked (join one_success)"
    below_run = _step(below, root)
    assert below_run is not None and below_run.upstream == [] and below_run.input == {}
    assert _step(done, root) is None and _step(none_failed, root) is None  # other has not ended
    end(_step(other, root).pk, output='{"o": 1}')
    assert _step(done, root).input == {str(other.pk): {"o": 1}}
    assert _step(none_failed, root) is not None
    assert WorkflowSkip.objects.filter(workflow_run=root).count() == 3
    run = workflow_run_read(Execution.objects.get(pk=root))
    assert {run.steps[task.pk].state for task in (gate, strict, one)} == {SKIPPED}


def test_a_paused_step_is_skipped_and_its_followers_follow_their_join(user):
    a = task_create(owner=user, runner="noop", name="a")
    paused = task_create(owner=user, runner="noop", name="paused", after=[_link(a)])
    task_pause(task=paused, actor="test")
    cleanup = task_create(owner=user, runner="noop", name="cleanup", join="all_done", after=[_link(paused)])
    root = _root(a)
    end(root)
    assert _skip(paused, root) == "its task is paused"
    assert _step(cleanup, root) is not None


def test_a_retried_upstream_runs_a_step_that_was_skipped_and_the_run_shows_it(user):
    a = task_create(owner=user, runner="noop", name="a")
    b = task_create(owner=user, runner="noop", name="b", after=[_link(a)])
    c = task_create(owner=user, runner="noop", name="c", after=[_link(b)])
    root = _root(a)
    end(root)
    step_b = _step(b, root)
    end(step_b.pk, ok=False)
    assert _skip(c, root) == "b failed; it runs on success"
    retry = transitions.execution_retry(execution_id=step_b.pk, actor="test")
    Execution.objects.filter(pk=retry).update(status=S.PENDING)
    attempt = Execution.objects.get(pk=retry).attempt
    assert transitions.execution_claim_loaded(
        execution_id=retry, attempt=attempt, worker_id=WORKER, lease_seconds=60, checked=True
    )
    assert transitions.execution_succeed(
        execution_id=retry, attempt=attempt, worker_id=WORKER, output="", max_chars=100
    )
    assert _step(c, root).upstream == [retry]
    run = workflow_run_read(Execution.objects.get(pk=root))
    assert run.steps[c.pk].state == S.SCHEDULED, "a run of the step takes precedence over its skip"


def test_an_end_recorded_twice_records_the_skip_once(user):
    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=[_link(a, "failure")])
    task_create(owner=user, runner="noop", after=[_link(b)])
    root = _root(a)
    end(root)
    assert not transitions.execution_succeed(execution_id=root, attempt=1, worker_id=WORKER, output="", max_chars=10)
    assert WorkflowSkip.objects.filter(workflow_run=root).count() == 2


def test_the_workflow_run_page_reads_a_waiting_one_success_step(user):
    a = task_create(owner=user, runner="noop", name="a")
    b = task_create(owner=user, runner="noop", name="b", after=[_link(a)])
    c = task_create(owner=user, runner="noop", name="c", after=[_link(a)])
    d = task_create(owner=user, runner="noop", name="d", join="none_failed", after=[_link(b), _link(c)])
    root = _root(a)
    end(root)
    end(_step(b, root).pk, ok=False)
    run = workflow_run_read(Execution.objects.get(pk=root))
    assert run.steps[d.pk].state == SKIPPED and run.steps[d.pk].note == "b failed (join none_failed)"
    assert run.steps[c.pk].state == S.SCHEDULED
    e = task_create(owner=user, runner="noop", name="e", join="one_success", after=[_link(b), _link(c)])
    run = workflow_run_read(Execution.objects.get(pk=root))
    assert run.steps[e.pk].state == WAITING, "c may still succeed"


@pytest.mark.django_db(transaction=True)
def test_one_success_whose_upstreams_succeed_at_once_runs_once(user):
    """Two upstreams of a one_success step end in concurrent transactions: the step is created
    once, by whichever end takes the workflow run's lock first, never twice and never skipped."""
    a = task_create(owner=user, runner="noop")
    b = task_create(owner=user, runner="noop", after=[_link(a)])
    c = task_create(owner=user, runner="noop", after=[_link(a)])
    d = task_create(owner=user, runner="noop", join="one_success", after=[_link(b), _link(c)])
    for attempt in range(3):
        root = transitions.execution_trigger(task_id=a.pk, actor="test")
        end(root)
        steps = [_step(b, root).pk, _step(c, root).pk]
        for pk, worker in zip(steps, ("wb", "wc"), strict=True):
            Execution.objects.filter(pk=pk).update(status=S.PENDING)
            assert transitions.execution_claim_loaded(
                execution_id=pk, attempt=1, worker_id=f"{worker}{attempt}", lease_seconds=60, checked=True
            )
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def finish(execution_id: int, worker: str, barrier=barrier, errors=errors) -> None:
            try:
                barrier.wait()
                assert transitions.execution_succeed(
                    execution_id=execution_id, attempt=1, worker_id=worker, output="{}", max_chars=100
                )
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [
            threading.Thread(target=finish, args=(steps[0], f"wb{attempt}")),
            threading.Thread(target=finish, args=(steps[1], f"wc{attempt}")),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert Execution.objects.filter(task=d, workflow_run=root).count() == 1
        assert not WorkflowSkip.objects.filter(workflow_run=root).exists()


def test_why_names_the_condition_and_the_join_of_a_step(user):
    from tasks_api.selectors.fate import workflow_cause

    a = task_create(owner=user, runner="noop", name="a")
    b = task_create(owner=user, runner="noop", name="b")
    c = task_create(
        owner=user,
        runner="noop",
        name="c",
        join="one_success",
        after=[_link(a, condition={"path": "$.ok", "op": "==", "value": True}), _link(b)],
    )
    root = _root(a)
    end(root, output='{"ok": true}')
    step = _step(c, root)
    assert workflow_cause(step) == (
        f"created because a run #{root} succeeded (after: on success if $.ok == true) (join one_success),"
        f" in workflow run #{root}"
    )


def test_pruning_a_root_removes_its_workflow_run_s_skip_records(user):
    from executions.retention import PruneReport, _archive_batch

    a = task_create(owner=user, runner="noop")
    task_create(owner=user, runner="noop", after=[_link(a, "failure")])
    root = _root(a)
    end(root)
    assert WorkflowSkip.objects.filter(workflow_run=root).count() == 1
    _archive_batch([root], {a.pk: user.pk}, PruneReport(dry_run=False))
    assert not Execution.objects.filter(pk=root).exists()
    assert not WorkflowSkip.objects.filter(workflow_run=root).exists()
