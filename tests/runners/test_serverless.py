"""The serverless runners: Lambda through boto3 against the Invoke API emulator, and the async-HTTP
function runner against the function platform emulator. All traffic goes to 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rest_framework import serializers

from runners.base import RunHandle, RunnerError, RunState
from runners.registry import get_runner
from runners.serverless import AsyncHttpFunctionRunner, LambdaRunner
from tests.emulators.function_platform import FunctionPlatformEmulator, Run
from tests.emulators.lambda_api import LambdaContext, LambdaEmulator
from tests.runners.conftest import free_port, spec_maker, wait_for_result

make_spec = spec_maker(task_id="task-3", timeout=10.0, first_execution_id=500)


# ============================================================================================
# Lambda
# ============================================================================================


@pytest.fixture
def aws() -> Iterator[LambdaEmulator]:
    with LambdaEmulator() as emulator:
        yield emulator


def lambda_runner(endpoint: str, **options: Any) -> LambdaRunner:
    return LambdaRunner(
        "lambda",
        {
            "region_name": "us-east-1",
            "endpoint_url": endpoint,
            "aws_access_key_id": "AKIDEXAMPLE",
            "aws_secret_access_key": "not-a-real-secret",
            **options,
        },
    )


@pytest.fixture
def lam(aws: LambdaEmulator) -> LambdaRunner:
    return lambda_runner(aws.url)


def _greet(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    context.log(f"greeting {event['name']}")
    return {
        "greeting": f"hello {event['name']}",
        "key_in_event": event["tms"]["idempotency_key"],
        "key_in_context": context.client_context.custom["idempotency_key"] if context.client_context else None,
    }


def test_lambda_synchronous_invocation_returns_the_result_from_start(aws: LambdaEmulator, lam: LambdaRunner) -> None:
    aws.register("greeter", _greet)
    spec = make_spec(lam, {"function_name": "greeter", "payload": {"name": "ada"}}, execution_id=12, attempt=3)

    handle = lam.start(spec)

    assert handle.result is not None
    assert handle.result.state is RunState.SUCCEEDED
    assert handle.result.output == (
        '{"greeting": "hello ada", "key_in_event": "tms-12-3", "key_in_context": "tms-12-3"}'
    )
    invocation = aws.invocations[0]
    assert handle.external_run_id == invocation.request_id
    assert invocation.invocation_type == "RequestResponse"
    assert invocation.event["tms"] == {
        "idempotency_key": "tms-12-3",
        "execution_id": 12,
        "attempt": 3,
        "task_id": "task-3",
    }
    assert handle.data["executed_version"] == "$LATEST"


def test_lambda_qualifier_and_arn_are_passed_through(aws: LambdaEmulator, lam: LambdaRunner) -> None:
    aws.register("greeter", _greet)
    spec = make_spec(lam, {"function_name": aws.arn("greeter"), "qualifier": "7", "payload": {"name": "x"}})

    handle = lam.start(spec)

    assert aws.invocations[0].qualifier == "7"
    assert handle.data["executed_version"] == "7"


class _ImportModuleError(Exception):
    error_type = "Runtime.ImportModuleError"


def _broken(event: Any, context: Any) -> None:
    raise _ImportModuleError("Unable to import module 'app': No module named 'pandas'")


def _failing(event: Any, context: Any) -> None:
    raise ValueError("downstream said no")


def test_lambda_function_error_fails_the_attempt_retryably(aws: LambdaEmulator, lam: LambdaRunner) -> None:
    aws.register("flaky", _failing)
    spec = make_spec(lam, {"function_name": "flaky"})

    result = lam.start(spec).result

    assert result is not None
    assert result.state is RunState.FAILED
    assert result.error == "function error (Unhandled): ValueError: downstream said no"
    assert result.retryable is True
    assert "[ERROR] ValueError: downstream said no" in result.output  # the log tail


def test_lambda_deployment_error_is_not_retryable(aws: LambdaEmulator, lam: LambdaRunner) -> None:
    aws.register("broken", _broken)

    result = lam.start(make_spec(lam, {"function_name": "broken"})).result

    assert result is not None
    assert (result.state, result.retryable) == (RunState.FAILED, False)
    assert result.error.startswith("function error (Unhandled): Runtime.ImportModuleError: Unable to import")


def test_lambda_function_timeout_is_a_retryable_failure(aws: LambdaEmulator, lam: LambdaRunner) -> None:
    release = threading.Event()
    aws.register("slow", lambda event, context: release.wait(5), timeout=0.3)

    result = lam.start(make_spec(lam, {"function_name": "slow"})).result
    release.set()

    assert result is not None
    assert result.state is RunState.FAILED
    assert "Sandbox.Timedout" in result.error and "Task timed out after 0.30 seconds" in result.error
    assert result.retryable is True


def test_lambda_call_longer_than_the_attempt_timeout_is_abandoned(aws: LambdaEmulator, lam: LambdaRunner) -> None:
    release = threading.Event()
    aws.register("slow", lambda event, context: release.wait(10), timeout=30)
    spec = make_spec(lam, {"function_name": "slow"}, timeout=1.0)

    started = time.monotonic()
    with pytest.raises(RunnerError, match="no answer within 1s") as caught:
        lam.start(spec)
    release.set()

    assert time.monotonic() - started < 4
    assert caught.value.retryable is True
    assert len(aws.invocations) == 1  # botocore did not re-send it


def test_lambda_unknown_function_is_not_retryable(aws: LambdaEmulator, lam: LambdaRunner) -> None:
    with pytest.raises(RunnerError, match="ResourceNotFoundException") as caught:
        lam.start(make_spec(lam, {"function_name": "missing"}))

    assert caught.value.retryable is False


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (429, "TooManyRequestsException", True),
        (500, "ServiceException", True),
        (409, "ResourceConflictException", True),
        (502, "KMSAccessDeniedException", False),
        (403, "AccessDeniedException", False),
        (400, "InvalidRequestContentException", False),
    ],
)
def test_lambda_api_errors_are_retryable_only_when_transient(
    aws: LambdaEmulator, lam: LambdaRunner, status: int, code: str, retryable: bool
) -> None:
    aws.register("greeter", _greet)
    aws.fail_next(status, code, "injected")

    with pytest.raises(RunnerError, match=code) as caught:
        lam.start(make_spec(lam, {"function_name": "greeter", "payload": {"name": "x"}}))

    assert caught.value.retryable is retryable
    assert len(aws.requests_matching("POST")) == 1  # no SDK retries behind TMS's back


def test_lambda_unreachable_endpoint_is_retryable() -> None:
    runner = lambda_runner(f"http://127.0.0.1:{free_port()}", connect_timeout=1.0)

    with pytest.raises(RunnerError, match="cannot reach Lambda") as caught:
        runner.start(make_spec(runner, {"function_name": "greeter"}))

    assert caught.value.retryable is True


def test_lambda_event_invocation_waits_for_the_callback(aws: LambdaEmulator, lam: LambdaRunner) -> None:
    seen: list[dict[str, Any]] = []
    aws.register("report", lambda event, context: seen.append(event))
    spec = make_spec(
        lam,
        {"function_name": "report", "invocation_type": "Event", "wait_for_callback": True, "payload": {"day": "mon"}},
        callback_url="http://127.0.0.1:9/api/v1/callbacks/1",
    )

    handle = lam.start(spec)
    aws.wait_for_background()

    assert handle.result is None
    assert lam.poll(spec, handle).state is RunState.RUNNING  # until the callback or the timeout
    assert seen[0]["day"] == "mon"
    assert seen[0]["tms"]["callback_url"] == "http://127.0.0.1:9/api/v1/callbacks/1"
    assert aws.invocations[0].client_context is None  # Lambda does not pass it to Event calls
    lam.cancel(spec, handle)  # Lambda cannot cancel: a no-op
    assert LambdaRunner.supports_cancel is False


def test_lambda_event_invocation_without_callback_succeeds_once_queued(aws: LambdaEmulator, lam: LambdaRunner) -> None:
    aws.register("report", lambda event, context: None)

    handle = lam.start(make_spec(lam, {"function_name": "report", "invocation_type": "Event"}))

    assert handle.result is not None
    assert handle.result.state is RunState.SUCCEEDED
    assert handle.result.output == f"queued for asynchronous invocation (request id {aws.invocations[0].request_id})"


def test_lambda_repeated_start_in_one_process_invokes_once(aws: LambdaEmulator, lam: LambdaRunner) -> None:
    aws.register("report", lambda event, context: None)
    spec = make_spec(lam, {"function_name": "report", "invocation_type": "Event", "wait_for_callback": True})

    handles = [lam.start(spec) for _ in range(3)]
    aws.wait_for_background()

    assert all(handle == handles[0] for handle in handles)
    assert len(aws.invocations) == 1
    assert aws.executions[spec.idempotency_key] == 1


def test_lambda_start_from_another_process_relies_on_the_function_to_dedupe(aws: LambdaEmulator) -> None:
    """What is and is not guaranteed across processes (see the module docstring)."""
    done: set[str] = set()
    side_effects: list[str] = []

    def deduping(event: dict[str, Any], context: Any) -> str:
        key = event["tms"]["idempotency_key"]
        if key in done:
            return "duplicate ignored"
        done.add(key)
        side_effects.append(key)
        return "done"

    aws.register("deduping", deduping)
    first_worker, second_worker = lambda_runner(aws.url), lambda_runner(aws.url)
    spec = make_spec(first_worker, {"function_name": "deduping"})

    first = first_worker.start(spec)
    second = second_worker.start(spec)  # a resumed execution in another worker process

    assert len(aws.invocations) == 2  # Lambda has no idempotency of its own ...
    assert side_effects == [spec.idempotency_key]  # ... the key lets the function run the work once
    assert first.result is not None and first.result.output == '"done"'
    assert second.result is not None and second.result.output == '"duplicate ignored"'


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({}, "function_name"),
        ({"function_name": "bad name!"}, "function_name"),
        ({"function_name": "secret-admin"}, "function_name"),
        ({"function_name": "report", "payload": [1, 2]}, "payload"),
        ({"function_name": "report", "payload": {"tms": "mine"}}, "payload"),
        ({"function_name": "report", "qualifier": "v 1"}, "qualifier"),
        ({"function_name": "report", "invocation_type": "DryRun"}, "invocation_type"),
        ({"function_name": "report", "wait_for_callback": True}, "wait_for_callback"),
        ({"function_name": "report", "region": "eu-west-1"}, "region"),
    ],
)
def test_lambda_bad_config_is_reported_per_field(config: dict[str, Any], field: str) -> None:
    runner = lambda_runner("http://127.0.0.1:1", allowed_functions=["report", "etl-*"])

    with pytest.raises(serializers.ValidationError) as caught:
        runner.validate_config(config)

    assert field in caught.value.detail


def test_lambda_allowed_functions_match_names_inside_arns() -> None:
    runner = lambda_runner("http://127.0.0.1:1", allowed_functions=["etl-*"])

    assert runner.validate_config({"function_name": "arn:aws:lambda:us-east-1:123456789012:function:etl-daily:prod"})


def test_lambda_bad_options_are_configuration_errors() -> None:
    with pytest.raises(ImproperlyConfigured, match="unknown OPTIONS profile"):
        LambdaRunner("lambda", {"profile": "x"})
    with pytest.raises(ImproperlyConfigured, match="aws_secret_access_key"):
        LambdaRunner("lambda", {"aws_access_key_id": "AKID"})


# ============================================================================================
# Async HTTP function platforms
# ============================================================================================


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
    assert fn.poll(spec, handle).error == "the run was cancelled on the platform"


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


def test_runners_load_from_the_tms_runners_setting(aws: LambdaEmulator, platform: FunctionPlatformEmulator) -> None:
    runners = {
        "lambda": {
            "BACKEND": "runners.serverless.LambdaRunner",
            "OPTIONS": {
                "region_name": "eu-west-1",
                "endpoint_url": aws.url,
                "aws_access_key_id": "AKIDEXAMPLE",
                "aws_secret_access_key": "not-a-real-secret",
                "allowed_functions": ["greeter"],
            },
        },
        "function": {
            "BACKEND": "runners.serverless.AsyncHttpFunctionRunner",
            "OPTIONS": {"allowed_urls": [f"{platform.url}/async-function/"]},
        },
    }
    aws.register("greeter", _greet)
    with override_settings(TMS_RUNNERS=runners):
        lam, fn = get_runner("lambda"), get_runner("function")
        result = lam.start(make_spec(lam, {"function_name": "greeter", "payload": {"name": "eve"}})).result

    assert isinstance(fn, AsyncHttpFunctionRunner)
    assert result is not None and '"hello eve"' in result.output
