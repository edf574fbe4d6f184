"""E-mail channels obey the e-mail runner's recipient allow-list and per-owner rate, quote the
task's name, and every sending error is a counted attempt with its reason (issue 27, findings 5
and 12)."""

from __future__ import annotations

import pytest
from django.core import mail
from django.core.mail import BadHeaderError
from django.db.models.functions import Now

from notifications import dispatch, services
from notifications.models import Channel, ChannelState, Delivery, DeliveryStatus, Rule
from tests.factories import TaskFactory
from tests.notifications.receiver import ExplodingBackend, deliver_queued

pytestmark = pytest.mark.django_db

CHANNELS = "/api/v1/notification-channels"


def _email_options(settings, **options):
    runners = dict(settings.TMS_RUNNERS)
    runners["email"] = {**runners["email"], "OPTIONS": {**runners["email"]["OPTIONS"], **options}}
    settings.TMS_RUNNERS = runners


def _send_all() -> list[str]:
    lease = dispatch.lease_due()
    return [dispatch.deliver(pk, lease.token) for pk in lease.delivery_ids]


def _failing(task, channel) -> Delivery:
    rule = Rule.objects.create(owner=task.owner, team_id=task.team_id, channel=channel, task=task, on_failure=True)
    delivery = dispatch.notify(rule, task, "failing", f"src:{task.pk}", execution_id=1, attempt=1)
    assert isinstance(delivery, Delivery)
    return delivery


def test_an_email_channel_takes_only_recipients_the_email_runner_allows(api_client, settings):
    outside = api_client.post(CHANNELS, {"name": "x", "kind": "email", "target": "me@outside.test"}, format="json")
    assert outside.status_code == 400
    assert "allowed_recipients" in str(outside.data["errors"]["target"]) and not Channel.objects.exists()
    ok = api_client.post(CHANNELS, {"name": "x", "kind": "email", "target": "ops@example.com"}, format="json")
    assert ok.status_code == 201, ok.data
    moved = api_client.patch(f"{CHANNELS}/{ok.data['id']}", {"target": "me@outside.test"}, format="json")
    assert moved.status_code == 400 and Channel.objects.get().target == "ops@example.com"
    # The operator narrows the list: the channel's sends stop, failed for good with the reason.
    _email_options(settings, allowed_recipients=["boss@example.com"])
    assert api_client.post(f"{CHANNELS}/{ok.data['id']}/test").status_code == 202
    assert deliver_queued() == ["failed"] and mail.outbox == []
    assert "allowed_recipients" in Delivery.objects.get().last_error


def test_email_channels_share_the_owners_email_rate_and_tests_have_their_own(api_client, user, settings):
    _email_options(settings, max_per_minute=2)
    channel = services.channel_create(owner=user, data={"name": "m", "kind": "email", "target": "ops@example.com"})
    for _ in range(3):
        assert api_client.post(f"{CHANNELS}/{channel.pk}/test").status_code == 202
    assert deliver_queued() == ["delivered", "delivered", "deferred"] and len(mail.outbox) == 2
    waiting = Delivery.objects.get(status=DeliveryStatus.PENDING)
    assert waiting.attempts == 0 and waiting.lease_token == ""  # not an attempt: it waits for the rate
    for _ in range(7):
        assert api_client.post(f"{CHANNELS}/{channel.pk}/test").status_code == 202
    over = api_client.post(f"{CHANNELS}/{channel.pk}/test")
    assert over.status_code == 429 and int(over["Retry-After"]) >= 1
    assert Delivery.objects.count() == 10


def test_a_task_name_is_quoted_as_a_name_and_never_breaks_the_subject(user):
    task = TaskFactory(owner=user, name="Your account is suspended\r\nBcc: victim@evil.test")
    channel = services.channel_create(owner=user, data={"name": "m", "kind": "email", "target": "ops@example.com"})
    delivery = _failing(task, channel)
    assert _send_all() == ["delivered"]
    (message,) = mail.outbox
    assert message.subject.startswith('[TMS] Task "Your account is suspended Bcc: victim@evil.test" is failing')
    assert message.recipients() == ["ops@example.com"] and "\n" not in message.subject
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.DELIVERED


@pytest.mark.parametrize(("explode", "outcomes"), [(RuntimeError, ["retry", "failed"]), (BadHeaderError, ["failed"])])
def test_every_sending_error_is_a_counted_attempt_and_the_cap_fails_it(user, settings, explode, outcomes):
    settings.EMAIL_BACKEND = "tests.notifications.receiver.ExplodingBackend"
    settings.TMS = {**settings.TMS, "NOTIFY_MAX_ATTEMPTS": 2}
    ExplodingBackend.EXPLODE = explode
    channel = services.channel_create(owner=user, data={"name": "m", "kind": "email", "target": "ops@example.com"})
    delivery = _failing(TaskFactory(owner=user), channel)
    seen = []
    for _ in outcomes:
        Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=Now())
        seen += _send_all()
        delivery.refresh_from_db()
        assert f"{explode.__name__}: the backend exploded" in delivery.last_error
    assert seen == outcomes and delivery.attempts == len(outcomes)
    assert delivery.status == DeliveryStatus.FAILED and _send_all() == []
    channel.refresh_from_db()
    assert channel.state == ChannelState.FAILING and "the backend exploded" in channel.last_error


def test_a_webhook_redirected_to_another_origin_sends_nothing_there(user):
    """Issue 27, finding 9: webhooks follow no redirect, so their body (signed) stays where it was sent."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.notifications.receiver import webhook_receiver

    with webhook_receiver() as elsewhere:

        class Redirect(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(307)
                self.send_header("Location", elsewhere.url)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/hook"
            channel = services.channel_create(owner=user, data={"name": "w", "kind": "webhook", "target": url})
            services.channel_send_test(channel=channel)
            assert deliver_queued() == ["failed"]
        finally:
            server.shutdown()
            server.server_close()
        assert elsewhere.arrivals == [] and "HTTP 307" in Delivery.objects.get().last_error
