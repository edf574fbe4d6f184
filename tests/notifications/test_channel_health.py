"""What a channel's owner reads when deliveries fail (issue 28, item 11): plain-language errors
that name the server and the reason (never a library's exception text), and a channel that turns
failing by its own rule (``failing_after`` failed attempts in a row, retries included) and says
since when; one attempt that goes through makes it ok again."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from notifications import dispatch, services
from notifications.models import Channel, ChannelState, Delivery, DeliveryStatus
from tests.factories import UserFactory
from tests.notifications.receiver import deliver_queued, webhook_receiver

pytestmark = pytest.mark.django_db

#: Texts of the exceptions that reached people before: none may appear in an error shown.
RAW = ("_Guarded", "Max retries", "NameResolutionError", "Errno", "ConnectionRefusedError", "HTTPConnectionPool")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when this returns: nothing listens there


def _test_error(channel: Channel) -> str:
    delivery = services.channel_send_test(channel=channel)
    assert deliver_queued() == ["retry"]
    delivery.refresh_from_db()
    return delivery.last_error


def test_errors_say_in_words_which_server_failed_and_why(settings):
    owner = UserFactory()
    port = _closed_port()
    hook = services.channel_create(
        owner=owner, data={"name": "hook", "kind": "webhook", "target": f"http://127.0.0.1:{port}/hook"}
    )
    assert _test_error(hook) == (
        f"Could not connect to the receiver 127.0.0.1:{port}: the connection was refused (nothing listens there)."
    )
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    mail = services.channel_create(owner=owner, data={"name": "mail", "kind": "email", "target": "ops@example.com"})
    assert _test_error(mail) == (
        f"Could not connect to the SMTP server 127.0.0.1:{port}: the connection was refused (nothing listens there)."
    )
    for error in Delivery.objects.values_list("last_error", flat=True):
        assert not any(raw in error for raw in RAW), error


def test_an_unresolvable_host_and_an_error_answer_read_plainly():
    from notifications.senders import SendError, send

    with pytest.raises(SendError) as caught:
        send(kind="slack", target="http://no-such-host.invalid/hook", secret="", key="k", payload={}, timeout=2)
    assert caught.value.message == "Could not find the receiver no-such-host.invalid: its name does not resolve (DNS)."
    with webhook_receiver() as receiver:
        receiver.status = 503
        with pytest.raises(SendError) as caught:
            send(kind="webhook", target=receiver.url, secret="s", key="k", payload={}, timeout=2)
    assert caught.value.message.startswith("The receiver 127.0.0.1:") and " answered HTTP 503" in caught.value.message


def test_a_channel_turns_failing_by_its_own_rule_and_says_since_when():
    owner = UserFactory()
    port = _closed_port()
    channel = services.channel_create(
        owner=owner,
        data={"name": "hook", "kind": "webhook", "target": f"http://127.0.0.1:{port}/hook", "failing_after": 3},
    )
    started = timezone.now()
    for attempt in (1, 2):
        _test_error(channel)
        channel.refresh_from_db()
        assert (channel.state, channel.failed_attempts) == (ChannelState.OK, attempt)
    first_failure = channel.failures_since
    assert first_failure is not None and first_failure >= started - timedelta(seconds=1)
    # The third failed attempt in a row (a retry of the first test counts as much as a new one).
    Delivery.objects.filter(status=DeliveryStatus.PENDING).update(next_attempt_at=timezone.now())
    lease = dispatch.lease_due(limit=1)
    assert [dispatch.deliver(pk, lease.token) for pk in lease.delivery_ids] == ["retry"]
    channel.refresh_from_db()
    assert channel.state == ChannelState.FAILING and channel.failed_attempts == 3
    assert channel.failing_since == first_failure
    assert channel.last_error.startswith("Could not connect to the receiver")

    # The page says so, and since when.
    from django.test import Client

    client = Client()
    client.force_login(owner)
    page = client.get("/ui/notifications/").content.decode()
    assert "failing" in page and f"since {first_failure:%Y-%m-%d %H:%M} UTC" in page and "3 failed attempts" in page

    # One attempt that goes through ends it.
    with webhook_receiver() as receiver:
        services.channel_update(channel=channel, data={"target": receiver.url})
        services.channel_send_test(channel=channel)
        assert deliver_queued()[-1] == "delivered"
    channel.refresh_from_db()
    assert (channel.state, channel.failed_attempts, channel.failing_since) == (ChannelState.OK, 0, None)


def test_a_stricter_rule_applies_at_once_and_a_bad_rule_is_refused(api_client, user):
    port = _closed_port()
    channel = services.channel_create(
        owner=user, data={"name": "hook", "kind": "webhook", "target": f"http://127.0.0.1:{port}/hook"}
    )
    _test_error(channel)
    channel.refresh_from_db()
    assert channel.state == ChannelState.OK
    response = api_client.patch(f"/api/v1/notification-channels/{channel.pk}", {"failing_after": 1}, format="json")
    assert response.status_code == 200 and response.data["state"] == "failing"
    assert response.data["failing_since"] is not None and response.data["failed_attempts"] == 1
    for bad in (0, 101, "many"):
        response = api_client.patch(
            f"/api/v1/notification-channels/{channel.pk}", {"failing_after": bad}, format="json"
        )
        assert response.status_code == 400 and "failing_after" in response.data["errors"]
    assert (
        api_client.patch(
            f"/api/v1/notification-channels/{channel.pk}", {"failed_attempts": 0}, format="json"
        ).status_code
        == 400
    )
