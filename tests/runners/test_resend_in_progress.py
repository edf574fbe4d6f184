"""Issue 15, finding 9: a re-sent launch answered "still in progress" waits for the stored result.

Executors that follow the IETF Idempotency-Key draft (and Stripe) answer 409 Conflict while a
request with the same key is still being processed. A worker SIGKILLed mid-request left its
attempt to another worker, whose re-send met 409 and failed a run that then succeeded. Now a
re-sent launch (``RunSpec.resend``) that meets one of the runner's ``in_progress_statuses``
(default [409]) is sent again with the same key, with backoff, until the stored answer comes.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from runners.base import RunSpec, RunState
from runners.function import AsyncHttpFunctionRunner
from runners.http import HttpRunner
from tests.runners.idempotent_server import IdempotentEndpoint

LOOPBACK = ["127.0.0.1/32"]


def _spec(runner: Any, config: dict[str, Any], *, resend: bool, timeout: float = 10.0) -> RunSpec:
    return RunSpec(
        execution_id=42,
        attempt=1,
        task_id="task-1",
        config=runner.validate_config(config),
        timeout=timeout,
        resend=resend,
    )


def _first_request_in_flight(runner: Any, spec: RunSpec, endpoint: IdempotentEndpoint) -> threading.Thread:
    """Send the first launch from a thread (the worker that is then lost) and wait until the
    endpoint is working on it."""
    thread = threading.Thread(target=runner.start, args=(spec,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not endpoint.launches and time.monotonic() < deadline:
        time.sleep(0.01)
    assert endpoint.launches, "the first request never arrived"
    return thread


def test_a_resent_http_launch_waits_out_409_and_gets_the_stored_result():
    http = HttpRunner("http", {"allowed_networks": LOOPBACK})
    with IdempotentEndpoint(work_seconds=1.5) as endpoint:
        config = {"url": endpoint.url(), "json": {"report": "daily"}}
        first = _first_request_in_flight(http, _spec(http, config, resend=False), endpoint)
        handle = http.start(_spec(http, config, resend=True))
        first.join(5)
    assert handle.result is not None
    assert (handle.result.state, handle.result.error) == (RunState.SUCCEEDED, "")
    assert '"done tms-42-1"' in handle.result.output
    assert endpoint.launches == {"tms-42-1": 1}
    assert endpoint.conflicts["tms-42-1"] >= 2  # it was re-sent while in progress, with backoff
    assert endpoint.conflicts["tms-42-1"] <= 6  # 0.25 s doubling: a handful of re-sends in 1.5 s


def test_a_first_http_launch_answered_409_is_still_a_conflict():
    """Only a re-send can meet its own earlier request: a first send's 409 is the executor's
    answer about the request, judged as any other 4xx."""
    http = HttpRunner("http", {"allowed_networks": LOOPBACK})
    with IdempotentEndpoint(work_seconds=3.0) as endpoint:
        config = {"url": endpoint.url(), "json": {}}
        first = _first_request_in_flight(http, _spec(http, config, resend=False), endpoint)
        handle = http.start(_spec(http, config, resend=False))
        first.join(5)
    assert handle.result is not None and handle.result.state is RunState.FAILED
    assert handle.result.error.startswith("HTTP 409")
    assert handle.result.retryable is False


def test_the_in_progress_statuses_are_an_option_of_the_runner():
    http = HttpRunner("http", {"allowed_networks": LOOPBACK, "in_progress_statuses": [425]})
    # Long enough that the re-send meets the first request still at work on a loaded machine (at
    # 1 s, CI's re-send once came after it had finished: no 425 seen).
    with IdempotentEndpoint(work_seconds=3.0, busy_status=425) as endpoint:
        config = {"url": endpoint.url(), "json": {}}
        first = _first_request_in_flight(http, _spec(http, config, resend=False), endpoint)
        handle = http.start(_spec(http, config, resend=True))
        first.join(5)
    assert handle.result is not None and handle.result.state is RunState.SUCCEEDED
    assert endpoint.launches == {"tms-42-1": 1} and endpoint.conflicts["tms-42-1"] >= 1
    # With 409 no longer listed, a re-send answered 409 is judged as it comes.
    strict = HttpRunner("http", {"allowed_networks": LOOPBACK, "in_progress_statuses": []})
    with IdempotentEndpoint(work_seconds=3.0) as endpoint:
        config = {"url": endpoint.url(), "json": {}}
        first = _first_request_in_flight(strict, _spec(strict, config, resend=False), endpoint)
        handle = strict.start(_spec(strict, config, resend=True))
        first.join(5)
    assert handle.result is not None and handle.result.error.startswith("HTTP 409")


@pytest.mark.parametrize("value", [409, ["409"], [200, 700], [True]])
def test_a_bad_in_progress_statuses_option_is_a_configuration_error(value):
    with pytest.raises(ImproperlyConfigured, match="in_progress_statuses must be a list of HTTP status codes"):
        HttpRunner("http", {"in_progress_statuses": value})
    with pytest.raises(ImproperlyConfigured, match="in_progress_statuses"):
        AsyncHttpFunctionRunner("function", {"in_progress_statuses": value})


def test_waiting_for_a_request_in_progress_is_bounded_by_the_attempts_timeout():
    http = HttpRunner("http", {"allowed_networks": LOOPBACK})
    with IdempotentEndpoint(work_seconds=30) as endpoint:
        config = {"url": endpoint.url(), "json": {}, "timeout": "1s"}
        _first_request_in_flight(http, _spec(http, config, resend=False, timeout=30), endpoint)
        started = time.monotonic()
        handle = http.start(_spec(http, config, resend=True, timeout=1.5))
        took = time.monotonic() - started
    assert handle.result is not None and handle.result.state is RunState.FAILED
    assert handle.result.retryable is True  # a timeout, as any other: the attempt's retry policy decides
    assert "timed out after 1.5s: the executor still answered HTTP 409" in handle.result.error
    assert 1.5 <= took < 3.0
    assert endpoint.launches == {"tms-42-1": 1}
    assert 3 <= endpoint.conflicts["tms-42-1"] <= 6


def _accepted(key: str, endpoint: IdempotentEndpoint) -> tuple[int, Any]:
    return 202, {"run_id": f"run-{key}", "status_url": endpoint.url(f"/status/{key}")}


def test_a_resent_function_start_waits_out_409_and_adopts_the_run():
    with IdempotentEndpoint(work_seconds=1.0, answer=_accepted) as endpoint:
        function = AsyncHttpFunctionRunner("function", {"allowed_urls": [endpoint.url("/")]})
        config = {"url": endpoint.url(), "payload": {"n": 1}}
        first = _first_request_in_flight(function, _spec(function, config, resend=False), endpoint)
        handle = function.start(_spec(function, config, resend=True))
        first.join(5)
    assert handle.external_run_id == "run-tms-42-1"
    assert handle.data["status_url"].endswith("/status/tms-42-1")
    assert endpoint.launches == {"tms-42-1": 1} and endpoint.conflicts["tms-42-1"] >= 1


# --- end to end: a worker SIGKILLed mid-request, another resumes the attempt ------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_request_is_resumed_to_success_with_one_launch():
    from executions.models import Execution
    from executions.models import ExecutionStatus as S
    from tasks_api.creation import task_create
    from tests.factories import UserFactory
    from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready

    fast = {"TMS_HEARTBEAT_INTERVAL": "0.5", "TMS_WORKER_TIMEOUT": "3", "TMS_MONITOR_MAX_SLEEP": "0.3"}
    env = {**fast, "TMS_HTTP_ALLOWED_NETWORKS": "127.0.0.1/32"}
    runners = copy.deepcopy(settings.TMS_RUNNERS)
    runners["http"]["OPTIONS"]["allowed_networks"] = LOOPBACK
    # The first request takes 8 s: the kill, the lease running out (3 s) and the resume all
    # happen while the endpoint still works on it, so the resumed re-send meets 409.
    with IdempotentEndpoint(work_seconds=8) as endpoint, override_settings(TMS_RUNNERS=runners):
        workers = [start_worker("a", concurrency=1, **env), start_worker("b", concurrency=1, **env)]
        with running(*workers, start_monitor(**env)):
            for worker in workers:
                wait_worker_ready(worker)
            task = task_create(owner=UserFactory(), runner="http", config={"url": endpoint.url(), "json": {}})
            wait_for(lambda: endpoint.launches, timeout=20, what="the first request to arrive")
            (execution,) = Execution.objects.filter(task=task)
            starter = int(execution.events.get(to_status=S.RUNNING).actor.split(":")[1])
            (victim,) = [worker for worker in workers if worker.pid == starter]
            victim.signal_group(9)
            wait_for(
                lambda: Execution.objects.get(pk=execution.pk).status in (S.SUCCEEDED, S.FAILED, S.SCHEDULED),
                timeout=40,
                what="the resumed attempt to end",
            )
        execution.refresh_from_db()
    assert (execution.status, execution.attempt, execution.error) == (S.SUCCEEDED, 1, "")
    assert f"done tms-{execution.pk}-1" in execution.output
    assert execution.events.filter(detail="resumed after the previous lease expired").exists()
    assert endpoint.launches == {f"tms-{execution.pk}-1": 1}
    assert endpoint.conflicts[f"tms-{execution.pk}-1"] >= 1  # the re-send did meet the first request
