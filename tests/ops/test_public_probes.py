"""What anyone may learn from the platform's edge (issue 27, finding 14): /readyz says ready or
not to everyone and why only to metrics readers; tms_create_user refuses weak passwords."""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from tests.ops.test_health import closed_port

pytestmark = pytest.mark.django_db

OUTSIDE = "203.0.113.9"


def test_readyz_tells_the_public_ready_or_not_and_operators_why(client, settings):
    public = client.get("/readyz", REMOTE_ADDR=OUTSIDE)
    assert public.status_code == 200 and public.json() == {"status": "ready"}
    inside = client.get("/readyz")  # loopback: where /metrics is served by default
    assert inside.status_code == 200 and set(inside.json()["checks"]) == {"database", "broker", "migrations"}
    settings.CELERY_BROKER_URL = f"amqp://guest:guest@127.0.0.1:{closed_port()}//"
    down = client.get("/readyz", REMOTE_ADDR=OUTSIDE)
    assert down.status_code == 503 and down.json() == {"status": "unavailable"} and down["Retry-After"]
    assert "amqp" not in down.content.decode() and settings.DATABASES["default"]["NAME"] not in down.content.decode()
    settings.TMS = {**settings.TMS, "METRICS_TOKEN": "metrics-token-0123456789"}
    told = client.get("/readyz", REMOTE_ADDR=OUTSIDE, HTTP_AUTHORIZATION="Bearer metrics-token-0123456789")
    assert told.status_code == 503 and told.json()["checks"]["broker"]["ok"] is False
    wrong = client.get("/readyz", REMOTE_ADDR=OUTSIDE, HTTP_AUTHORIZATION="Bearer guess")
    assert wrong.status_code == 503 and "checks" not in json.loads(wrong.content)


@pytest.mark.parametrize(
    ("password", "why"),
    [
        ("a", "too short"),
        ("password123", "too common"),
        ("80417326591", "entirely numeric"),
        ("mallory1", "too similar"),
    ],
)
def test_tms_create_user_applies_the_password_validators(password, why):
    with pytest.raises(CommandError, match=why):
        call_command("tms_create_user", "mallory", "--password", password, stdout=io.StringIO(), stderr=io.StringIO())
    assert not get_user_model().objects.filter(username="mallory").exists()
    call_command(
        "tms_create_user",
        "mallory",
        "--password",
        "a-long-enough-passphrase",
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    user = get_user_model().objects.get(username="mallory")
    with pytest.raises(CommandError, match="too short"):
        call_command("tms_create_user", "mallory", "--password", "b", stdout=io.StringIO(), stderr=io.StringIO())
    user.refresh_from_db()
    assert user.check_password("a-long-enough-passphrase")
