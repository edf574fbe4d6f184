"""The status classification every HTTP-speaking runner shares (runners.transport)."""

from __future__ import annotations

import pytest

from runners.kubernetes import KubernetesApiError
from runners.transport import origin, status_is_retryable


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
