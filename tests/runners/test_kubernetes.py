"""The kubernetes runner, through the official client, against the Jobs API emulator on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rest_framework import serializers

from runners.base import RunHandle, RunnerError, RunState
from runners.kubernetes import KubernetesRunner
from runners.registry import get_runner
from tests.emulators.kubernetes import KubernetesEmulator
from tests.runners.conftest import free_port, spec_maker, wait_for_result

make_spec = spec_maker(task_id="task-9", timeout=60.0, first_execution_id=100)


@pytest.fixture
def cluster() -> Iterator[KubernetesEmulator]:
    with KubernetesEmulator() as emulator:
        yield emulator


@pytest.fixture
def runner(cluster: KubernetesEmulator) -> KubernetesRunner:
    return KubernetesRunner("k8s", {"host": cluster.url, "request_timeout": 2.0, "allowed_namespaces": ["batch"]})


def job(script: str, **config: Any) -> dict[str, Any]:
    return {"image": "busybox:1.36", "command": ["sh", "-c", script], **config}


# --------------------------------------------------------------------------------------------
# Outcomes
# --------------------------------------------------------------------------------------------


def test_job_runs_to_success_with_summary_and_log_tail(runner: KubernetesRunner, cluster: KubernetesEmulator) -> None:
    spec = make_spec(runner, job("echo hello; sleep 0.3; echo done"), execution_id=12, attempt=2)

    handle = runner.start(spec)

    assert handle.result is None
    assert handle.external_run_id == "default/tms-12-2"
    assert runner.poll(spec, handle).state is RunState.RUNNING
    result = wait_for_result(runner, spec, handle)
    assert result.state is RunState.SUCCEEDED
    assert result.output.startswith("Job default/tms-12-2 succeeded reason=CompletionsReached succeeded=1 failed=0")
    assert result.output.endswith("--- last pod log ---\nhello\ndone\n")
    assert cluster.creations[("default", "tms-12-2")] == 1


def test_job_manifest_carries_the_attempt_identity_and_limits(
    runner: KubernetesRunner, cluster: KubernetesEmulator
) -> None:
    spec = make_spec(
        runner,
        {
            "image": "ghcr.io/acme/report:1.4",
            "command": ["/report"],
            "args": ["--day", "today"],
            "env": {"MODE": "fast"},
            "namespace": "batch",
            "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"memory": 128}},
            "labels": {"team": "data"},
        },
        execution_id=7,
        attempt=1,
        timeout=90.5,
        callback_url="http://127.0.0.1:9/cb",
    )

    runner.start(spec)

    posted = cluster.requests_matching("POST")[0].json()
    assert posted["metadata"]["name"] == "tms-7-1"
    assert posted["metadata"]["namespace"] == "batch"
    assert posted["metadata"]["annotations"]["tms.io/idempotency-key"] == "tms-7-1"
    assert posted["metadata"]["labels"] == {
        "team": "data",
        "app.kubernetes.io/managed-by": "tms",
        "tms.io/run": "tms-7-1",
        "tms.io/execution-id": "7",
        "tms.io/attempt": "1",
        "tms.io/task-id": "task-9",
    }
    assert posted["spec"]["backoffLimit"] == 0
    assert posted["spec"]["activeDeadlineSeconds"] == 91
    assert posted["spec"]["ttlSecondsAfterFinished"] == 86400
    pod = posted["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    container = pod["containers"][0]
    assert (container["command"], container["args"]) == (["/report"], ["--day", "today"])
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"memory": "128"}}
    assert {item["name"]: item["value"] for item in container["env"]} == {
        "MODE": "fast",
        "TMS_EXECUTION_ID": "7",
        "TMS_ATTEMPT": "1",
        "TMS_TASK_ID": "task-9",
        "TMS_IDEMPOTENCY_KEY": "tms-7-1",
        "TMS_CALLBACK_URL": "http://127.0.0.1:9/cb",
    }


def test_failing_job_reports_backoff_limit_and_exit_code(runner: KubernetesRunner, cluster: KubernetesEmulator) -> None:
    spec = make_spec(runner, job("echo boom; exit 3", backoff_limit=1))

    result = wait_for_result(runner, spec, runner.start(spec))

    assert result.state is RunState.FAILED
    assert result.error == (
        f"Job default/{runner.job_name(spec)} failed: BackoffLimitExceeded: Job has reached the specified "
        "backoff limit (last container exit code 3)"
    )
    assert "failed=2" in result.output  # backoff_limit=1: two pods ran
    assert result.output.endswith("boom\n")
    assert result.retryable is True


def test_active_deadline_ends_the_job_on_the_cluster_side(runner: KubernetesRunner) -> None:
    spec = make_spec(runner, job("sleep 30", active_deadline_seconds=1))

    result = wait_for_result(runner, spec, runner.start(spec), seconds=5)

    assert result.state is RunState.FAILED
    assert "DeadlineExceeded" in result.error
    assert result.retryable is True


def test_timeout_cancels_by_deleting_the_job(runner: KubernetesRunner, cluster: KubernetesEmulator) -> None:
    spec = make_spec(runner, job("sleep 30"), timeout=0.3)
    handle = runner.start(spec)
    started = time.monotonic()
    # What the worker does: poll until the attempt is past its timeout, then cancel.
    while runner.poll(spec, handle).state is RunState.RUNNING and time.monotonic() - started < spec.timeout:
        time.sleep(0.05)

    runner.cancel(spec, handle)

    name = runner.job_name(spec)
    assert cluster.job("default", name) is None
    assert [(d.name, d.propagation_policy, d.uid) for d in cluster.deletions] == [
        (name, "Foreground", handle.data["uid"])
    ]
    assert cluster.creations[("default", name)] == 1


def test_cancel_with_background_propagation(cluster: KubernetesEmulator) -> None:
    runner = KubernetesRunner("k8s", {"host": cluster.url, "delete_propagation": "Background"})
    spec = make_spec(runner, job("sleep 30"))
    handle = runner.start(spec)

    runner.cancel(spec, handle)

    assert cluster.deletions[0].propagation_policy == "Background"
    assert runner.poll(spec, handle).state is RunState.FAILED


def test_cancel_of_a_job_that_is_already_gone_is_a_no_op(runner: KubernetesRunner, cluster: KubernetesEmulator) -> None:
    spec = make_spec(runner, job("sleep 30"))
    handle = runner.start(spec)
    cluster.delete_everything("default", runner.job_name(spec))

    runner.cancel(spec, handle)

    assert cluster.deletions == []


def test_cancel_never_deletes_a_job_it_did_not_create(runner: KubernetesRunner, cluster: KubernetesEmulator) -> None:
    spec = make_spec(runner, job("sleep 30"))
    handle = runner.start(spec)
    stale = RunHandle(handle.external_run_id, {**handle.data, "uid": "00000000-0000-0000-0000-000000000000"})

    runner.cancel(spec, stale)

    assert cluster.job("default", runner.job_name(spec)) is not None


def test_job_deleted_behind_our_back_fails_the_poll(runner: KubernetesRunner, cluster: KubernetesEmulator) -> None:
    spec = make_spec(runner, job("sleep 30"))
    handle = runner.start(spec)
    cluster.delete_everything("default", runner.job_name(spec))

    result = runner.poll(spec, handle)

    assert result.state is RunState.FAILED
    assert "was deleted before it finished" in result.error


# --------------------------------------------------------------------------------------------
# Idempotency
# --------------------------------------------------------------------------------------------


def test_repeated_start_adopts_the_job_instead_of_creating_another(
    runner: KubernetesRunner, cluster: KubernetesEmulator
) -> None:
    spec = make_spec(runner, job("sleep 0.2"))

    handles = [runner.start(spec) for _ in range(3)]

    assert all(handle == handles[0] for handle in handles)
    assert len(cluster.requests_matching("POST")) == 3
    assert cluster.creations[("default", runner.job_name(spec))] == 1
    assert wait_for_result(runner, spec, handles[0]).state is RunState.SUCCEEDED


def test_concurrent_starts_from_several_workers_create_one_job(cluster: KubernetesEmulator) -> None:
    spec = make_spec(KubernetesRunner("k8s", {"host": cluster.url}), job("sleep 1"))
    workers = [KubernetesRunner("k8s", {"host": cluster.url}) for _ in range(4)]
    barrier = threading.Barrier(len(workers))
    handles: list[RunHandle] = []

    def start(worker: KubernetesRunner) -> None:
        barrier.wait()
        handles.append(worker.start(spec))

    threads = [threading.Thread(target=start, args=(worker,)) for worker in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert len(handles) == 4
    assert all(handle == handles[0] for handle in handles)
    assert sum(cluster.creations.values()) == 1


def test_a_foreign_job_with_the_same_name_is_not_adopted(runner: KubernetesRunner, cluster: KubernetesEmulator) -> None:
    spec = make_spec(runner, job("sleep 1"))
    other_installation = make_spec(runner, job("sleep 1"), execution_id=spec.execution_id)
    runner.start(other_installation)
    # The same name, but annotated for another attempt (e.g. another TMS sharing the namespace).
    name = runner.job_name(spec)
    cluster.jobs[("default", name)].manifest["metadata"]["annotations"]["tms.io/idempotency-key"] = "tms-other"

    with pytest.raises(RunnerError, match="TMS did not create") as caught:
        runner.start(spec)

    assert caught.value.retryable is False
    assert cluster.creations[("default", name)] == 1


def test_create_that_errored_after_reaching_the_server_is_adopted(
    runner: KubernetesRunner, cluster: KubernetesEmulator
) -> None:
    spec = make_spec(runner, job("sleep 0.1"))
    first = runner.start(spec)
    cluster.fail_next("POST", 503, reason="ServiceUnavailable")

    again = runner.start(spec)

    assert again == first
    assert cluster.creations[("default", runner.job_name(spec))] == 1


def test_name_prefix_keeps_installations_apart(cluster: KubernetesEmulator) -> None:
    runner = KubernetesRunner("k8s", {"host": cluster.url, "name_prefix": "staging-"})
    spec = make_spec(runner, job("sleep 0"), execution_id=3, attempt=1)

    assert runner.start(spec).external_run_id == "default/staging-tms-3-1"


# --------------------------------------------------------------------------------------------
# API errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "retryable"), [(500, True), (503, True), (429, True), (403, False), (422, False)])
def test_create_errors_are_retryable_only_when_transient(
    runner: KubernetesRunner, cluster: KubernetesEmulator, status: int, retryable: bool
) -> None:
    spec = make_spec(runner, job("sleep 1"))
    cluster.fail_next("POST", status, reason="Injected")

    with pytest.raises(RunnerError, match=f"create Job: HTTP {status} Injected") as caught:
        runner.start(spec)

    assert caught.value.retryable is retryable
    assert sum(cluster.creations.values()) == 0


def test_invalid_job_is_refused_without_retry(runner: KubernetesRunner) -> None:
    spec = make_spec(runner, job("sleep 1"))
    # The API server's own validation (here: a name that is not a DNS subdomain) is a 422.
    runner.options["name_prefix"] = "UPPER-"

    with pytest.raises(RunnerError) as caught:
        runner.start(spec)

    assert caught.value.retryable is False


def test_unreachable_api_server_is_a_retryable_error() -> None:
    runner = KubernetesRunner("k8s", {"host": f"http://127.0.0.1:{free_port()}", "request_timeout": 1.0})
    spec = make_spec(runner, job("sleep 1"))

    with pytest.raises(RunnerError, match="cannot reach the Kubernetes API") as caught:
        runner.start(spec)

    assert caught.value.retryable is True


def test_transient_poll_errors_report_the_run_as_still_running(
    runner: KubernetesRunner, cluster: KubernetesEmulator
) -> None:
    spec = make_spec(runner, job("sleep 0"))
    handle = runner.start(spec)
    cluster.fail_next("GET", 502, reason="BadGateway")

    assert runner.poll(spec, handle).state is RunState.RUNNING
    assert runner.poll(spec, handle).state is RunState.SUCCEEDED


def test_forbidden_poll_is_not_retryable(runner: KubernetesRunner, cluster: KubernetesEmulator) -> None:
    spec = make_spec(runner, job("sleep 0"))
    handle = runner.start(spec)
    cluster.fail_next("GET", 403, reason="Forbidden")

    with pytest.raises(RunnerError) as caught:
        runner.poll(spec, handle)

    assert caught.value.retryable is False


def test_client_configuration_from_a_kubeconfig_file(cluster: KubernetesEmulator, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""
apiVersion: v1
kind: Config
clusters:
- name: emulated
  cluster: {{server: "{cluster.url}"}}
users:
- name: tms
  user: {{token: test-token}}
contexts:
- name: tms@emulated
  context: {{cluster: emulated, user: tms, namespace: default}}
current-context: tms@emulated
"""
    )
    runner = KubernetesRunner("k8s", {"kubeconfig": str(kubeconfig), "context": "tms@emulated"})
    spec = make_spec(runner, job("sleep 0"))

    handle = runner.start(spec)

    assert cluster.requests_matching("POST")[0].header("authorization") == "Bearer test-token"
    assert wait_for_result(runner, spec, handle).state is RunState.SUCCEEDED


def test_missing_kubeconfig_is_a_final_error(tmp_path: Path) -> None:
    runner = KubernetesRunner("k8s", {"kubeconfig": str(tmp_path / "absent")})
    spec = make_spec(runner, job("sleep 0"))

    with pytest.raises(RunnerError, match="cannot load a client configuration") as caught:
        runner.start(spec)

    assert caught.value.retryable is False


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"command": ["true"]}, "image"),
        ({"image": "busy box"}, "image"),
        ({"image": "busybox", "namespace": "Not_A_Label"}, "namespace"),
        ({"image": "busybox", "namespace": "kube-system"}, "namespace"),
        ({"image": "busybox", "resources": {"requests": {"cpu": "lots"}}}, "resources"),
        ({"image": "busybox", "resources": {"wishes": {"cpu": "1"}}}, "resources"),
        ({"image": "busybox", "labels": {"tms.io/run": "x"}}, "labels"),
        ({"image": "busybox", "labels": {"team": "has spaces"}}, "labels"),
        ({"image": "busybox", "env": {"TMS_ATTEMPT": "9"}}, "env"),
        ({"image": "busybox", "backoff_limit": -1}, "backoff_limit"),
        ({"image": "busybox", "ttl_seconds_after_finished": 5}, "ttl_seconds_after_finished"),
        ({"image": "busybox", "privileged": True}, "privileged"),
    ],
)
def test_bad_config_is_reported_per_field(runner: KubernetesRunner, config: dict[str, Any], field: str) -> None:
    with pytest.raises(serializers.ValidationError) as caught:
        runner.validate_config(config)

    assert field in caught.value.detail


def test_allowed_namespaces_open_more_than_the_default(runner: KubernetesRunner) -> None:
    assert runner.validate_config({"image": "busybox", "namespace": "batch"})["namespace"] == "batch"
    assert runner.validate_config({"image": "busybox", "namespace": "default"})["namespace"] == "default"


def test_bad_options_are_configuration_errors() -> None:
    with pytest.raises(ImproperlyConfigured, match="unknown OPTIONS token"):
        KubernetesRunner("k8s", {"token": "x"})
    with pytest.raises(ImproperlyConfigured, match="delete_propagation"):
        KubernetesRunner("k8s", {"delete_propagation": "Orphan"})
    with pytest.raises(ImproperlyConfigured, match="namespace"):
        KubernetesRunner("k8s", {"namespace": "Bad_NS"})


def test_a_job_of_another_task_with_the_same_key_is_not_adopted(
    runner: KubernetesRunner, cluster: KubernetesEmulator
) -> None:
    spec = make_spec(runner, job("sleep 1"), task_id="task-1")
    runner.start(spec)
    stranger = make_spec(runner, job("sleep 1"), execution_id=spec.execution_id, task_id="task-2")

    with pytest.raises(RunnerError, match="TMS did not create"):
        runner.start(stranger)

    assert sum(cluster.creations.values()) == 1


def test_runner_loads_from_the_tms_runners_setting(cluster: KubernetesEmulator) -> None:
    entry = {
        "BACKEND": "runners.kubernetes.KubernetesRunner",
        "OPTIONS": {"host": cluster.url, "namespace": "jobs", "allowed_namespaces": ["reports"]},
    }
    with override_settings(TMS_RUNNERS={"kubernetes": entry}):
        runner = get_runner("kubernetes")
        spec = make_spec(runner, job("sleep 0"))  # type: ignore[arg-type]
        handle = runner.start(spec)

    assert handle.external_run_id.startswith("jobs/")
