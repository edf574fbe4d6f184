"""The back office's notifications page and the task page's rules."""

from __future__ import annotations

import pytest

from notifications import services
from notifications.models import Delivery
from tests.factories import TaskFactory
from tests.notifications.receiver import deliver_queued, webhook_receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice_client(client, user):
    client.force_login(user)
    return client


def test_channels_page_sends_a_test_and_shows_the_log(alice_client, user, other_user):
    with webhook_receiver() as receiver:
        channel = services.channel_create(
            owner=user, data={"name": "ops hook", "kind": "webhook", "target": receiver.url}
        )
        theirs = services.channel_create(
            owner=other_user, data={"name": "bob hook", "kind": "webhook", "target": receiver.url}
        )
        response = alice_client.post(f"/ui/notifications/channels/{channel.pk}/test/", follow=True)
        assert response.status_code == 200 and "Test queued for ops hook" in response.content.decode()
        assert alice_client.post(f"/ui/notifications/channels/{theirs.pk}/test/").status_code == 404
        assert deliver_queued() == ["delivered"] and len(receiver.arrivals) == 1
    page = alice_client.get("/ui/notifications/").content.decode()
    assert "ops hook" in page and "bob hook" not in page
    assert "delivered" in page and Delivery.objects.get().channel == channel


def test_the_task_page_lists_its_rules_or_the_owners_defaults(alice_client, user):
    channel = services.channel_create(owner=user, data={"name": "mailbox", "kind": "email", "target": "a@example.com"})
    task = TaskFactory(owner=user)
    services.rule_create(owner=user, data={"channel": channel, "on_failure": True})
    page = alice_client.get(f"/ui/tasks/{task.pk}/").content.decode()
    assert "mailbox" in page and "owner's defaults" in page
    services.rule_create(owner=user, data={"task": task, "channel": channel, "on_retry": True})
    page = alice_client.get(f"/ui/tasks/{task.pk}/").content.decode()
    assert "retry" in page and "defaults" not in page
