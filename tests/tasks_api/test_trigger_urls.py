"""Trigger URLs: an outside system starts a task's run with the URL's secret, no user token.

Signed as TMS's own webhooks are (X-TMS-Timestamp, X-TMS-Signature = HMAC-SHA256 of
"{timestamp}.{body}"), or with Authorization: Bearer <secret>."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest
from django.db import connection
from rest_framework.test import APIClient

from executions.models import Execution, ExecutionEvent, ExecutionOrigin
from tasks_app.models import AuditEntry, TaskHook
from tasks_app.secrets import text_open
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

BODY = json.dumps({"event": "deploy", "ref": "main"}).encode()


def _make(api_client, task) -> dict:
    response = api_client.post(f"/api/v1/tasks/{task.pk}/trigger-url")
    assert response.status_code in (200, 201), response.content
    return response.json()


def _signed(secret: str, body: bytes = BODY, *, at: float | None = None) -> dict[str, str]:
    timestamp = str(int(time.time() if at is None else at))
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {"HTTP_X_TMS_TIMESTAMP": timestamp, "HTTP_X_TMS_SIGNATURE": digest}


def _fire(made: dict, headers: dict[str, str], body: bytes = BODY):
    # An outside system: no session, no token.
    return APIClient().post(f"/hooks/v1/{made['id']}", data=body, content_type="application/json", **headers)


def _runs(task) -> int:
    return Execution.objects.filter(task=task, origin=ExecutionOrigin.TRIGGER).count()


def test_a_signed_request_starts_exactly_one_run(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)
    assert made["url"].endswith(f"/hooks/v1/{made['id']}") and made["secret"].startswith("tms_hook_")

    response = _fire(made, _signed(made["secret"]))

    assert response.status_code == 202, response.content
    answer = response.json()
    execution = Execution.objects.get(task=task, origin=ExecutionOrigin.TRIGGER)
    assert answer["execution"] == execution.pk and answer["task"] == str(task.pk) and answer["joined"] is False
    assert _runs(task) == 1
    # Who started it: the trigger URL, in the audit log and the execution's events.
    entry = AuditEntry.objects.filter(task_id=task.pk, action="trigger").get()
    assert entry.source == "trigger-url" and entry.actor_name == f"trigger URL {made['id'][:8]}"
    assert entry.actor_id is None
    event = ExecutionEvent.objects.filter(execution=execution).first()
    assert event is not None and made["id"][:8] in event.actor
    assert TaskHook.objects.get(pk=made["id"]).last_used_at is not None


def test_the_bearer_form_starts_a_run_and_a_wrong_bearer_is_refused(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)

    wrong = _fire(made, {"HTTP_AUTHORIZATION": "Bearer tms_hook_not-it"})
    right = _fire(made, {"HTTP_AUTHORIZATION": f"Bearer {made['secret']}"})

    assert wrong.status_code == 401 and "bearer" in wrong.json()["detail"]
    assert right.status_code == 202
    assert _runs(task) == 1


@pytest.mark.parametrize(
    "tamper",
    ["signature", "body", "timestamp_old", "timestamp_future", "timestamp_text", "missing", "user_token"],
)
def test_a_request_that_does_not_prove_itself_is_a_401_and_creates_nothing(api_client, user, tamper):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)
    headers = _signed(made["secret"])
    body = BODY
    if tamper == "signature":
        headers["HTTP_X_TMS_SIGNATURE"] = "0" * 64
    elif tamper == "body":
        body = BODY + b" "
    elif tamper == "timestamp_old":
        headers = _signed(made["secret"], at=time.time() - 301)
    elif tamper == "timestamp_future":
        headers = _signed(made["secret"], at=time.time() + 330)
    elif tamper == "timestamp_text":
        headers["HTTP_X_TMS_TIMESTAMP"] = "yesterday"
    elif tamper == "missing":
        headers = {}
    elif tamper == "user_token":  # the owner's own API token is not the URL's secret
        from tests.conftest import account_key_for

        headers = {"HTTP_AUTHORIZATION": f"Bearer {account_key_for(user)}"}
    audits = AuditEntry.objects.count()

    response = _fire(made, headers, body)

    assert response.status_code == 401, response.content
    assert response.json()["detail"] and response["Content-Type"].startswith("application/json")
    assert "WWW-Authenticate" in response.headers
    assert _runs(task) == 0 and Execution.objects.filter(task=task).count() == 0
    assert AuditEntry.objects.count() == audits


def test_a_timestamp_within_the_tolerance_is_accepted(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)

    assert _fire(made, _signed(made["secret"], at=time.time() - 240)).status_code == 202


def test_rotating_the_secret_refuses_the_old_one_and_keeps_the_url(api_client, user):
    task = TaskFactory(owner=user)
    first = _make(api_client, task)
    again = api_client.post(f"/api/v1/tasks/{task.pk}/trigger-url")

    assert again.status_code == 200
    second = again.json()
    assert second["id"] == first["id"] and second["secret"] != first["secret"] and second["rotated_at"]
    assert _fire(first, _signed(first["secret"])).status_code == 401
    assert _fire(second, _signed(second["secret"])).status_code == 202
    assert _runs(task) == 1
    actions = list(AuditEntry.objects.filter(task_id=task.pk).values_list("action", flat=True).order_by("id"))
    assert actions[-3:] == ["trigger_url.create", "trigger_url.rotate", "trigger"]


def test_a_deleted_trigger_url_is_a_404_and_an_unknown_one_too(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)

    assert api_client.delete(f"/api/v1/tasks/{task.pk}/trigger-url").status_code == 204
    response = _fire(made, _signed(made["secret"]))

    assert response.status_code == 404 and response.json()["type"] == "not_found"
    assert _fire({"id": "no-such-hook"}, _signed(made["secret"])).status_code == 404
    assert api_client.get(f"/api/v1/tasks/{task.pk}/trigger-url").status_code == 404
    assert api_client.delete(f"/api/v1/tasks/{task.pk}/trigger-url").status_code == 404
    assert _runs(task) == 0


def test_a_deleted_task_s_trigger_url_is_a_404(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)
    api_client.delete(f"/api/v1/tasks/{task.pk}")

    assert _fire(made, _signed(made["secret"])).status_code == 404
    assert _runs(task) == 0


def test_a_paused_task_refuses_its_trigger_url_with_409(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)
    api_client.post(f"/api/v1/tasks/{task.pk}/pause")

    response = _fire(made, _signed(made["secret"]))

    assert response.status_code == 409 and "paused" in response.json()["detail"]
    assert _runs(task) == 0


def test_a_repeated_idempotency_key_answers_the_first_run(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)

    first = _fire(made, {**_signed(made["secret"]), "HTTP_IDEMPOTENCY_KEY": "event-17"})
    # The sender retries later: signed again (another timestamp), same key and body.
    again = _fire(made, {**_signed(made["secret"], at=time.time() + 2), "HTTP_IDEMPOTENCY_KEY": "event-17"})
    # Another event with the same body: signed at another time (the same signature is a replay: 409).
    other = _fire(made, {**_signed(made["secret"], at=time.time() - 10), "HTTP_IDEMPOTENCY_KEY": "event-18"})

    assert first.status_code == again.status_code == other.status_code == 202
    assert again.json()["execution"] == first.json()["execution"] != other.json()["execution"]
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert _runs(task) == 2


def test_the_secret_is_stored_encrypted_and_never_shown_again(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)

    with connection.cursor() as cursor:
        cursor.execute("SELECT secret FROM tasks_app_taskhook WHERE id = %s", [made["id"]])
        (stored,) = cursor.fetchone()
    assert made["secret"] not in stored and stored.startswith("$enc:") and text_open(stored) == made["secret"]
    shown = api_client.get(f"/api/v1/tasks/{task.pk}/trigger-url").json()
    assert "secret" not in shown and shown["id"] == made["id"]
    assert made["secret"] not in json.dumps(list(AuditEntry.objects.values("changes", "detail")), default=str)


def test_only_the_owner_manages_a_task_s_trigger_url(api_client, other_client, user):
    task = TaskFactory(owner=user)

    assert other_client.post(f"/api/v1/tasks/{task.pk}/trigger-url").status_code == 404
    assert other_client.get(f"/api/v1/tasks/{task.pk}/trigger-url").status_code == 404
    assert APIClient().post(f"/api/v1/tasks/{task.pk}/trigger-url").status_code == 401
    assert not TaskHook.objects.exists()


def test_trigger_urls_are_throttled_per_client_address(api_client, user, settings):
    from django.core.cache import cache

    cache.clear()
    settings.TMS_HOOK_THROTTLE = "3/minute"
    task = TaskFactory(owner=user)
    made = _make(api_client, task)

    codes = [_fire(made, {"HTTP_X_TMS_SIGNATURE": "0" * 64, "HTTP_X_TMS_TIMESTAMP": "1"}).status_code for _ in range(4)]

    assert codes == [401, 401, 401, 429]
    cache.clear()


def test_tms_rotate_keys_re_encrypts_trigger_url_secrets(api_client, user, settings):
    import io

    from cryptography.fernet import Fernet
    from django.core.management import call_command

    task = TaskFactory(owner=user)
    made = _make(api_client, task)
    before = TaskHook.objects.get(pk=made["id"]).secret
    old = tuple(settings.TMS["SECRET_KEYS"])
    new = Fernet.generate_key().decode()
    settings.TMS = {**settings.TMS, "SECRET_KEYS": (new, *old)}
    out = io.StringIO()
    call_command("tms_rotate_keys", stdout=out)

    assert "1 trigger URL(s)" in out.getvalue()
    assert TaskHook.objects.get(pk=made["id"]).secret != before
    settings.TMS = {**settings.TMS, "SECRET_KEYS": (new,)}  # the old key removed
    assert _fire(made, _signed(made["secret"])).status_code == 202


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_deliveries_of_one_event_start_one_run(user):
    """An event delivered fifty times at once (same key, each signed on its own, at its own time:
    one signature sent twice is a replay, refused): one run."""
    import threading

    from tasks_api.hooks import task_hook_set

    task = TaskFactory(owner=user)
    made = task_hook_set(task=task)
    hook = {"id": made.hook.pk}
    barrier = threading.Barrier(50)
    results: list[tuple[int, int]] = []
    signed_at = time.time()

    def post(index: int) -> None:
        try:
            headers = {**_signed(made.secret, at=signed_at - index), "HTTP_IDEMPOTENCY_KEY": "event-1"}
            barrier.wait()
            response = _fire(hook, headers)
            results.append((response.status_code, response.json()["execution"]))
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(index,)) for index in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert len(results) == 50
    assert {code for code, _ in results} == {202}
    assert len({run for _, run in results}) == 1
    assert _runs(task) == 1
