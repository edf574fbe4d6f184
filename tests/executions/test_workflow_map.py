"""Workflows round 2 (issue 48, item 3): map steps. A task with ``map_over`` runs once per item of
a list in its upstream's output (each item its run's input, ``map_index`` its place), at most
``map_concurrency`` at once, and what follows it gets the items' outputs in order, once.

These drive the ends through the transitions directly (no monitor, no worker), as
tests/executions/test_workflow_joins.py does.
"""

from __future__ import annotations

import gzip
import json
import threading

import pytest
from django.db import connections

from executions import transitions
from executions.models import Approval, Execution, WorkflowMap, WorkflowRunControl, WorkflowRunHold
from executions.models import ExecutionStatus as S
from executions.transitions.resume import held_ends
from executions.workflow_runs import workflow_run_read
from tasks_api.creation import task_create
from tests.workflows import WORKER, end

pytestmark = pytest.mark.django_db


def _link(task, on: str = "success") -> dict:
    return {"task": str(task.pk), "on": on}


def _items(task, workflow_run: int) -> list[Execution]:
    return list(Execution.objects.filter(task=task, workflow_run=workflow_run).order_by("map_index", "id"))


def _flow(user, *, concurrency: int = 10, join_on: str = "success"):
    """list -> each (map over $.files) -> summary."""
    listing = task_create(owner=user, runner="noop", name="list")
    each = task_create(
        owner=user, runner="noop", name="each", after=[_link(listing)], map_over="$.files", map_concurrency=concurrency
    )
    summary = task_create(owner=user, runner="noop", name="summary", after=[_link(each, join_on)])
    return listing, each, summary


def _start(listing, files) -> int:
    root = transitions.execution_trigger(task_id=listing.pk, actor="test")
    end(root, output=json.dumps({"files": files}))
    return root


def test_each_item_gets_a_run_with_the_item_as_its_input_and_the_join_gets_the_outputs_in_order(user):
    listing, each, summary = _flow(user)
    root = _start(listing, ["a.csv", {"name": "b.csv"}, 3])
    items = _items(each, root)
    assert [(run.map_index, run.input, run.upstream, run.status) for run in items] == [
        (0, {"item": "a.csv"}, [root], S.SCHEDULED),
        (1, {"name": "b.csv"}, [root], S.SCHEDULED),
        (2, {"item": 3}, [root], S.SCHEDULED),
    ]
    assert not Execution.objects.filter(task=summary).exists()
    for run in reversed(items):  # in any order: the result is in the items' order
        assert not Execution.objects.filter(task=summary).exists()
        end(run.pk, output=json.dumps({"rows": run.map_index}))
    (step,) = Execution.objects.filter(task=summary, workflow_run=root)
    assert step.input == [{"rows": 0}, {"rows": 1}, {"rows": 2}]
    assert step.upstream == [items[0].pk], "the end that ended the map step"
    record = WorkflowMap.objects.get(task=each, workflow_run=root)
    assert (record.status, record.error) == (S.SUCCEEDED, "")
    steps = workflow_run_read(Execution.objects.get(pk=root)).steps
    assert steps[each.pk].items == {S.SUCCEEDED: 3}
    assert steps[each.pk].state == S.SUCCEEDED


def test_at_most_map_concurrency_items_run_and_the_next_start_as_items_end(user):
    listing, each, summary = _flow(user, concurrency=2)
    root = _start(listing, list(range(5)))
    assert [run.map_index for run in _items(each, root)] == [0, 1]
    end(_items(each, root)[1].pk, output='{"n": 1}')
    assert [run.map_index for run in _items(each, root)] == [0, 1, 2]
    active = [run for run in _items(each, root) if run.status == S.SCHEDULED]
    assert [run.map_index for run in active] == [0, 2]
    for expected in ([0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]):
        runs = _items(each, root)
        end(next(run for run in runs if run.status == S.SCHEDULED).pk, output="{}")
        assert [run.map_index for run in _items(each, root)] == expected
        assert sum(run.status == S.SCHEDULED for run in _items(each, root)) <= 2
    assert Execution.objects.filter(task=summary, workflow_run=root).count() == 1


def test_an_empty_list_ends_the_map_step_at_once_and_its_follower_gets_an_empty_list(user):
    listing, each, summary = _flow(user)
    root = _start(listing, [])
    assert _items(each, root) == []
    (step,) = Execution.objects.filter(task=summary, workflow_run=root)
    assert step.input == []
    assert WorkflowMap.objects.get(task=each, workflow_run=root).status == S.SUCCEEDED


def test_no_list_at_the_path_fails_the_map_step_with_why(user):
    listing, each, summary = _flow(user, join_on="failure")
    root = transitions.execution_trigger(task_id=listing.pk, actor="test")
    end(root, output=json.dumps({"files": "a.csv"}))
    assert _items(each, root) == []
    record = WorkflowMap.objects.get(task=each, workflow_run=root)
    assert record.status == S.FAILED and record.error == (
        f"map_over $.files: a text, not a list, in the output of execution {root}"
    )
    (step,) = Execution.objects.filter(task=summary, workflow_run=root)
    assert step.input == {"output": "", "error": record.error}


def test_a_failed_item_fails_the_map_step_and_its_failure_path_gets_every_item(user):
    listing, each, summary = _flow(user, join_on="completion")
    on_success = task_create(owner=user, runner="noop", name="on success", after=[_link(each)])
    root = _start(listing, ["a", "b"])
    first, second = _items(each, root)
    end(first.pk, ok=False)
    assert not Execution.objects.filter(task=summary).exists(), "the other item still runs"
    end(second.pk, output='{"ok": true}')
    (step,) = Execution.objects.filter(task=summary, workflow_run=root)
    assert step.input == [{"output": "", "error": "boom"}, {"ok": True}]
    assert not Execution.objects.filter(task=on_success).exists()
    record = WorkflowMap.objects.get(task=each, workflow_run=root)
    assert record.status == S.FAILED and record.error == "1 of 2 items failed; item 0: boom"
    steps = workflow_run_read(Execution.objects.get(pk=root)).steps
    assert steps[each.pk].items == {S.FAILED: 1, S.SUCCEEDED: 1}


def test_an_item_s_retry_stays_the_same_item_and_its_success_ends_the_step_after_all(user):
    listing, each, summary = _flow(user)
    root = _start(listing, ["a", "b"])
    first, second = _items(each, root)
    end(second.pk, output='{"b": 1}')
    end(first.pk, ok=False)
    assert not Execution.objects.filter(task=summary).exists(), "the map step failed; summary runs on success"
    retry = transitions.execution_retry(execution_id=first.pk, actor="test")
    again = Execution.objects.get(pk=retry)
    assert (again.map_index, again.retry_of_id, again.input, again.workflow_run) == (0, first.pk, {"item": "a"}, root)
    Execution.objects.filter(pk=retry).update(status=S.PENDING)
    assert transitions.execution_claim_loaded(
        execution_id=retry, attempt=again.attempt, worker_id=WORKER, lease_seconds=60, checked=True
    )
    assert transitions.execution_succeed(
        execution_id=retry, attempt=again.attempt, worker_id=WORKER, output='{"a": 1}', max_chars=100
    )
    (step,) = Execution.objects.filter(task=summary, workflow_run=root)
    assert step.input == [{"a": 1}, {"b": 1}]


def test_an_end_recorded_twice_creates_nothing_twice(user):
    listing, each, summary = _flow(user, concurrency=1)
    root = _start(listing, ["a", "b"])
    (first,) = _items(each, root)
    end(first.pk, output="{}")
    again = transitions.execution_succeed(execution_id=first.pk, attempt=1, worker_id=WORKER, output="{}", max_chars=10)
    assert not again
    assert [run.map_index for run in _items(each, root)] == [0, 1]
    end(_items(each, root)[1].pk, output="{}")
    assert Execution.objects.filter(task=summary, workflow_run=root).count() == 1
    # A resume would start nothing more: the items are no ends of their task, the step's end was followed.
    assert [end.items for end in held_ends(root) if end.task_id == each.pk] == []


@pytest.mark.django_db(transaction=True)
def test_the_last_two_items_ending_at_once_start_the_join_once(user):
    """The last two items end in concurrent transactions: the join is created once, by whichever
    end takes the workflow run's lock second, never twice and never not at all."""
    listing, each, summary = _flow(user)
    for attempt in range(3):
        root = _start(listing, ["a", "b"])
        items = [run.pk for run in _items(each, root)]
        for pk, worker in zip(items, ("wa", "wb"), strict=True):
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
                    execution_id=execution_id, attempt=1, worker_id=worker, output=f'{{"id": {execution_id}}}',
                    max_chars=100,
                )  # fmt: skip
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [
            threading.Thread(target=finish, args=(items[0], f"wa{attempt}")),
            threading.Thread(target=finish, args=(items[1], f"wb{attempt}")),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        (step,) = Execution.objects.filter(task=summary, workflow_run=root)
        assert step.input == [{"id": items[0]}, {"id": items[1]}]


def test_the_workflow_run_api_shows_a_map_step_s_items_in_constant_queries(user, api_client):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def read(root: int) -> tuple[dict, int]:
        with CaptureQueriesContext(connection) as queries:
            response = api_client.get(f"/api/v1/workflow-runs/{root}")
        assert response.status_code == 200, response.json()
        return response.json(), len(queries)

    listing, each, _ = _flow(user, concurrency=2)
    small = _start(listing, ["a", "b"])
    end(_items(each, small)[0].pk, output="{}")
    body, few = read(small)
    step = next(step for step in body["steps"] if step["name"] == "each")
    assert step["map"] == {"total": 2, "items": {"SUCCEEDED": 1, "SCHEDULED": 1}}
    assert step["state"] == "RUNNING" and body["state"] == "running"
    assert step["note"] == "2 of 2 items started"
    large = _start(listing, list(range(12)))
    for _ in range(6):
        end(next(run for run in _items(each, large) if run.status == S.SCHEDULED).pk, output="{}")
    body, many = read(large)
    step = next(step for step in body["steps"] if step["name"] == "each")
    assert step["map"] == {"total": 12, "items": {"SUCCEEDED": 6, "SCHEDULED": 2}}
    assert many == few, "the same queries whatever the number of items"
    shown = api_client.get(f"/api/v1/executions?workflow_run={large}").json()["results"]
    assert sorted(run["map_index"] for run in shown if run["task"] == str(each.pk)) == list(range(8))


def test_map_over_is_checked_when_written(api_client):
    def post(**fields):
        return api_client.post("/api/v1/tasks", {"runner": "noop", **fields}, format="json")

    a = post().json()["id"]
    b = post().json()["id"]
    response = post(map_over="files", after=[{"task": a}])
    assert response.status_code == 400
    assert response.json()["errors"] == {
        "map_over": ["path must be a text starting with $, like $.status: got 'files'."]
    }
    assert post(map_over="$.files").json()["errors"] == {
        "map_over": ["A map step (map_over) follows exactly one task, whose output lists its items: it follows 0."]
    }
    two = post(map_over="$.files", after=[{"task": a}, {"task": b}])
    assert list(two.json()["errors"]) == ["after"]
    for bad in (0, 1001, "x"):
        assert list(post(map_concurrency=bad, after=[{"task": a}]).json()["errors"]) == ["map_concurrency"]
    created = post(map_over="$.files", map_concurrency=5, after=[{"task": a}])
    assert created.status_code == 201, created.json()
    task = created.json()
    assert (task["map_over"], task["map_concurrency"]) == ("$.files", 5)
    patched = api_client.patch(f"/api/v1/tasks/{task['id']}", {"after": [{"task": a}, {"task": b}]}, format="json")
    assert patched.status_code == 400 and list(patched.json()["errors"]) == ["after"]
    patched = api_client.patch(f"/api/v1/tasks/{task['id']}", {"map_over": "$[0"}, format="json")
    assert patched.status_code == 400 and list(patched.json()["errors"]) == ["map_over"]
    patched = api_client.patch(f"/api/v1/tasks/{task['id']}", {"map_over": ""}, format="json")
    assert patched.status_code == 200 and patched.json()["map_over"] == ""


def test_a_list_longer_than_the_bound_fails_the_map_step(user, monkeypatch):
    from executions.transitions import follow

    monkeypatch.setattr(follow, "MAX_MAP_ITEMS", 3)
    listing, each, summary = _flow(user, join_on="failure")
    root = _start(listing, ["a", "b", "c", "d"])
    assert _items(each, root) == []
    record = WorkflowMap.objects.get(task=each, workflow_run=root)
    assert record.status == S.FAILED
    assert record.error == f"map_over $.files: 4 items in the output of execution {root}; a map step runs at most 3"
    assert Execution.objects.filter(task=summary, workflow_run=root).count() == 1


def test_a_paused_workflow_run_starts_no_more_items_and_the_resume_goes_on(user):
    listing, each, summary = _flow(user, concurrency=1)
    root = _start(listing, ["a", "b"])
    assert transitions.workflow_run_hold_set(workflow_run=root, hold="paused", sources=["active"], actor="test")
    end(_items(each, root)[0].pk, output='{"a": 1}')
    assert [run.map_index for run in _items(each, root)] == [0], "paused: no next item"
    created = transitions.workflow_run_resume(workflow_run=root, actor="test")
    (second,) = [run for run in _items(each, root) if run.map_index == 1]
    assert created == [second.pk]
    assert transitions.workflow_run_hold_set(workflow_run=root, hold="paused", sources=["active"], actor="test")
    end(second.pk, output='{"b": 1}')
    assert not Execution.objects.filter(task=summary).exists(), "paused: the step's end starts nothing"
    assert WorkflowMap.objects.get(task=each, workflow_run=root).status == ""
    created = transitions.workflow_run_resume(workflow_run=root, actor="test")
    (step,) = Execution.objects.filter(task=summary, workflow_run=root)
    assert created == [step.pk] and step.input == [{"a": 1}, {"b": 1}] and step.upstream == [second.pk]


def test_a_failed_workflow_run_s_retry_runs_its_failed_items_again(user):
    from executions.workflow_control import workflow_run_retry
    from executions.workflow_selectors import workflow_runs_annotated

    listing, each, summary = _flow(user)
    root = _start(listing, ["a", "b", "c"])
    first, second, third = _items(each, root)
    end(first.pk, output='{"a": 1}')
    end(second.pk, ok=False)
    end(third.pk, output='{"c": 1}')
    annotated = workflow_runs_annotated(Execution.objects.filter(pk=root)).select_related("task").get()
    assert annotated.state == "failed"
    report = workflow_run_retry(user=user, root=annotated, actor="test")
    assert report.retried == [second.pk]
    (again,) = Execution.objects.filter(pk__in=report.created)
    assert (again.map_index, again.input) == (1, {"item": "b"})
    Execution.objects.filter(pk=again.pk).update(status=S.PENDING)
    assert transitions.execution_claim_loaded(
        execution_id=again.pk, attempt=again.attempt, worker_id=WORKER, lease_seconds=60, checked=True
    )
    assert transitions.execution_succeed(
        execution_id=again.pk, attempt=again.attempt, worker_id=WORKER, output='{"b": 1}', max_chars=100
    )
    (step,) = Execution.objects.filter(task=summary, workflow_run=root)
    assert step.input == [{"a": 1}, {"b": 1}, {"c": 1}]


def test_a_fan_in_after_a_map_step_and_another_step_gets_the_list_keyed_by_task(user):
    listing = task_create(owner=user, runner="noop", name="list")
    each = task_create(owner=user, runner="noop", name="each", after=[_link(listing)], map_over="$.files")
    other = task_create(owner=user, runner="noop", name="other", after=[_link(listing)])
    both = task_create(
        owner=user,
        runner="noop",
        name="both",
        after=[{**_link(each), "condition": {"path": "$.length", "op": "==", "value": 2}}, _link(other)],
    )
    root = _start(listing, ["a", "b"])
    first, second = _items(each, root)
    end(first.pk, output='{"a": 1}')
    (sibling,) = Execution.objects.filter(task=other, workflow_run=root)
    end(sibling.pk, output='{"o": 1}')
    assert not Execution.objects.filter(task=both).exists(), "an item's end is no end of the map step"
    end(second.pk, output='{"b": 1}')
    (step,) = Execution.objects.filter(task=both, workflow_run=root)
    assert step.input == {str(each.pk): [{"a": 1}, {"b": 1}], str(other.pk): {"o": 1}}
    assert step.upstream == sorted([second.pk, sibling.pk])


def test_pruning_a_root_removes_its_workflow_run_s_map_steps(user, settings, tmp_path):
    from datetime import timedelta

    from django.utils import timezone

    from executions.retention import retention_prune

    settings.STORAGES = {
        **settings.STORAGES,
        "tms_archive": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "archive")},
        },
    }
    settings.TMS = {**settings.TMS, "RETENTION_KEEP_LAST": 1, "RETENTION_KEEP_FOR": 3600.0}
    listing, each, _ = _flow(user)
    old, new = _start(listing, []), _start(listing, [])
    assert WorkflowMap.objects.filter(task=each).count() == 2
    # Its hold and a decision on one of its runs go with it too (the decision into the archive).
    for run in (old, new):
        WorkflowRunControl.objects.create(workflow_run=run, hold=WorkflowRunHold.CANCELLED)
        Approval.objects.create(
            execution_id=run, attempt=1, task_id=listing.pk, decision="approved", decided_by_name="ann"
        )
    later = timezone.now() + timedelta(days=2)
    retention_prune(now=later)
    assert not Execution.objects.filter(pk=old).exists() and Execution.objects.filter(pk=new).exists()
    assert list(WorkflowMap.objects.filter(task=each).values_list("workflow_run", flat=True)) == [new]
    assert list(WorkflowRunControl.objects.values_list("workflow_run", flat=True)) == [new]
    assert list(Approval.objects.values_list("execution_id", flat=True)) == [new]
    (archived,) = (tmp_path / "archive").rglob("*.jsonl.gz")
    records = [json.loads(line) for line in gzip.decompress(archived.read_bytes()).decode().splitlines()]
    assert [(r["id"], [(a["decision"], a["decided_by_name"]) for a in r["approvals"]]) for r in records] == [
        (old, [("approved", "ann")])
    ]


def test_a_map_step_failed_before_any_item_fails_its_workflow_run_in_the_list_and_its_filter(user, api_client):
    """A map step that could not read its list has no run of its own (only its record): its
    workflow run is failed in the list and by ``?state=failed`` as on its own page, not succeeded."""
    listing, each, _ = _flow(user)  # the summary follows on success: the failure is not handled
    root = transitions.execution_trigger(task_id=listing.pk, actor="test")
    end(root, output=json.dumps({"files": "a.csv"}))
    assert WorkflowMap.objects.get(task=each, workflow_run=root).status == S.FAILED
    assert api_client.get(f"/api/v1/workflow-runs/{root}").json()["state"] == "failed"
    listed = api_client.get("/api/v1/workflow-runs").json()["results"]
    assert [run["state"] for run in listed if run["id"] == root] == ["failed"]
    for state, wanted in (("failed", [root]), ("succeeded", [])):
        found = api_client.get(f"/api/v1/workflow-runs?state={state}").json()["results"]
        assert [run["id"] for run in found if run["id"] == root] == wanted
