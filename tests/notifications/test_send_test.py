""" "Send test" of a channel (issue 27, findings 4 and 10): queued on the notification queue,
answered at once; only those who may change a channel send through it."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.test import Client

from notifications import services
from notifications.models import Delivery, DeliveryStatus
from tests.conftest import client_for
from tests.notifications.receiver import webhook_receiver
from tests.notifications.test_running_system import start_notify_worker
from tests.processes import running, wait_for, wait_worker_ready

CHANNELS = "/api/v1/notification-channels"


@pytest.mark.django_db(transaction=True)
def test_a_test_to_a_slow_target_answers_at_once_and_the_notification_queue_sends_it(user):
    notify = start_notify_worker("notify-test")
    with running(notify), webhook_receiver() as receiver:
        wait_worker_ready(notify)
        receiver.delay = 2.0  # a target that takes 2 s to answer (the sender waits 3 s: FAST)
        channel = services.channel_create(owner=user, data={"name": "slow", "kind": "webhook", "target": receiver.url})
        client = client_for(user)

        def send() -> tuple[float, int, dict]:
            began = time.monotonic()
            response = client_for(user).post(f"{CHANNELS}/{channel.pk}/test")
            return time.monotonic() - began, response.status_code, response.data

        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: send(), range(2)))
        # Both answer at once (the target's time is not spent in the request), the deliveries to follow.
        assert [(code, data["status"], data["attempts"]) for _, code, data in answers] == [(202, "pending", 0)] * 2
        assert max(took for took, _, _ in answers) < 1.5, answers
        began = time.monotonic()
        assert client.get("/api/v1/tasks").status_code == 200
        assert time.monotonic() - began < 2.0
        ids = [data["id"] for _, _, data in answers]
        wait_for(
            lambda: Delivery.objects.filter(pk__in=ids, status=DeliveryStatus.DELIVERED).count() == 2,
            timeout=30,
            what="the notify worker to deliver both tests",
        )
        assert len(receiver.arrivals) == 2
        assert all(arrival.signature_valid(channel.secret) for arrival in receiver.arrivals)
        # A target slower than TMS_NOTIFY_TIMEOUT (3 s here): the attempt ends at the timeout, counted.
        receiver.delay = 8.0
        began = time.monotonic()
        slow = client.post(f"{CHANNELS}/{channel.pk}/test").data["id"]
        wait_for(lambda: Delivery.objects.get(pk=slow).attempts == 1 and Delivery.objects.get(pk=slow).last_error,
                 timeout=10, what="the slow test's first attempt")  # fmt: skip
        assert time.monotonic() - began < 6.0
        notify.stop()


@pytest.mark.django_db
def test_read_only_staff_cannot_send_a_test_through_another_owners_channel(user, staff_user, django_user_model):
    channel = services.channel_create(
        owner=user, data={"name": "ops", "kind": "webhook", "target": "http://127.0.0.1:9/"}
    )
    own = services.channel_create(
        owner=staff_user, data={"name": "mine", "kind": "webhook", "target": "http://127.0.0.1:9/"}
    )
    browser = Client()
    browser.force_login(staff_user)
    assert browser.get("/ui/notifications/").status_code == 200  # staff read every channel ...
    assert browser.post(f"/ui/notifications/channels/{channel.pk}/test/").status_code == 403  # ... send on none
    assert client_for(staff_user).post(f"{CHANNELS}/{channel.pk}/test").status_code == 403  # as the API
    assert not Delivery.objects.filter(channel=channel).exists()
    assert browser.post(f"/ui/notifications/channels/{own.pk}/test/").status_code == 302
    assert Delivery.objects.filter(channel=own).count() == 1
    admin = django_user_model.objects.create_superuser(username="boss", password="x-boss-password-1")
    browser.force_login(admin)
    assert browser.post(f"/ui/notifications/channels/{channel.pk}/test/").status_code == 302
    assert Delivery.objects.filter(channel=channel).count() == 1
