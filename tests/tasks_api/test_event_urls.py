"""Signed event URLs (issue 48 item 5): an outside system posts a named event in one team with the
URL's secret, no user token, signed as a trigger URL's requests are."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest
from rest_framework.test import APIClient

from executions.models import Execution, ExecutionOrigin, ReceivedEvent
from tasks_app.hooks import rotate_hook_secrets
from tasks_app.models import EventHook
from tasks_app.secrets import text_open
from tasks_app.teams.services import member_set, personal_team_of, team_create

pytestmark = pytest.mark.django_db

BODY = json.dumps({"order": 7}).encode()


def _signed(secret: str, body: bytes = BODY) -> dict[str, str]:
    timestamp = str(int(time.time()))
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {"HTTP_X_TMS_TIMESTAMP": timestamp, "HTTP_X_TMS_SIGNATURE": digest}


def _post(hook_id: str, headers: dict[str, str], body: bytes = BODY):
    return APIClient().post(f"/hooks/v1/events/{hook_id}", data=body, content_type="application/json", **headers)


def _subscriber(client, **fields) -> str:
    body = {"runner": "noop", "interval": "1h", "on_events": ["order.paid"], **fields}
    response = client.post("/api/v1/tasks", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _runs(task_id: str) -> int:
    return Execution.objects.filter(task_id=task_id, origin=ExecutionOrigin.TRIGGER).count()


def test_a_signed_event_url_posts_the_event_once_in_its_team(api_client, other_client, user):
    mine = _subscriber(api_client)
    theirs = _subscriber(other_client)
    made = api_client.post("/api/v1/events/order.paid/url")
    assert made.status_code == 201, made.content
    made = made.json()
    assert made["url"].endswith(f"/hooks/v1/events/{made['id']}") and made["name"] == "order.paid"
    assert (
        made["team"] == personal_team_of(user).pk
        and "secret" not in api_client.get("/api/v1/events/order.paid/url").json()
    )

    headers = _signed(made["secret"])
    response = _post(made["id"], headers)
    again = _post(made["id"], headers)

    assert response.status_code == 202, response.content
    assert [row["outcome"] for row in response.json()["tasks"]] == ["created"]
    assert again.status_code == 409 and again.json()["type"] == "request_replayed"
    assert _runs(mine) == 1 and _runs(theirs) == 0
    event = ReceivedEvent.objects.get()
    assert event.payload == {"order": 7} and event.actor == f"event URL {made['id'][:8]}"
    assert EventHook.objects.get().last_used_at is not None


def test_an_event_url_refuses_a_wrong_signature_an_unknown_id_and_a_rotated_secret(api_client):
    task = _subscriber(api_client)
    first = api_client.post("/api/v1/events/order.paid/url").json()
    rotated = api_client.post("/api/v1/events/order.paid/url")
    assert rotated.status_code == 200 and rotated.json()["id"] == first["id"]

    assert _post(first["id"], _signed(first["secret"])).status_code == 401
    assert _post(first["id"], _signed("tms_hook_wrong")).status_code == 401
    assert _post("nope", _signed(first["secret"])).status_code == 404
    assert _runs(task) == 0
    assert _post(first["id"], {"HTTP_AUTHORIZATION": f"Bearer {rotated.json()['secret']}"}).status_code == 202
    assert _runs(task) == 1

    assert api_client.delete("/api/v1/events/order.paid/url").status_code == 204
    assert _post(first["id"], _signed(rotated.json()["secret"])).status_code == 404


def test_making_an_event_url_needs_the_editor_role(api_client, other_client, other_user, user):
    team = team_create(creator=user, name="Shop")
    member_set(team=team, username=other_user.username, role="operator")

    refused = other_client.post(f"/api/v1/events/order.paid/url?team={team.slug}")
    made = api_client.post(f"/api/v1/events/order.paid/url?team={team.slug}")
    bad_name = api_client.post("/api/v1/events/bad name/url")

    assert refused.status_code == 403 and made.status_code == 201
    assert bad_name.status_code == 400 and "name" in bad_name.json()["errors"]


def test_key_rotation_reencrypts_event_url_secrets(api_client):
    made = api_client.post("/api/v1/events/order.paid/url").json()
    before = EventHook.objects.get().secret

    rows, _, failed = rotate_hook_secrets(batch=10)

    hook = EventHook.objects.get()
    assert rows == 1 and failed == [] and hook.secret != before
    assert text_open(hook.secret) == made["secret"]
