"""The callback URL: a job reports heartbeat, progress or its outcome with the token in a header;
bad tokens are refused before the execution is looked up, alike for every id; reports are throttled."""

from __future__ import annotations

import time
from datetime import timedelta
from urllib.parse import urlparse

import pytest
from django.core.cache import cache
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
    assert transitions.execution_claim_loaded(execution_id=execution_id, attempt=1, worker_id="w:1:1", lease_seconds=60)
    assert transitions.execution_record_run(
        execution_id=execution_id, attempt=1, worker_id="w:1:1", external_run_id="job-1", run_handle={}, poll_in=60
    )
    return Execution.objects.get(pk=execution_id)


def _post(execution_id: int, token: str, body: dict, *, header: str = "X-TMS-Callback-Token"):
    value = f"Bearer {token}" if header == "Authorization" else token
    return APIClient().post(f"/api/v1/executions/{execution_id}/callback", body, format="json", headers={header: value})


def token_for(execution_id: int, attempt: int = 1, timeout: float = 300) -> str:
    return callback_token(execution_id=execution_id, attempt=attempt, timeout=timeout)


def test_callback_url_carries_no_token():
    url = urlparse(callback_url(execution_id=7))
    assert url.path == "/api/v1/executions/7/callback"
    assert url.query == ""


def test_success_report_finishes_the_attempt_once():
    execution = _running()
    token = token_for(execution.pk)
    response = _post(execution.pk, token, {"status": "succeeded", "output": "all done"})
    assert response.status_code == 202, response.data
    assert response.data == {"result": "recorded"}  # an outcome renews nothing
    execution.refresh_from_db()
    assert (execution.status, execution.output) == (S.SUCCEEDED, "all done")
    assert execution.events.get(to_status=S.SUCCEEDED).actor == "callback"
    # Reported again: nothing changes.
    assert _post(execution.pk, token, {"status": "failed", "error": "late"}).data == {"result": "ignored"}
    assert Execution.objects.get(pk=execution.pk).status == S.SUCCEEDED


def test_failure_report_is_retried_per_policy_and_old_attempt_token_is_refused():
    execution = _running()
    old = token_for(execution.pk)
    assert _post(execution.pk, old, {"status": "failed", "error": "disk full"}).status_code == 202
    execution.refresh_from_db()
    assert (execution.status, execution.attempt, execution.error) == (S.SCHEDULED, 2, "disk full")
    refused = _post(execution.pk, old, {"status": "succeeded"})
    assert refused.status_code == 403
    assert "attempt 1" in refused.data["detail"]


def test_heartbeat_and_progress_are_recorded_without_a_transition():
    execution = _running()
    token = token_for(execution.pk)
    assert _post(execution.pk, token, {"status": "progress", "progress": "40% of rows"}).status_code == 202
    execution.refresh_from_db()
    assert (execution.status, execution.progress) == (S.RUNNING, "40% of rows")
    assert execution.reported_at is not None


def test_token_of_another_execution_is_refused():
    first, second = _running(), _running()
    token = token_for(first.pk)
    response = _post(second.pk, token, {"status": "succeeded"})
    assert response.status_code == 403
    assert "another execution" in response.data["detail"]
    assert Execution.objects.get(pk=second.pk).status == S.RUNNING


def test_expired_token_is_refused(monkeypatch):
    execution = _running()
    issued = time.time() - (5 * 60 + 300 + 60)  # older than min(timeout, 1 h) + grace
    monkeypatch.setattr("django.core.signing.time.time", lambda: issued)
    token = token_for(execution.pk)
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
    token = token_for(execution.pk)
    bad = _post(execution.pk, token, {"status": "done", "extra": 1})
    assert bad.status_code == 400
    assert set(bad.data["errors"]) == {"status", "extra"}
    assert _post(999999, token_for(999999), {"status": "succeeded"}).status_code == 404


# --- Issue 15, finding 7: no existence oracle, token in a header, short life, throttle ---------


@pytest.mark.parametrize("token", ["", "garbage", "bad-token-for-everyone"])
def test_a_bad_token_gets_the_same_answer_for_an_existing_and_a_missing_execution(token, django_assert_num_queries):
    execution = _running()
    missing = execution.pk + 1000
    with django_assert_num_queries(0):  # the token is checked before any lookup
        existing = _post(execution.pk, token, {"status": "succeeded"})
        absent = _post(missing, token, {"status": "succeeded"})
    assert existing.status_code == absent.status_code == 403
    assert existing.json() == absent.json()
    assert Execution.objects.get(pk=execution.pk).status == S.RUNNING


def test_a_token_for_another_execution_gets_the_same_answer_whether_the_target_exists():
    first = _running()
    token = token_for(first.pk)
    existing_target = _running()
    answers = [_post(target, token, {"status": "succeeded"}) for target in (existing_target.pk, 10**9)]
    assert [a.status_code for a in answers] == [403, 403]
    assert answers[0].json() == answers[1].json()


def test_a_token_in_the_query_string_is_refused_and_changes_nothing():
    execution = _running()
    token = token_for(execution.pk)
    response = APIClient().post(
        f"/api/v1/executions/{execution.pk}/callback?token={token}", {"status": "succeeded"}, format="json"
    )
    assert response.status_code == 403
    assert "X-TMS-Callback-Token" in response.json()["detail"]
    assert Execution.objects.get(pk=execution.pk).status == S.RUNNING


def test_the_token_may_come_as_a_bearer_authorization():
    execution = _running()
    response = _post(execution.pk, token_for(execution.pk), {"status": "succeeded"}, header="Authorization")
    assert response.status_code == 202, response.data
    assert Execution.objects.get(pk=execution.pk).status == S.SUCCEEDED


def test_a_token_lives_an_hour_plus_grace_even_for_a_task_timeout_of_ten_years(monkeypatch):
    execution = _running()
    ten_years = timedelta(days=3650).total_seconds()
    issued = time.time() - (3600 + 300 + 5)
    monkeypatch.setattr("django.core.signing.time.time", lambda: issued)
    old = token_for(execution.pk, timeout=ten_years)
    monkeypatch.undo()
    refused = _post(execution.pk, old, {"status": "succeeded"})
    assert refused.status_code == 403 and "expired" in refused.json()["detail"]
    # Issued just now, the same token is fine.
    assert _post(execution.pk, token_for(execution.pk, timeout=ten_years), {"status": "heartbeat"}).status_code == 202


def test_a_token_claiming_a_longer_life_is_still_bounded_by_its_signature_age(monkeypatch, settings):
    from django.core import signing

    from executions.callbacks import _SALT

    execution = _running()
    issued = time.time() - (3600 + 300 + 5)
    monkeypatch.setattr("django.core.signing.time.time", lambda: issued)
    # Signed with the real key (as if the code that issues tokens had a bug): 10 years of life claimed.
    token = signing.dumps({"e": execution.pk, "a": 1, "x": int(issued) + 10 * 365 * 86400}, salt=_SALT, compress=True)
    monkeypatch.undo()
    assert _post(execution.pk, token, {"status": "succeeded"}).status_code == 403


def test_a_heartbeat_renews_the_token_for_jobs_that_run_longer_than_its_life():
    execution = _running()
    first = token_for(execution.pk, timeout=7200)
    answer = _post(execution.pk, first, {"status": "heartbeat"})
    assert answer.status_code == 202
    renewed = answer.json()["token"]
    assert renewed != first
    assert _post(execution.pk, renewed, {"status": "succeeded", "output": "late but fine"}).status_code == 202
    assert Execution.objects.get(pk=execution.pk).status == S.SUCCEEDED


def test_callbacks_are_throttled_per_address_whatever_the_token(settings):
    settings.TMS_CALLBACK_THROTTLE = "3/minute"
    cache.clear()
    execution = _running()
    token = token_for(execution.pk)
    codes = [_post(execution.pk, token, {"status": "heartbeat"}).status_code for _ in range(3)]
    codes += [_post(execution.pk, token, {"status": "heartbeat"}).status_code, _post(1, "x", {}).status_code]
    assert codes == [202, 202, 202, 429, 429]
    cache.clear()


def test_the_http_runner_hands_the_token_to_its_endpoint_which_can_report():
    """On the running system: a worker-built spec, a real local endpoint, the real callback API."""
    from executions.runs import run_spec
    from runners.registry import get_runner
    from tests.runners.test_http import TestServer

    server = TestServer()
    try:
        server.route("/jobs", lambda h, _r: h.reply_json(202, {"id": "job-1"}, {"Location": "/jobs/1"}))
        execution = _running(runner="http", config={"url": server.url("/jobs"), "async": True, "method": "POST"})
        spec = run_spec(execution, execution.task, starting=True)
        get_runner("http").start(spec)
        [request] = server.to("/jobs")
    finally:
        server.stop()
    url = urlparse(request.headers["x-tms-callback-url"])
    assert url.path == f"/api/v1/executions/{execution.pk}/callback" and url.query == ""
    response = APIClient().post(
        url.path,
        {"status": "succeeded", "output": "pushed"},
        format="json",
        headers={"X-TMS-Callback-Token": request.headers["x-tms-callback-token"]},
    )
    assert response.status_code == 202, response.data
    assert Execution.objects.get(pk=execution.pk).output == "pushed"


def test_a_run_spec_signs_its_callback_token_only_when_a_runner_asks_for_it(monkeypatch):
    """A signature for every run cost the workers about 5 % of their CPU, for runs (noop, sleep,
    e-mail) that never report back: the spec makes it when a runner reads it, once."""
    from executions import runs

    signed: list[int] = []

    def counting(**kwargs):
        signed.append(kwargs["execution_id"])
        return callback_token(**kwargs)

    monkeypatch.setattr(runs, "callback_token", counting)
    execution = _running()
    spec = runs.run_spec(execution, execution.task)
    assert signed == []  # built, not signed
    token = spec.callback_token
    assert signed == [execution.pk] and spec.callback_token == token and signed == [execution.pk]
    assert spec.environment()["TMS_CALLBACK_TOKEN"] == token
    # It is the attempt's real token: the callback takes it.
    assert _post(execution.pk, token, {"status": "succeeded", "output": "ok"}).status_code == 202
