"""Channel signing secrets and targets: encrypted at rest, masked to everyone after creation,
rotated by ``tms_rotate_keys``, kept out of delivery errors and the audit log."""

from __future__ import annotations

import io

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from notifications.models import Channel, Delivery
from tasks_app.masking import MASK
from tasks_app.models import AuditEntry
from tests.notifications.receiver import deliver_queued, webhook_receiver

pytestmark = pytest.mark.django_db

CHANNELS = "/api/v1/notification-channels"
SLACK = "https://hooks.slack.com/services/T000/B000/sekritSlackPath"


def _raw(pk: int) -> tuple[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT target, secret FROM notifications_channel WHERE id = %s", [pk])
        return cursor.fetchone()


def _create(client, **fields):
    data = {"name": "ops", "kind": "webhook", "target": "https://hooks.example.com/tms?token=abc123xyz", **fields}
    response = client.post(CHANNELS, data, format="json")
    assert response.status_code == 201, response.data
    return response.data


def test_the_columns_hold_no_plaintext_and_the_secret_is_shown_once(api_client, staff_client):
    hook = _create(api_client)
    slack = _create(api_client, kind="slack", target=SLACK)
    secret = hook["secret"]
    assert len(secret) == 64  # handed out in the answer that created it
    for pk, plain in ((hook["id"], "hooks.example.com"), (slack["id"], "sekritSlackPath")):
        target, stored_secret = _raw(pk)
        assert target.startswith("$enc:") and plain not in target
        assert secret not in stored_secret
    assert _raw(hook["id"])[1].startswith("$enc:") and _raw(slack["id"])[1] == ""  # no secret: empty stays empty
    channel = Channel.objects.get(pk=hook["id"])
    assert channel.secret == secret and channel.target.endswith("token=abc123xyz")  # plain in memory
    for client in (api_client, staff_client):  # the owner, and a staff reader
        shown = {c["id"]: c for c in client.get(CHANNELS).data["results"]}
        assert shown[hook["id"]]["secret"] == MASK and "abc123xyz" not in shown[hook["id"]]["target"]
        assert shown[slack["id"]]["target"] == f"https://hooks.slack.com/{MASK}"
        assert secret not in str(shown) and "sekritSlackPath" not in str(shown)
    assert api_client.get(f"{CHANNELS}/{slack['id']}").data["target"] == f"https://hooks.slack.com/{MASK}"


def test_regenerating_the_secret_shows_the_new_one_once_to_the_owner_only(api_client, staff_client):
    hook = _create(api_client, target="https://hooks.example.com/tms")
    assert staff_client.post(f"{CHANNELS}/{hook['id']}/rotate-secret").status_code == 403
    rotated = api_client.post(f"{CHANNELS}/{hook['id']}/rotate-secret")
    assert rotated.status_code == 200
    new = rotated.data["secret"]
    assert len(new) == 64 and new != hook["secret"]
    assert Channel.objects.get(pk=hook["id"]).secret == new
    assert api_client.get(f"{CHANNELS}/{hook['id']}").data["secret"] == MASK
    slack = _create(api_client, kind="slack", target=SLACK)
    refused = api_client.post(f"{CHANNELS}/{slack['id']}/rotate-secret")
    assert refused.status_code == 400 and "kind" in refused.data["errors"]
    assert new not in str(list(AuditEntry.objects.values_list("changes", "detail")))


def test_sending_the_masked_target_back_keeps_it_and_a_change_is_audited_masked(api_client):
    slack = _create(api_client, kind="slack", target=SLACK)
    shown = api_client.get(f"{CHANNELS}/{slack['id']}").data["target"]
    kept = api_client.patch(f"{CHANNELS}/{slack['id']}", {"target": shown, "name": "chat"}, format="json")
    assert kept.status_code == 200, kept.data
    assert Channel.objects.get(pk=slack["id"]).target == SLACK
    other = "https://hooks.slack.com/services/T000/B000/anotherSecretPath"
    assert api_client.patch(f"{CHANNELS}/{slack['id']}", {"target": other}, format="json").status_code == 200
    assert Channel.objects.get(pk=slack["id"]).target == other
    text = str(list(AuditEntry.objects.values_list("changes", flat=True)))
    assert "sekritSlackPath" not in text and "anotherSecretPath" not in text
    last = AuditEntry.objects.filter(action="channel.update").order_by("-id").first()
    assert last is not None and last.changes["target"]["to"] == f"{MASK} (changed)"


def test_a_delivery_error_never_quotes_the_slack_url():
    from notifications import services
    from tests.factories import UserFactory

    owner = UserFactory()
    target = "http://127.0.0.1:9/services/T000/B000/sekritSlackPath"
    channel = services.channel_create(owner=owner, data={"name": "chat", "kind": "slack", "target": target})
    delivery = services.channel_send_test(channel=channel)
    assert deliver_queued() == ["retry"]
    delivery.refresh_from_db()
    assert delivery.status == "pending" and delivery.last_error
    assert "sekritSlackPath" not in delivery.last_error
    assert "sekritSlackPath" not in str(Delivery.objects.values_list("last_error", flat=True))


def test_rotation_re_encrypts_channels_and_the_old_key_can_go(api_client, settings):
    with webhook_receiver() as receiver:
        hook = _create(api_client, target=receiver.url)
        slack = _create(api_client, kind="slack", target=SLACK)
        before = {pk: _raw(pk) for pk in (hook["id"], slack["id"])}
        old = tuple(settings.TMS["SECRET_KEYS"])
        new = Fernet.generate_key().decode()
        settings.TMS = {**settings.TMS, "SECRET_KEYS": (new, *old)}
        out = io.StringIO()
        call_command("tms_rotate_keys", stdout=out)
        assert "re-encrypted 3 secret value(s) in 2 notification channel(s)" in out.getvalue()
        after = {pk: _raw(pk) for pk in before}
        assert after[hook["id"]][0] != before[hook["id"]][0] and after[hook["id"]][1] != before[hook["id"]][1]
        assert after[slack["id"]][1] == ""
        settings.TMS = {**settings.TMS, "SECRET_KEYS": (new,)}  # the old key removed
        channel = Channel.objects.get(pk=hook["id"])
        assert channel.secret == hook["secret"] and channel.target == receiver.url
        # Still signs with the same secret under the new key.
        response = api_client.post(f"{CHANNELS}/{hook['id']}/test")
        assert response.status_code == 202 and deliver_queued() == ["delivered"]
        assert receiver.arrivals[-1].signature_valid(hook["secret"])
    settings.TMS = {**settings.TMS, "SECRET_KEYS": (Fernet.generate_key().decode(),)}  # a wrong key
    with pytest.raises(CommandError, match="2 notification channel"):
        call_command("tms_rotate_keys", stdout=io.StringIO())
    assert _raw(hook["id"]) == after[hook["id"]]  # left unchanged
