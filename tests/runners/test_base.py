"""What every backend shares from runners.base: refusals, header rules, output bounds, transient polls."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from rest_framework import serializers

from runners.base import BaseRunner, RunState, bounded_head, validate_headers, validate_json_size
from runners.function import AsyncHttpFunctionRunner
from runners.http import HttpRunner
from runners.subprocess import SubprocessRunner


def _detail(runner: BaseRunner, config: dict[str, object]) -> dict[str, list[str]]:
    with pytest.raises(serializers.ValidationError) as caught:
        runner.validate_config(config)
    return {field: [str(message) for message in messages] for field, messages in caught.value.detail.items()}


def test_refusals_name_the_option_that_would_allow_the_value(tmp_path: Path) -> None:
    http = HttpRunner("web", {})
    function = AsyncHttpFunctionRunner("faas", {"allowed_urls": ["https://gateway.internal/async-function/"]})
    local = SubprocessRunner("local", {"work_dir": str(tmp_path)})

    assert _detail(http, {"url": "http://10.0.0.1/"}) == {
        "url": [
            "This address is not reachable from TMS: 10.0.0.1 is a private address. "
            "An operator can open it in the allowed_networks option of the 'web' runner."
        ]
    }
    assert _detail(function, {"url": "https://elsewhere.example/fn"}) == {
        "url": [
            "This URL is not open to tasks. An operator can add its prefix to the allowed_urls option "
            "of the 'faas' runner."
        ]
    }
    assert _detail(local, {"artifact": True}) == {
        "artifact": [
            "This runner does not run uploaded artifacts. An operator can switch on the allow_artifacts "
            "option of the 'local' runner."
        ]
    }
    assert _detail(local, {"command": ["/bin/rm"]}) == {
        "command": [
            "'/bin/rm' is not an allowed executable. An operator can add it to the allowed_executables "
            "option of the 'local' runner."
        ]
    }


def test_header_rules_are_the_same_for_the_http_and_function_runners() -> None:
    http = HttpRunner("http", {})
    function = AsyncHttpFunctionRunner("faas", {"allowed_urls": ["https://gateway.internal/async-function/"]})
    headers = {"Bad Name": "1", "Content-Length": "9", "X-Ok": "a\r\nb"}
    expected = [
        "'Bad Name' is not a valid header name.",
        "The Content-Length header is set by the runner and cannot be configured.",
        "The value of X-Ok may not contain line breaks or NUL.",
    ]

    assert _detail(http, {"url": "https://example.com/", "headers": headers}) == {"headers": expected}
    url = "https://gateway.internal/async-function/fn"
    assert _detail(function, {"url": url, "headers": headers}) == {"headers": expected}
    # Each runner adds the headers it sets itself.
    assert "set by the runner" in str(
        _detail(http, {"url": "https://example.com/", "headers": {"X-TMS-Callback-URL": "x"}})
    )
    assert http.validate_config({"url": "https://example.com/", "headers": {"Content-Type": "text/csv"}})
    assert "set by the runner" in str(_detail(function, {"url": url, "headers": {"Content-Type": "text/csv"}}))
    assert "set by the runner" in str(_detail(function, {"url": url, "headers": {"X-TMS-Attempt": "9"}}))


def test_validate_headers_returns_good_headers_unchanged() -> None:
    headers = {"Authorization": "Bearer t", "X-Empty": ""}

    assert validate_headers(headers) is headers


def test_json_size_and_output_bounds() -> None:
    assert validate_json_size({"a": "x" * 10}, 100) == {"a": "x" * 10}
    with pytest.raises(serializers.ValidationError, match="At most 10 bytes of JSON"):
        validate_json_size({"a": "x" * 10}, 10)
    assert bounded_head("héllo", 100) == "héllo"
    assert bounded_head("héllo", 2) == "h\n[... 4 more bytes omitted]"  # never half a character


def test_poll_again_logs_the_trouble_and_reports_running(caplog: pytest.LogCaptureFixture) -> None:
    http = HttpRunner("web", {})
    log = logging.getLogger("runners.http")

    with caplog.at_level(logging.WARNING, logger="runners.http"):
        result = http.poll_again(log, "status check of %s got HTTP %s", "run-1", 503)

    assert result.state is RunState.RUNNING
    assert caplog.messages == ["HttpRunner 'web': status check of run-1 got HTTP 503, will poll again"]


def test_every_runner_hands_on_the_same_attempt_facts_under_its_own_names() -> None:
    """The environment (subprocess, kubernetes), Lambda's metadata and the function runner's
    headers carry one set of facts; unset ones are left out, and a token goes only with a URL."""
    from runners.aws_lambda import _metadata
    from runners.base import RunSpec

    full = RunSpec(
        execution_id=7,
        attempt=2,
        task_id="t-1",
        config={},
        timeout=5.0,
        callback_url="https://tms.example/cb",
        token_minter=lambda: "tok",
        tracing_id="trace-1",
        traceparent="00-abc-def-01",
    )
    assert full.environment() == {
        "TMS_EXECUTION_ID": "7",
        "TMS_ATTEMPT": "2",
        "TMS_TASK_ID": "t-1",
        "TMS_IDEMPOTENCY_KEY": full.idempotency_key,
        "TMS_CALLBACK_URL": "https://tms.example/cb",
        "TMS_CALLBACK_TOKEN": "tok",
        "TMS_TRACING_ID": "trace-1",
        "TRACEPARENT": "00-abc-def-01",
    }
    assert _metadata(full) == {
        "idempotency_key": full.idempotency_key,
        "execution_id": 7,
        "attempt": 2,
        "task_id": "t-1",
        "callback_url": "https://tms.example/cb",
        "callback_token": "tok",
        "tracing_id": "trace-1",
        "traceparent": "00-abc-def-01",
    }
    headers = AsyncHttpFunctionRunner._tms_headers(full)
    assert headers["X-TMS-Callback-Token"] == "tok" and headers["traceparent"] == "00-abc-def-01"
    assert headers["Accept"] == "application/json" and len(headers) == 9

    bare = RunSpec(execution_id=7, attempt=2, task_id="t-1", config={}, timeout=5.0, token_minter=lambda: "tok")
    assert set(bare.environment()) == {"TMS_EXECUTION_ID", "TMS_ATTEMPT", "TMS_TASK_ID", "TMS_IDEMPOTENCY_KEY"}
    assert set(_metadata(bare)) == {"idempotency_key", "execution_id", "attempt", "task_id"}
