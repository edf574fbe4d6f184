"""Workflows on the running system (issue 31, dependencies): API → monitor process → RabbitMQ →
worker processes, with steps created by their upstreams' ends and run like any other run."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from executions.models import Execution, ExecutionOrigin
from executions.models import ExecutionStatus as S
from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def platform():
    worker, monitor = start_worker(concurrency=2), start_monitor()
    with running(worker, monitor):
        wait_worker_ready(worker)
        yield worker, monitor


def _task(client, **fields) -> str:
    response = client.post("/api/v1/tasks", fields, format="json")
    assert response.status_code == 201, response.json()
    return str(response.json()["id"])


def _later() -> str:
    """A start far enough ahead that the root runs only when triggered."""
    return (timezone.now() + timedelta(days=1)).isoformat()


def _trigger(client, task: str) -> int:
    response = client.post(f"/api/v1/tasks/{task}/trigger", format="json")
    assert response.status_code in (200, 201, 202), response.json()
    return int(response.json()["id"])


def test_a_diamond_runs_each_step_once_and_d_after_both(platform, api_client):
    a = _task(
        api_client,
        name="a",
        runner="subprocess",
        config={"command": ["echo", '{"rows": 3}']},
        start_at=_later(),
    )
    b = _task(api_client, name="b", runner="sleep", config={"duration": "200ms"}, after=[{"task": a}])
    # c's command is filled from its input (a's output) on the worker: issue 31's input_fills.
    c = _task(
        api_client,
        name="c",
        runner="subprocess",
        config={"command": ["echo", "no rows given"]},
        input_fills={"command.1": "rows"},
        after=[{"task": a}],
    )
    d = _task(api_client, name="d", runner="noop", after=[{"task": b}, {"task": c, "on": "success"}])
    root = _trigger(api_client, a)
    wait_for(lambda: Execution.objects.filter(task_id=d, status=S.SUCCEEDED).exists(), timeout=60, what="D SUCCEEDED")
    runs = {task: list(Execution.objects.filter(task_id=task)) for task in (a, b, c, d)}
    assert {task: len(found) for task, found in runs.items()} == dict.fromkeys((a, b, c, d), 1)
    assert all(found[0].status == S.SUCCEEDED for found in runs.values())
    (run_a,), (run_b,), (run_c,), (run_d,) = runs[a], runs[b], runs[c], runs[d]
    assert run_a.pk == root
    assert {run.workflow_run for run in (run_a, run_b, run_c, run_d)} == {root}
    assert run_b.upstream == [root] and run_c.upstream == [root]
    assert run_b.input == {"rows": 3} and run_c.input == {"rows": 3}
    assert run_c.output.strip() == "3"  # the filled config reached the runner on a worker process
    assert sorted(run_d.upstream or []) == sorted([run_b.pk, run_c.pk])
    assert set(run_d.input or {}) == {b, c}
    assert all(run.origin == ExecutionOrigin.WORKFLOW for run in (run_b, run_c, run_d))
    # Each step went through the monitor and a worker as any run does.
    for run in (run_b, run_c, run_d):
        trail = list(run.events.order_by("id").values_list("to_status", flat=True))
        assert trail == [S.SCHEDULED, S.PENDING, S.RUNNING, S.SUCCEEDED], trail
    shown = api_client.get(f"/api/v1/executions/{run_d.pk}").json()
    assert shown["workflow_run"] == root and sorted(shown["upstream"]) == sorted([run_b.pk, run_c.pk])


def test_a_failure_runs_the_failure_path_only(platform, api_client):
    failing = _task(api_client, runner="subprocess", config={"command": ["false"]}, max_attempts=1, start_at=_later())
    on_success = _task(api_client, runner="noop", after=[{"task": failing, "on": "success"}])
    on_failure = _task(api_client, runner="noop", after=[{"task": failing, "on": "failure"}])
    on_either = _task(api_client, runner="noop", after=[{"task": failing, "on": "completion"}])
    root = _trigger(api_client, failing)
    wait_for(
        lambda: Execution.objects.filter(task_id__in=[on_failure, on_either], status=S.SUCCEEDED).count() == 2,
        timeout=60,
        what="the failure path ran",
    )
    assert Execution.objects.get(pk=root).status == S.FAILED
    # Created in the failed end's own transaction, or never: nothing comes later.
    assert not Execution.objects.filter(task_id=on_success).exists()
    handler = Execution.objects.get(task_id=on_failure)
    assert handler.upstream == [root] and "error" in (handler.input or {})
