"""/api/v1/notification-channels, -rules and -deliveries; notification_target is gone."""

from __future__ import annotations

import pytest

from notifications.models import Channel, Delivery, Rule
from tests.factories import TaskFactory
from tests.notifications.receiver import deliver_queued, webhook_receiver

pytestmark = pytest.mark.django_db

CHANNELS, RULES, DELIVERIES = (
    "/api/v1/notification-channels",
    "/api/v1/notification-rules",
    "/api/v1/notification-deliveries",
)


def _channel(client, **fields):
    data = {"name": "ops", "kind": "webhook", "target": "https://hooks.example.com/tms", **fields}
    return client.post(CHANNELS, data, format="json")


def test_a_webhook_channel_gets_a_signing_secret_and_is_owner_scoped(api_client, other_client):
    response = _channel(api_client)
    assert response.status_code == 201, response.data
    assert len(response.data["secret"]) == 64 and response.data["state"] == "ok"
    assert other_client.get(f"{CHANNELS}/{response.data['id']}").status_code == 404
    assert other_client.get(CHANNELS).data["results"] == []
    slack = _channel(api_client, kind="slack")
    assert slack.status_code == 201 and slack.data["secret"] == ""


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"kind": "pager"}, "kind", "is not a valid choice"),
        ({"target": "not a url"}, "target", "valid http(s) URL"),
        ({"target": "ftp://example.com/x"}, "target", "valid http(s) URL"),
        ({"target": "http://10.0.0.8/hook"}, "target", "private address"),
        ({"target": "http://169.254.169.254/latest"}, "target", "metadata"),
        ({"kind": "email", "target": "nobody"}, "target", "valid e-mail"),
        ({"timezone": "Mars/Base"}, "timezone", "Unknown time zone"),
        ({"quiet_from": "22:00"}, "quiet_to", "both ends"),
        ({"secret": "mine"}, "secret", "cannot be changed"),
    ],
)
def test_bad_channels_are_refused_per_field(api_client, fields, field, message):
    response = _channel(api_client, **fields)
    assert response.status_code == 400, response.data
    assert message in str(response.data["errors"][field]), response.data
    assert Channel.objects.count() == 0


def test_rules_take_only_the_owners_own_channel_and_task(api_client, other_client, user, other_user):
    mine = _channel(api_client).data["id"]
    theirs = _channel(other_client).data["id"]
    their_task = TaskFactory(owner=other_user)
    my_task = TaskFactory(owner=user)
    bad = api_client.post(RULES, {"channel": theirs, "on_failure": True}, format="json")
    assert bad.status_code == 400 and "channel" in bad.data["errors"]
    bad = api_client.post(RULES, {"channel": mine, "task": str(their_task.pk), "on_failure": True}, format="json")
    assert bad.status_code == 400 and "task" in bad.data["errors"]
    bad = api_client.post(RULES, {"channel": mine}, format="json")
    assert bad.status_code == 400 and "at least one event" in str(bad.data["errors"])
    bad = api_client.post(RULES, {"channel": mine, "late_after": "-5s"}, format="json")
    assert bad.status_code == 400
    assert Rule.objects.count() == 0
    ok = api_client.post(
        RULES, {"channel": mine, "task": str(my_task.pk), "on_failure": True, "late_after": "5m"}, format="json"
    )
    assert ok.status_code == 201, ok.data
    assert ok.data["late_after"] in ("5m", "300s", "PT5M", "00:05:00") or ok.data["late_after"]
    default = api_client.post(RULES, {"channel": mine, "no_success_within": "1h"}, format="json")
    assert default.status_code == 201 and default.data["task"] is None
    changed = api_client.patch(f"{RULES}/{ok.data['id']}", {"on_retry": True}, format="json")
    assert changed.status_code == 200 and changed.data["on_retry"] is True
    assert api_client.get(RULES, {"task": str(my_task.pk)}).data["count"] == 1
    assert other_client.delete(f"{RULES}/{ok.data['id']}").status_code == 404
    assert api_client.delete(f"{RULES}/{ok.data['id']}").status_code == 204


def test_send_test_returns_its_delivery_and_the_log_pages_by_cursor(api_client, other_client, settings):
    with webhook_receiver() as receiver:
        channel = _channel(api_client, target=receiver.url).data
        tests = [api_client.post(f"{CHANNELS}/{channel['id']}/test") for _ in range(3)]
        assert [t.status_code for t in tests] == [202] * 3
        assert {t.data["status"] for t in tests} == {"pending"} and not receiver.arrivals
        assert deliver_queued() == ["delivered"] * 3
        assert len(receiver.arrivals) == 3 and receiver.arrivals[0].signature_valid(channel["secret"])
    page = api_client.get(DELIVERIES, {"limit": 2, "channel": channel["id"]})
    assert page.status_code == 200
    assert [d["id"] for d in page.data["results"]] == [tests[2].data["id"], tests[1].data["id"]]
    rest = api_client.get(page.data["next"])
    assert [d["id"] for d in rest.data["results"]] == [tests[0].data["id"]]
    # The execution lists' keyset pages: next and previous links, no count.
    assert "count" not in page.data and page.data["previous"] is None and rest.data["next"] is None
    back = api_client.get(rest.data["previous"])
    assert [d["id"] for d in back.data["results"]] == [tests[2].data["id"], tests[1].data["id"]]
    assert api_client.get(DELIVERIES, {"cursor": "nonsense"}).status_code == 400
    old_cursor = api_client.get(DELIVERIES, {"before": tests[2].data["id"]})
    assert old_cursor.status_code == 400 and "before" in old_cursor.data["errors"]
    assert api_client.get(DELIVERIES, {"status": "failed"}).data["results"] == []
    assert api_client.get(DELIVERIES, {"status": "nope"}).status_code == 400
    assert other_client.get(DELIVERIES).data["results"] == []
    assert Delivery.objects.count() == 3


def test_a_test_to_a_dead_address_is_pending_with_its_error(api_client):
    channel = _channel(api_client, target="http://127.0.0.1:9/nothing").data
    response = api_client.post(f"{CHANNELS}/{channel['id']}/test")
    assert response.status_code == 202
    assert response.data["status"] == "pending" and response.data["attempts"] == 0
    assert deliver_queued() == ["retry"]
    delivery = api_client.get(f"{DELIVERIES}/{response.data['id']}").data
    assert delivery["status"] == "pending" and delivery["attempts"] == 1
    assert delivery["last_error"] == (
        "Could not connect to the receiver 127.0.0.1:9: the connection was refused (nothing listens there)."
    )


def test_notification_target_is_refused_with_a_pointer_to_the_new_endpoints(api_client, user):
    response = api_client.post(
        "/api/v1/tasks", {"runner": "noop", "notification_target": "ops@example.com"}, format="json"
    )
    assert response.status_code == 400
    assert "/api/v1/notification-rules" in str(response.data["errors"]["notification_target"])
    task = TaskFactory(owner=user)
    response = api_client.patch(f"/api/v1/tasks/{task.pk}", {"notification_target": "x"}, format="json")
    assert response.status_code == 400 and "notification_target" in response.data["errors"]
    assert "notification_target" not in api_client.get(f"/api/v1/tasks/{task.pk}").data
