"""A RUNNING subprocess or Kubernetes run shows its output so far on its execution page: the
optional ``BaseRunner.output_so_far``, against a real process and the Jobs API emulator."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.runs import run_spec
from runners.base import BaseRunner, RunHandle, RunSpec
from runners.kubernetes import KubernetesRunner
from runners.registry import get_runner
from tasks_api.creation import task_create
from tests.emulators.kubernetes import KubernetesEmulator
from tests.factories import ExecutionFactory

pytestmark = pytest.mark.django_db


def _running(execution: Execution, handle: RunHandle) -> Execution:
    """``execution`` (RUNNING) with the handle a worker would have recorded."""
    Execution.objects.filter(pk=execution.pk).update(
        external_run_id=handle.external_run_id, run_handle=dict(handle.data)
    )
    return Execution.objects.select_related("task").get(pk=execution.pk)


def test_the_base_runner_cannot_tell():
    spec = RunSpec(execution_id=1, attempt=1, task_id="t", config={}, timeout=1)
    assert BaseRunner("x").output_so_far(spec, RunHandle("r")) is None


def test_a_running_subprocess_shows_its_output_so_far(alice_client, user):
    command = ["/bin/sh", "-c", "echo first line; echo second line; sleep 30"]
    task = task_create(owner=user, runner="subprocess", config={"command": command}, start_at=None)
    Execution.objects.filter(task=task).delete()  # only the one driven below
    runner = get_runner("subprocess")
    execution = ExecutionFactory(task=task, status=S.RUNNING, lease_owner="host:1:1")
    spec = run_spec(execution, task, starting=True)
    handle = runner.start(spec)
    try:
        assert handle.result is None  # still running after the inline wait
        execution = _running(execution, handle)
        deadline = time.monotonic() + 10
        while "second line" not in (runner.output_so_far(spec, handle) or "") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert runner.output_so_far(spec, handle) == "first line\nsecond line\n"
        page = alice_client.get(f"/ui/executions/{execution.pk}/")
        assert page.context["live_output"] == "first line\nsecond line\n"
        assert 'id="live-output"' in page.content.decode()
        assert 'data-refresh-url="?fragment=1"' in page.content.decode()  # it refreshes while running
        fragment = alice_client.get(f"/ui/executions/{execution.pk}/?fragment=1")
        assert b"second line" in fragment.content and b"<html" not in fragment.content
    finally:
        runner.cancel(spec, handle)


def test_output_so_far_bounds_to_the_end_of_the_output(user):
    command = ["/bin/sh", "-c", "i=0; while [ $i -lt 3000 ]; do echo line-$i; i=$((i+1)); done; sleep 30"]
    task = task_create(owner=user, runner="subprocess", config={"command": command, "max_output_bytes": 1024})
    runner = get_runner("subprocess")
    execution = Execution.objects.filter(task=task).first() or ExecutionFactory(task=task)
    spec = run_spec(execution, task, starting=True)
    handle = runner.start(spec)
    try:
        deadline = time.monotonic() + 10
        while "line-2999" not in (runner.output_so_far(spec, handle) or "") and time.monotonic() < deadline:
            time.sleep(0.05)
        text = runner.output_so_far(spec, handle)
        assert text.startswith("[... ") and text.endswith("line-2999\n") and len(text.encode()) < 1100
    finally:
        runner.cancel(spec, handle)


def test_a_subprocess_run_not_started_has_no_output():
    runner = get_runner("subprocess")
    spec = RunSpec(execution_id=987654, attempt=1, task_id="t", config={"command": ["true"]}, timeout=5)
    assert runner.output_so_far(spec, RunHandle("x", {"host": runner.host})) is None
    assert runner.output_so_far(spec, RunHandle("x", {"host": "elsewhere"})) is None


@pytest.fixture
def cluster() -> Iterator[KubernetesEmulator]:
    with KubernetesEmulator() as emulator:
        yield emulator


def test_a_running_kubernetes_job_shows_its_pod_log(cluster):
    runner = KubernetesRunner("k8s", {"host": cluster.url, "request_timeout": 2.0})
    config = runner.validate_config({"image": "busybox:1.36", "command": ["sh", "-c", "echo started; sleep 30"]})
    spec = RunSpec(execution_id=4242, attempt=1, task_id="t", config=config, timeout=60)
    handle = runner.start(spec)
    assert runner.poll(spec, handle).finished is False
    assert runner.output_so_far(spec, handle) == "started\n"
    runner.cancel(spec, handle)
    assert runner.output_so_far(spec, handle) is None  # the Job and its pods are gone
    unreachable = KubernetesRunner("k8s", {"host": "http://127.0.0.1:9", "request_timeout": 0.5})
    assert unreachable.output_so_far(spec, handle) is None
