"""The callback URL: a job reports heartbeat, progress or its outcome; bad tokens are refused."""

from __future__ import annotations

import time
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import pytest
from rest_framework.test import APIClient

from executions import transitions
from executions.callbacks import callback_token, callback_url
from executions.models import Execution
from executions.models import ExecutionStatus as S
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


def _running(**task_fields) -> Execution:
    task = TaskFactory(timeout=timedelta(minutes=5), max_attempts=2, retry_backoff=timedelta(seconds=30), **task_fields)
    from django.utils import timezone

    (execution_id,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, timezone.now(), 5)], actor="test"
    )
    transitions.executions_take_due(limit=100, actor="monitor")
    assert transitions.execution_claim(execution_id=execution_id, attempt=1, worker_id="w:1:1", lease_seconds=60)
    assert transitions.execution_record_run(
        execution_id=execution_id, attempt=1, worker_id="w:1:1", external_run_id="job-1", run_handle={}, poll_in=60
    )
    return Execution.objects.get(pk=execution_id)


def _post(execution_id: int, token: str, body: dict):
    return APIClient().post(f"/api/v1/executions/{execution_id}/callback?token={token}", body, format="json")


def test_callback_url_carries_a_token_for_the_execution_and_attempt():
    url = urlparse(callback_url(execution_id=7, attempt=2))
    assert url.path == "/api/v1/executions/7/callback"
    (token,) = parse_qs(url.query)["token"]
    assert token == callback_token(execution_id=7, attempt=2)


def test_success_report_finishes_the_attempt_once():
    execution = _running()
    token = callback_token(execution_id=execution.pk, attempt=1)
    response = _post(execution.pk, token, {"status": "succeeded", "output": "all done"})
    assert response.status_code == 202, response.data
    assert response.data == {"result": "recorded"}
    execution.refresh_from_db()
    assert (execution.status, execution.output) == (S.SUCCEEDED, "all done")
    assert execution.events.get(to_status=S.SUCCEEDED).actor == "callback"
    # Reported again: nothing changes.
    assert _post(execution.pk, token, {"status": "failed", "error": "late"}).data == {"result": "ignored"}
    assert Execution.objects.get(pk=execution.pk).status == S.SUCCEEDED


def test_failure_report_is_retried_per_policy_and_old_attempt_token_is_refused():
    execution = _running()
    old = callback_token(execution_id=execution.pk, attempt=1)
    assert _post(execution.pk, old, {"status": "failed", "error": "disk full"}).status_code == 202
    execution.refresh_from_db()
    assert (execution.status, execution.attempt, execution.error) == (S.SCHEDULED, 2, "disk full")
    refused = _post(execution.pk, old, {"status": "succeeded"})
    assert refused.status_code == 403
    assert "attempt 1" in refused.data["detail"]


def test_heartbeat_and_progress_are_recorded_without_a_transition():
    execution = _running()
    token = callback_token(execution_id=execution.pk, attempt=1)
    assert _post(execution.pk, token, {"status": "progress", "progress": "40% of rows"}).status_code == 202
    execution.refresh_from_db()
    assert (execution.status, execution.progress) == (S.RUNNING, "40% of rows")
    assert execution.reported_at is not None


def test_token_of_another_execution_is_refused():
    first, second = _running(), _running()
    token = callback_token(execution_id=first.pk, attempt=1)
    response = _post(second.pk, token, {"status": "succeeded"})
    assert response.status_code == 403
    assert "another execution" in response.data["detail"]
    assert Execution.objects.get(pk=second.pk).status == S.RUNNING


def test_expired_token_is_refused(monkeypatch):
    execution = _running()
    issued = time.time() - (5 * 60 + 3600 + 60)  # older than timeout + grace
    monkeypatch.setattr("django.core.signing.time.time", lambda: issued)
    token = callback_token(execution_id=execution.pk, attempt=1)
    monkeypatch.undo()
    response = _post(execution.pk, token, {"status": "succeeded"})
    assert response.status_code == 403
    assert "expired" in response.data["detail"]


@pytest.mark.parametrize("token", ["", "garbage", "a:b:c"])
def test_bad_tokens_are_refused(token):
    execution = _running()
    assert _post(execution.pk, token, {"status": "succeeded"}).status_code == 403
    assert Execution.objects.get(pk=execution.pk).status == S.RUNNING


def test_bad_reports_get_400_and_unknown_executions_404():
    execution = _running()
    token = callback_token(execution_id=execution.pk, attempt=1)
    bad = _post(execution.pk, token, {"status": "done", "extra": 1})
    assert bad.status_code == 400
    assert set(bad.data["errors"]) == {"status", "extra"}
    assert _post(999999, callback_token(execution_id=999999, attempt=1), {"status": "succeeded"}).status_code == 404
