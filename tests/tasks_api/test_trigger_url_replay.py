"""Issue 43, items 9 and 10: a captured signed request to a trigger URL cannot be replayed within
its timestamp's tolerance (each signed request starts at most one run), and a trigger URL's
``Idempotency-Key`` namespace is its own, apart from its owner's."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from executions.models import Execution, ExecutionOrigin
from tasks_app.hooks import TOLERANCE, hook_signatures_expire
from tasks_app.models import Task, TaskHookSignature
from tasks_app.tasks import expire_idempotency_keys
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

BODY = json.dumps({"event": "deploy"}).encode()


def _make(api_client, task) -> dict:
    response = api_client.post(f"/api/v1/tasks/{task.pk}/trigger-url")
    assert response.status_code == 201, response.content
    return response.json()


def _signed(secret: str, body: bytes = BODY, *, at: float | None = None) -> dict[str, str]:
    timestamp = str(int(time.time() if at is None else at))
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {"HTTP_X_TMS_TIMESTAMP": timestamp, "HTTP_X_TMS_SIGNATURE": digest}


def _fire(made: dict, headers: dict[str, str], body: bytes = BODY):
    return APIClient().post(f"/hooks/v1/{made['id']}", data=body, content_type="application/json", **headers)


def _runs(task) -> int:
    return Execution.objects.filter(task=task, origin=ExecutionOrigin.TRIGGER).count()


# --- item 9: replay of a captured signed request ------------------------------------------------


def test_a_captured_signed_request_sent_again_is_a_409_and_starts_no_run(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)
    captured = _signed(made["secret"])

    answers = [_fire(made, captured) for _ in range(3)]
    # The same signature spelled otherwise is the same request.
    respelled = {**captured, "HTTP_X_TMS_SIGNATURE": "sha256=" + captured["HTTP_X_TMS_SIGNATURE"].upper()}
    again = _fire(made, respelled)

    assert [answer.status_code for answer in answers] == [202, 409, 409] and again.status_code == 409
    assert answers[1].json()["type"] == "request_replayed"
    assert "already received" in answers[1].json()["detail"]
    assert _runs(task) == 1
    # Signed again with another time: a new request, a new run.
    assert _fire(made, _signed(made["secret"], at=time.time() - 5)).status_code == 202
    assert _runs(task) == 2


def test_a_request_refused_before_its_run_is_not_remembered(api_client, user):
    """A run that could not start (here: the input its body gives is refused) leaves nothing
    remembered: the sender may send the same request again once the task accepts it."""
    task = TaskFactory(owner=user, input_schema={"type": "object", "required": ["ref"]})
    made = _make(api_client, task)
    request = _signed(made["secret"])

    refused = _fire(made, request)
    Task.objects.filter(pk=task.pk).update(input_schema=None)
    accepted = _fire(made, request)

    assert refused.status_code == 400 and accepted.status_code == 202
    assert _runs(task) == 1


@pytest.mark.django_db(transaction=True)
def test_ten_copies_of_one_signed_request_at_once_start_one_run(user):
    from tasks_api.hooks import task_hook_set

    task = TaskFactory(owner=user)
    made = task_hook_set(task=task)
    headers = _signed(made.secret)
    barrier = threading.Barrier(10)
    codes: list[int] = []

    def post() -> None:
        try:
            barrier.wait()
            codes.append(_fire({"id": made.hook.pk}, headers).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert sorted(codes) == [202] + [409] * 9
    assert _runs(task) == 1


def test_remembered_signatures_are_forgotten_once_their_timestamp_is_refused_anyway(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)
    assert _fire(made, _signed(made["secret"])).status_code == 202
    assert _fire(made, _signed(made["secret"], at=time.time() - 10)).status_code == 202
    assert TaskHookSignature.objects.count() == 2

    assert hook_signatures_expire() == 0
    TaskHookSignature.objects.filter(pk=TaskHookSignature.objects.first().pk).update(
        expires_at=timezone.now() - timedelta(seconds=TOLERANCE + 1)
    )
    assert expire_idempotency_keys() == 1
    assert TaskHookSignature.objects.count() == 1


def test_the_bearer_form_is_not_refused_as_a_replay(api_client, user):
    """The bearer form carries no signature to remember (docs/triggers.md: weaker, and why)."""
    task = TaskFactory(owner=user)
    made = _make(api_client, task)
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {made['secret']}"}

    assert [_fire(made, bearer).status_code for _ in range(2)] == [202, 202]
    assert TaskHookSignature.objects.count() == 0


# --- item 10: the Idempotency-Key namespace ------------------------------------------------------


#: One body for every create (a key sent again with another body is a 422).
LATER = (timezone.now() + timedelta(days=1)).isoformat()


def _create_task(api_client, key: str):
    body = {"name": "unrelated", "runner": "noop", "start_at": LATER}
    return api_client.post("/api/v1/tasks", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_trigger_url_s_key_does_not_block_the_owner_s_request_with_that_key(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)

    hooked = _fire(made, {**_signed(made["secret"]), "HTTP_IDEMPOTENCY_KEY": "shared-key"})
    owner = _create_task(api_client, "shared-key")
    again = _create_task(api_client, "shared-key")

    assert hooked.status_code == 202
    assert owner.status_code == 201, owner.content
    assert again.status_code == 201 and again.json()["id"] == owner.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"


def test_the_owner_s_key_is_neither_replayed_nor_blocking_for_a_trigger_url(api_client, user):
    task = TaskFactory(owner=user)
    made = _make(api_client, task)
    owner = _create_task(api_client, "shared-key")
    triggered = api_client.post(f"/api/v1/tasks/{task.pk}/trigger", HTTP_IDEMPOTENCY_KEY="trigger-key")

    hooked = _fire(made, {**_signed(made["secret"]), "HTTP_IDEMPOTENCY_KEY": "shared-key"})
    hooked_trigger_key = _fire(
        made, {**_signed(made["secret"], at=time.time() - 10), "HTTP_IDEMPOTENCY_KEY": "trigger-key"}
    )

    assert owner.status_code == 201 and triggered.status_code == 201
    assert hooked.status_code == 202 and "Idempotent-Replayed" not in hooked.headers
    # Not the owner's trigger's run answered back: a run of its own.
    assert hooked_trigger_key.status_code == 202
    assert hooked_trigger_key.json()["execution"] != triggered.json()["id"]
    assert _runs(task) == 3


def test_two_trigger_urls_do_not_share_keys(api_client, user):
    first_task, second_task = TaskFactory(owner=user), TaskFactory(owner=user)
    first, second = _make(api_client, first_task), _make(api_client, second_task)

    a = _fire(first, {**_signed(first["secret"]), "HTTP_IDEMPOTENCY_KEY": "event-1"})
    b = _fire(second, {**_signed(second["secret"]), "HTTP_IDEMPOTENCY_KEY": "event-1"})

    assert a.status_code == b.status_code == 202 and "Idempotent-Replayed" not in b.headers
    assert _runs(first_task) == _runs(second_task) == 1
