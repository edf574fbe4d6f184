"""The status classification every HTTP-speaking runner shares (runners.transport)."""

from __future__ import annotations

import pytest

from runners.base import RunState
from runners.kubernetes import KubernetesApiError
from runners.transport import origin, status_document_result, status_is_retryable


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        *[(status, True) for status in (500, 502, 503, 599, 408, 425, 429)],
        *[(status, False) for status in (400, 401, 403, 404, 409, 410, 422)],
    ],
)
def test_http_statuses_worth_another_try(status: int, retryable: bool) -> None:
    assert status_is_retryable(status) is retryable
    # The Kubernetes API's errors are judged by the same rule (a missing status: no answer at all).
    assert KubernetesApiError("x", status=status).retryable is retryable


def test_a_kubernetes_error_without_a_status_is_retryable() -> None:
    assert KubernetesApiError("no answer", status=None).retryable is True


def test_errors_name_the_origin_never_the_path_or_credentials() -> None:
    assert origin("https://user:secret@api.example.com:8443/hooks/T0KEN?sig=1") == "https://api.example.com:8443"
    assert origin("http://[::1") == "the endpoint"


@pytest.mark.parametrize(
    ("document", "state", "error", "retryable"),
    [
        ({"status": "Running"}, RunState.RUNNING, "", True),
        ({"status": "done", "output": {"rows": 3}}, RunState.SUCCEEDED, "", True),
        ({"status": "failed", "error": "disk full"}, RunState.FAILED, "disk full", True),
        ({"status": "error", "retryable": False}, RunState.FAILED, "the run reported failure", False),
        ({"status": "cancelled"}, RunState.FAILED, "the run was cancelled on the platform (http://p:1)", False),
        (
            {"status": "aborted", "retryable": True},
            RunState.FAILED,
            "the run was cancelled on the platform (http://p:1)",
            True,
        ),
        ({"status": "paused"}, RunState.FAILED, "unknown run status 'paused' from http://p:1", False),
        ({}, RunState.FAILED, "unknown run status '' from http://p:1", False),
    ],
)
def test_a_status_document_reads_the_same_for_every_runner(
    document: dict[str, object], state: RunState, error: str, retryable: bool
) -> None:
    result = status_document_result(document, limit=100, source="http://p:1")

    assert (result.state, result.error, result.retryable) == (state, error, retryable)


def test_a_status_document_output_is_cut_to_the_limit_in_bytes() -> None:
    result = status_document_result({"status": "succeeded", "output": "é" * 100}, limit=11, source="x")

    assert result.output.startswith("é" * 5) and "more bytes omitted" in result.output
