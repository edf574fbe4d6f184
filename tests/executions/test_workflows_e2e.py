"""Workflows on the running system (issue 31, dependencies): API → monitor process → RabbitMQ →
worker processes, with steps created by their upstreams' ends and run like any other run."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from executions.models import TERMINAL_STATUSES, Execution, ExecutionOrigin, WorkflowSkip
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


#: Fast recovery settings, as tests/executions/test_recovery.py's: a killed pool process's run is
#: resumed about 3.3 s after its last heartbeat.
FAST = {
    "TMS_HEARTBEAT_INTERVAL": "0.5",
    "TMS_WORKER_TIMEOUT": "3",
    "TMS_MONITOR_MAX_SLEEP": "0.3",
    "TMS_PENDING_REPUBLISH_AFTER": "2",
    "TMS_MAX_HANDBACKS": "1",
}


def _kill_a_running_item(task: str, spared: set[int]) -> int:
    """SIGKILL the pool process that holds one of the map step's items mid-sleep; return the item's
    run id. The latest item started is the one chosen (the earliest may be about to end); a kill
    that came after its item ended (the run no longer RUNNING under that lease once the process is
    dead) does not count, and another item's process is killed instead."""
    for _ in range(10):
        held = wait_for(
            lambda: (
                Execution.objects.filter(task_id=task, status=S.RUNNING)
                .exclude(lease_owner="")
                .exclude(pk__in=spared)
                .order_by("-map_index")
                .first()
            ),
            timeout=30,
            what="an item held by a pool process",
        )
        assert isinstance(held, Execution)
        os.kill(int(held.lease_owner.rsplit(":", 1)[1]), signal.SIGKILL)
        if Execution.objects.filter(pk=held.pk, status=S.RUNNING, lease_owner=held.lease_owner).exists():
            return held.pk  # the dead process still holds it: killed mid-step
    raise AssertionError("no kill landed mid-step in 10 tries")


@pytest.mark.timeout(120)
def test_a_workflow_run_under_pool_kills_runs_every_step_exactly_once(api_client, user):
    """Issue 48's round trip on real processes: a condition (one branch taken, one skipped), a map
    of 100 items killed mid-step twice, its join, a wait for an event posted through the API and an
    approval given through it. Every step runs once or is recorded as skipped; nothing is lost."""
    items = [f"{300 + i}ms" for i in range(100)]  # each item's output names its duration: its order shows
    root = _task(
        api_client,
        name="root",
        runner="subprocess",
        config={"command": ["echo", json.dumps({"go": True, "items": items})]},
        start_at=_later(),
    )
    taken = _task(
        api_client,
        name="taken",
        runner="noop",
        after=[{"task": root, "condition": {"path": "$.go", "op": "==", "value": True}}],
    )
    skipped = _task(
        api_client,
        name="skipped",
        runner="noop",
        after=[{"task": root, "condition": {"path": "$.go", "op": "==", "value": False}}],
    )
    mapped = _task(
        api_client,
        name="each",
        runner="sleep",
        config={"duration": "1s"},
        input_fills={"duration": "item"},
        after=[{"task": root}],
        map_over="$.items",
        map_concurrency=8,
    )
    join = _task(api_client, name="join", runner="noop", after=[{"task": mapped}])
    wait = _task(
        api_client, name="wait", runner="wait_event", config={"event": "wfe2e.go"}, timeout="1m", after=[{"task": join}]
    )
    gate = _task(
        api_client, name="gate", runner="approval", config={"message": "go?"}, timeout="1m", after=[{"task": wait}]
    )
    worker, monitor = start_worker(concurrency=4, **FAST), start_monitor(**FAST)
    with running(worker, monitor):
        wait_worker_ready(worker)
        run = _trigger(api_client, root)
        killed = {_kill_a_running_item(mapped, set())}
        # The second kill once the items have moved on past the first killed one's neighbours.
        wait_for(
            lambda: Execution.objects.filter(task_id=mapped, status=S.SUCCEEDED).count() >= 30,
            timeout=30,
            what="30 items done",
        )
        killed.add(_kill_a_running_item(mapped, killed))
        assert len(killed) == 2
        waiting = wait_for(
            lambda: Execution.objects.filter(task_id=wait, status=S.RUNNING).first(), timeout=60, what="the wait"
        )
        posted = api_client.post("/api/v1/events/wfe2e.go", {"ok": 1}, format="json")
        assert posted.status_code == 202, posted.json()
        wait_for(
            lambda: Execution.objects.filter(pk=waiting.pk, status=S.SUCCEEDED).exists(), timeout=30, what="the event"
        )
        asking = wait_for(
            lambda: Execution.objects.filter(task_id=gate, status=S.RUNNING).first(), timeout=30, what="the gate"
        )
        approved = api_client.post(f"/api/v1/executions/{asking.pk}/approve", {"comment": "go"}, format="json")
        assert approved.status_code in (200, 201), approved.json()
        wait_for(
            lambda: Execution.objects.filter(pk=asking.pk, status=S.SUCCEEDED).exists(), timeout=30, what="approved"
        )
    steps = Execution.objects.filter(workflow_run=run)
    # 0 duplicated: one run per (task, workflow run, map_index); each claimed once and ended once.
    keys = list(steps.values_list("task_id", "map_index"))
    assert len(keys) == len(set(keys)) == 1 + 1 + 100 + 3
    for step in steps:
        trail = list(step.events.order_by("id").values_list("from_status", "to_status"))
        assert sum(1 for _, to in trail if to in TERMINAL_STATUSES) == 1, (step.pk, trail)
        assert sum(1 for was, to in trail if was == S.PENDING and to == S.RUNNING) == 1, (step.pk, trail)
        assert step.attempt == 1
    # 0 lost: every expected step ended, and succeeded.
    by_task = {
        str(task): sorted(index for t, index in keys if str(t) == str(task))
        for task in (root, taken, mapped, join, wait, gate)
    }
    assert by_task[mapped] == list(range(100))
    assert all(len(by_task[task]) == 1 for task in (root, taken, join, wait, gate))
    assert set(steps.values_list("status", flat=True)) == {S.SUCCEEDED}
    # The killed items were resumed after their leases expired, not run twice.
    for pk in killed:
        assert any(
            d.startswith("lease of") for d in Execution.objects.get(pk=pk).events.values_list("detail", flat=True)
        )
    # The branch not taken is recorded as skipped, with why; it has no run.
    assert not Execution.objects.filter(task_id=skipped).exists()
    (skip,) = WorkflowSkip.objects.filter(workflow_run=run)
    assert str(skip.task_id) == skipped and "condition" in skip.reason
    # The join got the 100 items' documents, in the list's order.
    joined = steps.get(task_id=join)
    assert joined.input == [{"output": f"slept {(300 + i) / 1000:g}s"} for i in range(100)]
