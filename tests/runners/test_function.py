"""The function runner (asynchronous HTTP function platforms) against the platform emulator on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rest_framework import serializers

from runners.base import RunHandle, RunnerError, RunState
from runners.function import AsyncHttpFunctionRunner
from runners.registry import get_runner
from tests.emulators.function_platform import FunctionPlatformEmulator, Run
from tests.runners.conftest import free_port, spec_maker, wait_for_result

make_spec = spec_maker(task_id="task-3", timeout=10.0, first_execution_id=500)


@pytest.fixture
def platform() -> Iterator[FunctionPlatformEmulator]:
    with FunctionPlatformEmulator() as emulator:
        yield emulator


@pytest.fixture
def fn(platform: FunctionPlatformEmulator) -> AsyncHttpFunctionRunner:
    return AsyncHttpFunctionRunner(
        "faas", {"allowed_urls": [f"{platform.url}/async-function/"], "request_timeout": 2.0}
    )


def _resize(payload: dict[str, Any], run: Run) -> dict[str, Any]:
    run.sleep(0.2)
    return {"resized": payload["image"], "key": run.headers["idempotency-key"]}


def test_async_function_runs_to_success(platform: FunctionPlatformEmulator, fn: AsyncHttpFunctionRunner) -> None:
    platform.register("resize", _resize)
    spec = make_spec(
        fn,
        {"url": platform.function_url("resize"), "payload": {"image": "cat.png"}, "headers": {"X-Team": "imaging"}},
        execution_id=4,
        attempt=2,
    )

    handle = fn.start(spec)

    assert handle.result is None
    assert handle.data["status_url"] == f"{platform.url}/runs/{handle.external_run_id}"
    assert fn.poll(spec, handle).state is RunState.RUNNING
    result = wait_for_result(fn, spec, handle)
    assert result.state is RunState.SUCCEEDED
    assert result.output == '{"resized": "cat.png", "key": "tms-4-2"}'
    sent = platform.requests_matching("POST")[0]
    assert sent.header("x-team") == "imaging"
    assert sent.header("x-tms-execution-id") == "4" and sent.header("x-tms-attempt") == "2"
    assert platform.launches["resize"] == 1


def test_async_function_failure_is_reported(platform: FunctionPlatformEmulator, fn: AsyncHttpFunctionRunner) -> None:
    def explode(payload: Any, run: Run) -> None:
        raise RuntimeError("out of memory")

    platform.register("explode", explode)
    spec = make_spec(fn, {"url": platform.function_url("explode")})

    result = wait_for_result(fn, spec, fn.start(spec))

    assert result.state is RunState.FAILED
    assert result.error == "RuntimeError: out of memory"
    assert result.retryable is True


def _long(payload: Any, run: Run) -> str:
    run.sleep(30)
    return "never"


def test_async_function_timeout_cancels_the_run_with_a_delete(
    platform: FunctionPlatformEmulator, fn: AsyncHttpFunctionRunner
) -> None:
    platform.register("long", _long)
    spec = make_spec(fn, {"url": platform.function_url("long")}, timeout=0.3)
    handle = fn.start(spec)
    started = time.monotonic()
    # What the worker does: poll until the attempt is past its timeout, then cancel.
    while fn.poll(spec, handle).state is RunState.RUNNING and time.monotonic() - started < spec.timeout:
        time.sleep(0.05)

    fn.cancel(spec, handle)

    assert platform.deletes == [handle.external_run_id]
    run = platform.runs[handle.external_run_id]
    assert run.finished.wait(2)  # the handler saw the cancellation and stopped
    assert run.status == "cancelled"
    result = fn.poll(spec, handle)
    assert result.error == f"the run was cancelled on the platform ({platform.url})"
    # Stopped there on purpose: another attempt would start it again behind that decision (the
    # http runner always read it so; this runner used to retry it).
    assert result.retryable is False


def test_async_function_cancel_of_an_unknown_run_is_quiet(
    platform: FunctionPlatformEmulator, fn: AsyncHttpFunctionRunner
) -> None:
    spec = make_spec(fn, {"url": platform.function_url("long")})
    handle = RunHandle("nope", {"run_id": "nope", "status_url": f"{platform.url}/runs/nope"})

    fn.cancel(spec, handle)

    assert fn.poll(spec, handle).error == "run nope is unknown to the platform (HTTP 404)"


def test_async_function_repeated_start_returns_the_same_run(
    platform: FunctionPlatformEmulator, fn: AsyncHttpFunctionRunner
) -> None:
    platform.register("resize", _resize)
    spec = make_spec(fn, {"url": platform.function_url("resize"), "payload": {"image": "a.png"}})
    other_worker = AsyncHttpFunctionRunner("faas", dict(fn.options))

    handles = [fn.start(spec), fn.start(spec), other_worker.start(spec)]

    assert all(handle == handles[0] for handle in handles)
    assert len(platform.requests_matching("POST")) == 3
    assert platform.launches["resize"] == 1
    assert wait_for_result(fn, spec, handles[0]).state is RunState.SUCCEEDED


@pytest.mark.parametrize(("status", "retryable"), [(503, True), (429, True), (400, False), (409, False)])
def test_async_function_start_errors(
    platform: FunctionPlatformEmulator, fn: AsyncHttpFunctionRunner, status: int, retryable: bool
) -> None:
    platform.register("resize", _resize)
    platform.fail_next("POST", status)

    with pytest.raises(RunnerError, match=f"HTTP {status}") as caught:
        fn.start(make_spec(fn, {"url": platform.function_url("resize")}))

    assert caught.value.retryable is retryable
    assert platform.launches["resize"] == 0


def test_async_function_unreachable_platform_is_retryable() -> None:
    base = f"http://127.0.0.1:{free_port()}/async-function/"
    runner = AsyncHttpFunctionRunner("faas", {"allowed_urls": [base]})

    with pytest.raises(RunnerError, match="cannot connect") as caught:
        runner.start(make_spec(runner, {"url": base + "resize"}))

    assert caught.value.retryable is True


def test_async_function_transient_poll_errors_keep_the_run_running(
    platform: FunctionPlatformEmulator, fn: AsyncHttpFunctionRunner
) -> None:
    platform.register("resize", _resize)
    spec = make_spec(fn, {"url": platform.function_url("resize"), "payload": {"image": "a.png"}})
    handle = fn.start(spec)
    platform.runs[handle.external_run_id].finished.wait(2)
    platform.fail_next("GET", 502)

    assert fn.poll(spec, handle).state is RunState.RUNNING
    assert fn.poll(spec, handle).state is RunState.SUCCEEDED


def test_async_function_status_url_outside_the_allow_list_is_refused(
    platform: FunctionPlatformEmulator, fn: AsyncHttpFunctionRunner
) -> None:
    platform.register("resize", _resize)
    platform.status_url_override = "http://127.0.0.1:1/admin/runs/1"

    with pytest.raises(RunnerError, match="outside allowed_urls") as caught:
        fn.start(make_spec(fn, {"url": platform.function_url("resize")}))

    assert caught.value.retryable is False


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({}, "url"),
        ({"url": "ftp://127.0.0.1/async-function/x"}, "url"),
        ({"url": "http://169.254.169.254/latest/meta-data/"}, "url"),
        ({"url": "{base}/async-function/../admin"}, "url"),
        ({"url": "{base}/async-functionX"}, "url"),
        ({"url": "{base}/async-function/x", "headers": {"Idempotency-Key": "mine"}}, "headers"),
        ({"url": "{base}/async-function/x", "headers": {"X-TMS-Attempt": "9"}}, "headers"),
        ({"url": "{base}/async-function/x", "headers": {"Bad Header": "1"}}, "headers"),
        ({"url": "{base}/async-function/x", "headers": {"X-Evil": "a\r\nb"}}, "headers"),
        ({"url": "{base}/async-function/x", "method": "PUT"}, "method"),
    ],
)
def test_async_function_bad_config_is_reported_per_field(
    platform: FunctionPlatformEmulator, fn: AsyncHttpFunctionRunner, config: dict[str, Any], field: str
) -> None:
    if "url" in config:
        config = {**config, "url": config["url"].format(base=platform.url)}

    with pytest.raises(serializers.ValidationError) as caught:
        fn.validate_config(config)

    assert field in caught.value.detail


def test_async_function_bad_allowed_urls_are_configuration_errors() -> None:
    with pytest.raises(ImproperlyConfigured, match="allowed_urls"):
        AsyncHttpFunctionRunner("faas", {"allowed_urls": ["gateway:8080"]})
    with pytest.raises(ImproperlyConfigured, match="allowed_urls"):
        AsyncHttpFunctionRunner("faas", {"allowed_urls": "http://gateway/"})


def test_function_runner_loads_from_the_tms_runners_setting(platform: FunctionPlatformEmulator) -> None:
    runners = {
        "function": {
            "BACKEND": "runners.function.AsyncHttpFunctionRunner",
            "OPTIONS": {"allowed_urls": [f"{platform.url}/async-function/"]},
        },
    }
    with override_settings(TMS_RUNNERS=runners):
        fn = get_runner("function")

    assert isinstance(fn, AsyncHttpFunctionRunner)


def test_async_function_408_is_retried_as_the_http_runner_retries_it(
    platform: FunctionPlatformEmulator, fn: AsyncHttpFunctionRunner
) -> None:
    """Both runners judge statuses through runners.transport: 408 Request Timeout is transient."""
    platform.register("resize", _resize)
    platform.fail_next("POST", 408)

    with pytest.raises(RunnerError, match="HTTP 408") as caught:
        fn.start(make_spec(fn, {"url": platform.function_url("resize")}))

    assert caught.value.retryable is True


@contextlib.contextmanager
def _one_answer(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    """A server on 127.0.0.1 that reads one request and answers it with ``answer(connection,
    release)`` (which should end once ``release`` is set); yields the base URL of its functions."""
    listener = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection, contextlib.suppress(OSError):
            connection.recv(65536)
            answer(connection, release)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/"
    finally:
        release.set()
        server.join(5)
        listener.close()


def test_async_function_answer_that_stalls_mid_body_is_a_retryable_timeout() -> None:
    """A platform that sends its headers and then stops is a timeout (a RunnerError worth another
    attempt), not an exception from urllib3 that no runner caller expects."""

    def stall(connection: socket.socket, release: threading.Event) -> None:
        connection.sendall(
            b'HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"run_id"'
        )
        release.wait(10)

    with _one_answer(stall) as root:
        base = root + "async-function/"
        runner = AsyncHttpFunctionRunner("faas", {"allowed_urls": [base], "request_timeout": 0.5})
        with pytest.raises(RunnerError, match=r"timed out after 0\.5s waiting for http://127\.0\.0\.1") as caught:
            runner.start(make_spec(runner, {"url": base + "resize"}))

    assert caught.value.retryable is True


def test_async_function_status_that_trickles_is_cut_off_at_the_request_timeout() -> None:
    """Socket timeouts bound each read only: a platform sending its status a byte at a time, each
    well within the timeout, held the poll (and the worker, past the task's timeout) for as long
    as it kept sending. The whole exchange has a deadline now, as the http runner's has."""

    def trickle(connection: socket.socket, release: threading.Event) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n")
        while not release.wait(0.1):  # 4,000 bytes at 10 a second: 400 s without a deadline
            connection.sendall(b" ")

    with _one_answer(trickle) as root:
        base = root + "async-function/"
        runner = AsyncHttpFunctionRunner("faas", {"allowed_urls": [base], "request_timeout": 0.5})
        spec = make_spec(runner, {"url": base + "resize"})
        started = time.monotonic()
        result = runner.poll(spec, RunHandle("r1", {"run_id": "r1", "status_url": root + "runs/r1"}))
        elapsed = time.monotonic() - started

    assert result.state is RunState.RUNNING  # a timed-out poll is transient trouble: polled again later
    assert elapsed < 10  # the deadline is 0.5 s; without one this poll lasted 400 s
