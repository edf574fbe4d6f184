"""The lambda runner, through boto3 against the Invoke API emulator on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rest_framework import serializers

from runners.aws_lambda import LambdaRunner
from runners.base import RunnerError, RunSpec, RunState
from runners.registry import get_runner
from tests.emulators.lambda_api import LambdaContext, LambdaEmulator
from tests.runners.conftest import free_port, spec_maker

make_spec = spec_maker(task_id="task-3", timeout=10.0, first_execution_id=500)


@pytest.fixture
def aws() -> Iterator[LambdaEmulator]:
    with LambdaEmulator() as emulator:
        yield emulator


ACCOUNT = "123456789012"  # the emulator's


def lambda_runner(endpoint: str, **options: Any) -> LambdaRunner:
    """A runner for the emulator's account and region, open to every function of that account."""
    return LambdaRunner(
        "lambda",
        {
            "region_name": "us-east-1",
            "account_id": ACCOUNT,
            "allowed_functions": ["*"],
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
        token_minter=lambda: "signed-token",
    )

    handle = lam.start(spec)
    aws.wait_for_background()

    assert handle.result is None
    assert lam.poll(spec, handle).state is RunState.RUNNING  # until the callback or the timeout
    assert seen[0]["day"] == "mon"
    assert seen[0]["tms"]["callback_url"] == "http://127.0.0.1:9/api/v1/callbacks/1"
    assert seen[0]["tms"]["callback_token"] == "signed-token"  # the function sends it in a header
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


def test_lambda_allowed_functions_match_names_inside_arns_of_the_runners_account() -> None:
    runner = lambda_runner("http://127.0.0.1:1", allowed_functions=["etl-*"])

    assert runner.validate_config({"function_name": "arn:aws:lambda:us-east-1:123456789012:function:etl-daily:prod"})
    assert runner.validate_config({"function_name": "123456789012:function:etl-daily"})
    assert runner.validate_config({"function_name": "etl-daily:prod"})


@pytest.mark.parametrize(
    "function_name",
    [
        "arn:aws:lambda:us-east-1:999999999999:function:etl-daily",  # another account
        "arn:aws:lambda:eu-west-1:123456789012:function:etl-daily",  # another region
        "999999999999:function:etl-daily",
        "arn:aws:lambda:us-east-1:999999999999:function:etl-daily:prod",
    ],
)
def test_lambda_a_name_pattern_does_not_open_another_accounts_or_regions_function(function_name: str) -> None:
    runner = lambda_runner("http://127.0.0.1:1", allowed_functions=["etl-*"])

    with pytest.raises(serializers.ValidationError) as caught:
        runner.validate_config({"function_name": function_name})

    assert "not open to tasks" in str(caught.value.detail["function_name"])


def test_lambda_arn_patterns_name_accounts_and_regions_explicitly() -> None:
    runner = lambda_runner(
        "http://127.0.0.1:1", allowed_functions=["arn:aws:lambda:*:999999999999:function:shared-*"], account_id=None
    )

    assert runner.validate_config({"function_name": "arn:aws:lambda:eu-west-1:999999999999:function:shared-x"})
    for refused in ("shared-x", "arn:aws:lambda:eu-west-1:123456789012:function:shared-x"):
        with pytest.raises(serializers.ValidationError):
            runner.validate_config({"function_name": refused})


def test_lambda_with_no_allow_list_allows_no_function(aws: LambdaEmulator) -> None:
    aws.register("greeter", _greet)
    runner = LambdaRunner(
        "lambda",
        {
            "region_name": "us-east-1",
            "account_id": ACCOUNT,
            "endpoint_url": aws.url,
            "aws_access_key_id": "AKIDEXAMPLE",
            "aws_secret_access_key": "not-a-real-secret",
        },
    )

    for name in ("greeter", aws.arn("greeter")):
        with pytest.raises(serializers.ValidationError):
            runner.validate_config({"function_name": name})
    config = {"function_name": "greeter", "payload": {}, "invocation_type": "RequestResponse"}
    with pytest.raises(RunnerError, match="not open to tasks") as caught:
        runner.start(RunSpec(execution_id=1, attempt=1, task_id="t", config=config, timeout=5.0))
    assert caught.value.retryable is False
    assert aws.invocations == []


def test_lambda_invokes_the_arn_it_checked(aws: LambdaEmulator, lam: LambdaRunner) -> None:
    aws.register("greeter", _greet)

    lam.start(make_spec(lam, {"function_name": "greeter", "qualifier": "3", "payload": {"name": "x"}}))

    [request] = aws.requests_matching("POST")
    assert aws.arn("greeter") in unquote(request.path)


def test_lambda_bad_options_are_configuration_errors() -> None:
    with pytest.raises(ImproperlyConfigured, match="unknown OPTIONS profile"):
        LambdaRunner("lambda", {"profile": "x"})
    with pytest.raises(ImproperlyConfigured, match="aws_secret_access_key"):
        LambdaRunner("lambda", {"aws_access_key_id": "AKID"})
    with pytest.raises(ImproperlyConfigured, match="must be a list"):
        LambdaRunner("lambda", {"allowed_functions": None})
    with pytest.raises(ImproperlyConfigured, match="needs account_id and region_name"):
        LambdaRunner("lambda", {"region_name": "us-east-1", "allowed_functions": ["etl-*"]})
    with pytest.raises(ImproperlyConfigured, match="12-digit"):
        LambdaRunner("lambda", {"account_id": "12"})
    with pytest.raises(ImproperlyConfigured, match="not a function ARN"):
        LambdaRunner("lambda", {"allowed_functions": ["arn:aws:lambda:*"]})


def test_lambda_runner_loads_from_the_tms_runners_setting(aws: LambdaEmulator) -> None:
    runners = {
        "lambda": {
            "BACKEND": "runners.aws_lambda.LambdaRunner",
            "OPTIONS": {
                "region_name": "eu-west-1",
                "account_id": ACCOUNT,
                "endpoint_url": aws.url,
                "aws_access_key_id": "AKIDEXAMPLE",
                "aws_secret_access_key": "not-a-real-secret",
                "allowed_functions": ["greeter"],
            },
        },
    }
    aws.register("greeter", _greet)
    with override_settings(TMS_RUNNERS=runners):
        lam = get_runner("lambda")
        result = lam.start(make_spec(lam, {"function_name": "greeter", "payload": {"name": "eve"}})).result

    assert result is not None and '"hello eve"' in result.output
