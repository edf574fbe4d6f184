"""Digest rules, in process on PostgreSQL: events collected per window, one bounded summary per
window through the ordinary deliveries, quiet hours holding a due digest, API validation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from notifications import dispatch, services
from notifications.models import Delivery, DigestItem, Rule
from tests.factories import TaskFactory, UserFactory
from tests.notifications.receiver import webhook_receiver
from tests.notifications.test_dispatch import _channel, _run, _send_all

pytestmark = pytest.mark.django_db


def _digest_rule(owner, channel, every=timedelta(minutes=5)) -> Rule:
    """An owner-wide default: every task of ``owner`` without rules of its own."""
    return services.rule_create(
        owner=owner, data={"channel": channel, "on_failure": True, "on_recovery": True, "digest_every": every}
    )


def _end_windows() -> None:
    """Jump to the end of every open window (instead of waiting digest_every)."""
    DigestItem.objects.filter(delivery__isnull=True).update(due_at=timezone.now() - timedelta(seconds=1))


def test_events_in_one_window_make_one_digest_and_the_next_window_another():
    owner = UserFactory()
    tasks = [TaskFactory(owner=owner) for _ in range(4)]
    with webhook_receiver() as receiver:
        channel = _channel(owner, receiver.url)
        _digest_rule(owner, channel)
        for task in tasks:
            _run(task, "fail")
        _run(tasks[0], "succeed")  # failing then recovered: two events for this task
        dispatch.dispatch_outbox()
        assert Delivery.objects.count() == 0 and DigestItem.objects.count() == 5
        assert dispatch.flush_digests() == 0  # the window has not ended
        _end_windows()
        assert dispatch.flush_digests() == 1
        assert dispatch.flush_digests() == 0
        assert _send_all() == ["delivered"]
        # The next window: a new event after the digest went.
        _run(tasks[1], "succeed")
        dispatch.dispatch_outbox()
        _end_windows()
        assert dispatch.flush_digests() == 1
        assert _send_all() == ["delivered"]
        first, second = (arrival.payload for arrival in receiver.arrivals)
    assert first["event"] == second["event"] == "digest" and first["id"] != second["id"]
    assert first["total"] == 5 and len(first["items"]) == 5 and first["items_omitted"] == 0
    counts = {(group["task"]["id"], group["event"]): group["count"] for group in first["counts"]}
    assert counts == {
        **{(str(task.pk), "failing"): 1 for task in tasks},
        (str(tasks[0].pk), "recovered"): 1,
    }
    assert sorted(item["event"] for item in first["items"]) == ["failing"] * 4 + ["recovered"]
    assert second["total"] == 1 and second["items"][0]["event"] == "recovered"
    assert second["items"][0]["task"]["id"] == str(tasks[1].pk)
    assert DigestItem.objects.filter(delivery__isnull=True).count() == 0
    assert set(Delivery.objects.values_list("event", "status")) == {("digest", "delivered")}


def test_a_digest_is_bounded_whatever_the_number_of_events():
    owner = UserFactory()
    channel = _channel(owner)
    rule = _digest_rule(owner, channel)
    tasks = [TaskFactory(owner=owner) for _ in range(dispatch.DIGEST_ITEMS + 10)]
    for task in tasks:
        _run(task, "fail")
    dispatch.dispatch_outbox()
    _end_windows()
    assert dispatch.flush_digests() == 1
    payload = Delivery.objects.get(rule=rule).payload
    assert payload["total"] == len(tasks)
    assert len(payload["items"]) == dispatch.DIGEST_ITEMS and payload["items_omitted"] == 10
    assert sum(group["count"] for group in payload["counts"]) == len(tasks)
    # The latest items are the ones listed.
    assert payload["items"][-1]["task"]["id"] == str(tasks[-1].pk)


def test_a_digest_due_in_quiet_hours_waits_and_then_goes_as_one():
    owner = UserFactory()
    now = timezone.now()
    channel = _channel(owner)
    services.channel_update(
        channel=channel,
        data={"quiet_from": (now - timedelta(hours=1)).time(), "quiet_to": (now + timedelta(hours=1)).time()},
    )
    rule = _digest_rule(owner, channel)
    first, second = TaskFactory(owner=owner), TaskFactory(owner=owner)
    _run(first, "fail")
    dispatch.dispatch_outbox()
    _end_windows()
    assert dispatch.flush_digests() == 0  # due, but in quiet hours: it waits
    # More events while it waits join it (one digest at the end of the quiet hours, not one per window).
    _run(second, "fail")
    dispatch.dispatch_outbox()
    assert len(set(DigestItem.objects.values_list("due_at", flat=True))) == 1
    services.channel_update(channel=channel, data={"quiet_from": None, "quiet_to": None})  # the quiet hours end
    assert dispatch.flush_digests() == 1
    (delivery,) = Delivery.objects.filter(rule=rule)
    assert delivery.payload["total"] == 2


def test_a_check_seeing_the_same_long_run_again_collects_it_once():
    task = TaskFactory()
    channel = _channel(task.owner)
    services.rule_create(
        owner=task.owner,
        data={
            "task": task,
            "channel": channel,
            "running_longer_than": timedelta(seconds=5),
            "digest_every": timedelta(minutes=1),
        },
    )
    from executions import transitions
    from executions.models import Execution
    from tests.notifications.test_dispatch import _execution

    pk = _execution(task)
    transitions.executions_take_due(limit=10, actor="m")
    transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id="w", lease_seconds=60)
    Execution.objects.filter(pk=pk).update(started_at=timezone.now() - timedelta(seconds=6))
    assert dispatch.check_long_runs() == 1
    _end_windows()
    assert dispatch.flush_digests() == 1
    assert dispatch.check_long_runs() == 0  # already in a digest: not collected again
    assert DigestItem.objects.count() == 1 and Delivery.objects.count() == 1


@pytest.mark.parametrize("value", ["5s", "8d", "-1m", "soon", 3, ""])
def test_a_bad_digest_every_is_a_400_naming_the_field(api_client, value):
    channel = api_client.post(
        "/api/v1/notification-channels",
        {"name": "ops", "kind": "webhook", "target": "https://hooks.example.com/tms"},
        format="json",
    ).data
    response = api_client.post(
        "/api/v1/notification-rules",
        {"channel": channel["id"], "on_failure": True, "digest_every": value},
        format="json",
    )
    assert response.status_code == 400, response.data
    assert "digest_every" in response.data["errors"], response.data
    assert Rule.objects.count() == 0
    ok = api_client.post(
        "/api/v1/notification-rules",
        {"channel": channel["id"], "on_failure": True, "digest_every": "15m"},
        format="json",
    )
    assert ok.status_code == 201 and ok.data["digest_every"]
    off = api_client.patch(f"/api/v1/notification-rules/{ok.data['id']}", {"digest_every": None}, format="json")
    assert off.status_code == 200 and off.data["digest_every"] is None
