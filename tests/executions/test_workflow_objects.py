"""Workflows and workflow runs as objects (issue 48, item 1): the lists and details, pause,
resume and cancel of a workflow run, and its retry from its failed steps (item 6).

Step ends go through the real transitions (tests/workflows.py's ``end``), as a worker records
them; no worker process runs."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from executions import transitions
from executions.models import Execution, WorkflowRunControl, WorkflowRunHold
from executions.models import ExecutionStatus as S
from executions.transitions import follow, hold
from tasks_api.creation import task_create
from tasks_app.models import AuditEntry
from tasks_app.teams.services import member_set, team_create
from tests.workflows import after, end

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/workflow-runs"
LATER = datetime(2099, 1, 1, tzinfo=UTC)


def _diamond(user: Any, *, team: Any = None, name: str = "extract") -> dict[str, Any]:
    """extract -> (transform, check) -> load; nothing scheduled (extract runs when triggered)."""
    a = task_create(owner=user, runner="noop", name=name, team=team, start_at=LATER)
    b = task_create(owner=user, runner="noop", name="transform", team=team, after=after((a, "success")))
    c = task_create(owner=user, runner="noop", name="check", team=team, after=after((a, "success")))
    d = task_create(owner=user, runner="noop", name="load", team=team, after=after((b, "success"), (c, "success")))
    return {"a": a, "b": b, "c": c, "d": d}


def _start(task: Any, run_input: dict | None = None) -> int:
    root = transitions.execution_trigger(task_id=task.pk, actor="test", run_input=run_input)
    assert root is not None
    return root


def _step(task: Any, root: int) -> Execution:
    return Execution.objects.get(task=task, workflow_run=root, retry_of__isnull=True)


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


# -- Workflows ---------------------------------------------------------------------------------------


def test_workflows_list_each_root_with_its_graph_in_constant_queries(user, api_client, other_user):
    flow = _diamond(user)
    with CaptureQueriesContext(connection) as one:
        first = api_client.get("/api/v1/workflows")
    for number in range(4):
        _diamond(user, name=f"extract {number}")
    with CaptureQueriesContext(connection) as five:
        listed = api_client.get("/api/v1/workflows")
    assert first.status_code == listed.status_code == 200
    assert len(five) == len(one), "no query per workflow"
    (shown,) = [item for item in listed.json()["results"] if item["root_task"] == str(flow["a"].pk)]
    assert len(listed.json()["results"]) == 5
    assert [(node["name"], node["depth"]) for node in shown["nodes"]] == [
        ("extract", 0),
        ("check", 1),
        ("transform", 1),
        ("load", 2),
    ]
    edges = {(edge["upstream"], edge["task"], edge["on"]) for edge in shown["edges"]}
    a, b, c, d = (str(flow[key].pk) for key in "abcd")
    assert edges == {(a, b, "success"), (a, c, "success"), (b, d, "success"), (c, d, "success")}
    detail = api_client.get(f"/api/v1/workflows/{b}")  # any task: the graph below it
    assert detail.status_code == 200 and [node["name"] for node in detail.json()["nodes"]] == ["transform", "load"]
    assert _client(other_user).get(f"/api/v1/workflows/{a}").status_code == 404
    assert _client(other_user).get("/api/v1/workflows").json()["results"] == []
    assert api_client.get("/api/v1/workflows/not-a-uuid").status_code == 404


def test_workflows_list_reads_in_few_queries(user, api_client, django_assert_max_num_queries):
    for number in range(6):
        _diamond(user, name=f"extract {number}")
    with django_assert_max_num_queries(6):
        assert len(api_client.get("/api/v1/workflows").json()["results"]) == 6


# -- Workflow runs: lists and details -------------------------------------------------------------------


def test_workflow_runs_list_filters_by_workflow_and_state_in_constant_queries(
    user, api_client, other_user, django_assert_max_num_queries
):
    flow, other = _diamond(user), _diamond(user, name="other")
    running = _start(flow["a"])
    end(running)  # transform and check wait
    failed = _start(flow["a"])
    end(failed, ok=False)  # nothing follows extract's failure: failed
    succeeded = _start(other["a"])
    end(succeeded)
    for step in ("b", "c"):
        end(_step(other[step], succeeded).pk)
    end(_step(other["d"], succeeded).pk)
    with django_assert_max_num_queries(4):
        listed = api_client.get(RUNS).json()["results"]
    assert [(run["id"], run["state"]) for run in listed] == [
        (succeeded, "succeeded"),
        (failed, "failed"),
        (running, "running"),
    ]
    assert listed[0]["steps"] == 4 and listed[0]["finished_at"] is not None
    assert [run["id"] for run in api_client.get(RUNS, {"workflow": str(flow["a"].pk)}).json()["results"]] == [
        failed,
        running,
    ]
    assert [run["id"] for run in api_client.get(RUNS, {"state": "running"}).json()["results"]] == [running]
    page = api_client.get(RUNS, {"limit": 2}).json()
    assert len(page["results"]) == 2 and page["next"]
    bad = api_client.get(RUNS, {"state": "bogus", "workflow": "x"})
    assert bad.status_code == 400 and set(bad.json()["errors"]) == {"state", "workflow"}
    assert _client(other_user).get(RUNS).json()["results"] == []
    assert _client(other_user).get(f"{RUNS}/{running}").status_code == 404
    assert api_client.get(f"{RUNS}/{_step(flow['b'], running).pk}").status_code == 404, "a step is no workflow run"


def test_a_workflow_run_shows_its_steps_their_runs_the_links_and_the_input(user, api_client):
    flow = _diamond(user)
    root = _start(flow["a"], {"day": "friday"})
    end(root, output='{"rows": 3}')
    end(_step(flow["b"], root).pk)
    detail = api_client.get(f"{RUNS}/{root}").json()
    assert detail["state"] == "running" and detail["input"] == {"day": "friday"}
    steps = {step["name"]: step for step in detail["steps"]}
    assert steps["extract"]["state"] == S.SUCCEEDED and steps["extract"]["started_at"] is not None
    assert steps["transform"]["state"] == S.SUCCEEDED and steps["transform"]["input"] == {"rows": 3}
    assert steps["check"]["state"] == S.SCHEDULED
    assert steps["load"]["state"] == "WAITING" and steps["load"]["execution"] is None
    assert {(link["on"], link["words"]) for link in detail["links"]} >= {("success", "taken")}


# -- Pause, resume, cancel --------------------------------------------------------------------------------


def test_a_paused_run_starts_no_step_and_its_resume_starts_the_held_ones_once(user, api_client):
    flow = _diamond(user)
    root = _start(flow["a"])
    end(root)
    paused = api_client.post(f"{RUNS}/{root}/pause")
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    assert api_client.post(f"{RUNS}/{root}/pause").status_code == 409
    end(_step(flow["b"], root).pk)  # the running steps finish ...
    end(_step(flow["c"], root).pk)
    assert not Execution.objects.filter(task=flow["d"]).exists(), "... and start nothing"
    assert api_client.get(f"{RUNS}/{root}").json()["state"] == "paused"
    resumed = api_client.post(f"{RUNS}/{root}/resume")
    assert resumed.status_code == 200, resumed.json()
    (load,) = Execution.objects.filter(task=flow["d"])
    assert resumed.json()["started"] == [load.pk] and resumed.json()["state"] == "running"
    assert load.workflow_run == root and sorted(load.upstream) == sorted(
        [_step(flow["b"], root).pk, _step(flow["c"], root).pk]
    )
    assert api_client.post(f"{RUNS}/{root}/resume").status_code == 409
    assert transitions.workflow_run_resume(workflow_run=root, actor="again") is None
    assert Execution.objects.filter(task=flow["d"]).count() == 1
    assert list(
        AuditEntry.objects.filter(object_type="workflow_run").order_by("id").values_list("action", flat=True)
    ) == [
        "pause",
        "resume",
    ]


def test_a_run_paused_before_its_root_ends_is_resumed_from_the_root(user, api_client):
    flow = _diamond(user)
    root = _start(flow["a"])
    assert api_client.post(f"{RUNS}/{root}/pause").status_code == 200
    end(root)
    assert not Execution.objects.filter(task=flow["b"]).exists()
    assert len(api_client.post(f"{RUNS}/{root}/resume").json()["started"]) == 2
    assert Execution.objects.filter(workflow_run=root).count() == 3  # the root, transform, check


def test_cancel_cancels_the_active_steps_and_starts_nothing_more(user, api_client):
    flow = _diamond(user)
    root = _start(flow["a"])
    end(root)
    cancelled = api_client.post(f"{RUNS}/{root}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert sorted(report["execution"] for report in cancelled.json()["executions"]) == sorted(
        [_step(flow["b"], root).pk, _step(flow["c"], root).pk]
    )
    assert set(Execution.objects.filter(workflow_run=root).exclude(pk=root).values_list("status", flat=True)) == {
        S.CANCELLED
    }
    assert api_client.post(f"{RUNS}/{root}/cancel").status_code == 409
    assert api_client.post(f"{RUNS}/{root}/resume").status_code == 409
    # A step whose cancel lost to its end (it was ending then) starts nothing either.
    other = _start(flow["a"])
    transitions.workflow_run_hold_set(
        workflow_run=other, hold=WorkflowRunHold.CANCELLED, sources=[WorkflowRunHold.ACTIVE], actor="t"
    )
    end(other)
    assert not Execution.objects.filter(workflow_run=other).exclude(pk=other).exists()


def test_an_operator_pauses_a_viewer_may_not_and_another_team_sees_nothing(user, other_user):
    team = team_create(creator=user, name="Pipelines")
    users = get_user_model().objects
    for role in ("viewer", "operator"):
        users.create_user(f"the-{role}")
        member_set(team=team, username=f"the-{role}", role=role)
    flow = _diamond(user, team=team)
    root = _start(flow["a"])
    viewer, operator = (_client(users.get(username=f"the-{role}")) for role in ("viewer", "operator"))
    assert viewer.get(f"{RUNS}/{root}").status_code == 200
    assert viewer.post(f"{RUNS}/{root}/pause").status_code == 403
    assert _client(other_user).post(f"{RUNS}/{root}/pause").status_code == 404
    assert operator.post(f"{RUNS}/{root}/pause").status_code == 200


def test_the_hold_s_lock_is_the_fan_in_s():
    assert hold.LOCK_NAMESPACE == follow.FAN_IN_LOCK_NAMESPACE


def _waiting_on_advisory_lock() -> None:
    """Wait until a session waits for an advisory lock (at most 5 s)."""
    for _ in range(500):
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            if cursor.fetchone()[0]:
                return
        time.sleep(0.01)
    raise AssertionError("nobody waits for the workflow run's lock")


def _in_thread(target: Any, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_a_step_ending_while_a_pause_commits_starts_its_follower_once_never_zero_times(user):
    """Both orders of a step's end and a pause, each holding the workflow run's lock while the
    other waits: a pause that commits first holds the follower back (the resume starts it); an
    end that commits first starts it (the resume starts nothing). Never lost, never twice."""
    a = task_create(owner=user, runner="noop", start_at=LATER)
    b = task_create(owner=user, runner="noop", after=after((a, "success")))
    errors: list[BaseException] = []
    # 1. The pause holds the lock; the root's end waits for it, then sees the pause.
    root = _start(a)
    held, commit = threading.Event(), threading.Event()

    def pause() -> None:
        with transaction.atomic():
            assert transitions.workflow_run_hold_set(
                workflow_run=root, hold=WorkflowRunHold.PAUSED, sources=[WorkflowRunHold.ACTIVE], actor="t"
            )
            held.set()  # the lock is this transaction's until it commits
            assert commit.wait(10)

    pausing = _in_thread(pause, errors)
    assert held.wait(10)
    ending = _in_thread(lambda: end(root), errors)
    _waiting_on_advisory_lock()
    commit.set()
    pausing.join(10)
    ending.join(10)
    assert errors == []
    assert not Execution.objects.filter(task=b).exists()
    assert len(transitions.workflow_run_resume(workflow_run=root, actor="t") or []) == 1
    assert Execution.objects.filter(task=b, workflow_run=root).count() == 1
    # 2. The end holds the lock (not committed yet); the pause waits, then commits after it.
    root = _start(a)
    ended, commit = threading.Event(), threading.Event()

    def end_and_wait() -> None:
        with transaction.atomic():
            end(root)
            ended.set()
            assert commit.wait(10)

    ending = _in_thread(end_and_wait, errors)
    assert ended.wait(10)
    pausing = _in_thread(
        lambda: transitions.workflow_run_hold_set(
            workflow_run=root, hold=WorkflowRunHold.PAUSED, sources=[WorkflowRunHold.ACTIVE], actor="t"
        ),
        errors,
    )
    _waiting_on_advisory_lock()
    commit.set()
    ending.join(10)
    pausing.join(10)
    assert errors == []
    assert WorkflowRunControl.objects.get(workflow_run=root).hold == WorkflowRunHold.PAUSED
    assert Execution.objects.filter(task=b, workflow_run=root).count() == 1
    assert transitions.workflow_run_resume(workflow_run=root, actor="t") == []
    assert Execution.objects.filter(task=b, workflow_run=root).count() == 1


# -- Retry from the failed steps ---------------------------------------------------------------------------


def test_a_failed_run_is_retried_from_its_failed_step_with_an_edited_input(user, api_client):
    flow = _diamond(user)
    root = _start(flow["a"])
    end(root, output='{"rows": 3}')
    end(_step(flow["b"], root).pk)
    check = _step(flow["c"], root)
    end(check.pk, ok=False)
    assert api_client.get(f"{RUNS}/{root}").json()["state"] == "failed"
    bad = api_client.post(f"{RUNS}/{root}/retry", {"input": [1]}, format="json")
    assert bad.status_code == 400 and bad.json()["errors"]["input"] == ["A JSON object: the retried steps' input."]
    retried = api_client.post(f"{RUNS}/{root}/retry", {"input": {"rows": 4}}, format="json")
    assert retried.status_code == 201, retried.json()
    (new,) = retried.json()["created"]
    assert retried.json()["retried"] == [check.pk]
    again = Execution.objects.get(pk=new)
    assert (again.retry_of_id, again.workflow_run, again.input, again.upstream) == (
        check.pk,
        root,
        {"rows": 4},
        check.upstream,
    )
    assert api_client.get(f"{RUNS}/{root}").json()["state"] == "running"
    assert api_client.post(f"{RUNS}/{root}/retry").status_code == 409
    # The retry's end starts what waited for it (load), once; transform is not run again.
    Execution.objects.filter(pk=new).update(attempt=1)  # tests/workflows.end records attempt 1
    end(new)
    assert Execution.objects.filter(task=flow["d"], workflow_run=root).count() == 1
    assert Execution.objects.filter(task=flow["b"], workflow_run=root).count() == 1


def test_a_root_that_failed_alone_is_retried_within_its_workflow_run(user, api_client):
    flow = _diamond(user)
    root = _start(flow["a"])
    end(root, ok=False)
    (new,) = api_client.post(f"{RUNS}/{root}/retry").json()["created"]
    assert Execution.objects.get(pk=new).workflow_run == root
    assert [run["id"] for run in api_client.get(RUNS).json()["results"]] == [root]


def test_a_retry_runs_only_the_failures_nothing_handled(user, api_client):
    a = task_create(owner=user, runner="noop", name="extract", start_at=LATER)
    b = task_create(owner=user, runner="noop", name="check", after=after((a, "success")))
    c = task_create(owner=user, runner="noop", name="load", after=after((a, "success")))
    alert = task_create(owner=user, runner="noop", name="alert", after=after((b, "failure")))
    root = _start(a)
    end(root)
    end(_step(b, root).pk, ok=False)  # handled: alert follows check's failure
    end(_step(c, root).pk, ok=False)  # unhandled: the run failed
    end(_step(alert, root).pk)
    assert api_client.get(f"{RUNS}/{root}").json()["state"] == "failed"
    retried = api_client.post(f"{RUNS}/{root}/retry").json()
    assert retried["retried"] == [_step(c, root).pk]
