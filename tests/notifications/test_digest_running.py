"""Digest rules on the running system: real worker processes, the monitor, beat, the
notification worker and a real local webhook receiver; what reaches the receiver is counted."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from notifications.models import Delivery, DeliveryStatus, DigestItem
from tests.notifications.receiver import Receiver, webhook_receiver
from tests.notifications.test_running_system import _post, _task, _webhook, endpoint, platform, start_notify_worker
from tests.processes import running, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: Long enough for a batch of one-shot failing tasks to fail inside one window on a loaded machine.
WINDOW = "25s"


def _digests(receiver: Receiver) -> list[dict[str, Any]]:
    """The digests the receiver accepted (deduplicated by Idempotency-Key), oldest first."""
    with receiver.lock:
        return [payload for payload in receiver.accepted.values() if payload["event"] == "digest"]


def _fail_batch(client: Any, url: str, count: int) -> set[str]:
    """``count`` one-shot tasks that fail once each: one "failing" event each."""
    return {_task(client, url, name=f"job-{i}")["id"] for i in range(count)}


def test_events_in_one_window_reach_the_receiver_as_one_digest_and_the_next_window_as_another(api_client):
    with webhook_receiver() as receiver, endpoint(failures=1000) as (url, _), platform():
        channel = _webhook(api_client, receiver)
        _post(
            api_client,
            "/api/v1/notification-rules",
            {"channel": channel["id"], "on_failure": True, "digest_every": WINDOW},
        )
        first = _fail_batch(api_client, url, 4)
        wait_for(lambda: len(_digests(receiver)) >= 1, timeout=120, what="the first digest")
        second = _fail_batch(api_client, url, 3)
        wait_for(lambda: len(_digests(receiver)) >= 2, timeout=120, what="the second digest")
        time.sleep(3)  # anything more would have arrived by now
        digests = _digests(receiver)
        arrivals = list(receiver.arrivals)
    assert len(digests) == 2 and len(arrivals) == 2
    assert all(arrival.signature_valid(channel["secret"]) for arrival in arrivals)
    for digest, batch in zip(digests, (first, second), strict=True):
        assert digest["total"] == len(batch)
        assert sorted(item["task"]["id"] for item in digest["items"]) == sorted(batch)
        assert {item["event"] for item in digest["items"]} == {"failing"}
        assert sum(group["count"] for group in digest["counts"]) == len(batch)
    assert DigestItem.objects.filter(delivery__isnull=True).count() == 0
    assert list(Delivery.objects.values_list("event", "status")) == [("digest", DeliveryStatus.DELIVERED)] * 2


def test_a_sender_killed_mid_digest_still_ends_with_one_digest_per_window(api_client):
    with webhook_receiver() as receiver, endpoint(failures=1000) as (url, _), platform() as procs:
        receiver.hold_first = True
        channel = _webhook(api_client, receiver)
        _post(
            api_client,
            "/api/v1/notification-rules",
            {"channel": channel["id"], "on_failure": True, "digest_every": WINDOW},
        )
        first = _fail_batch(api_client, url, 3)
        assert receiver.held.wait(120), "no digest reached the receiver"
        procs["notify"].signal_group(signal.SIGKILL)  # the sender holding the request, and its pool
        procs["notify"].popen.wait(10)
        replacement = start_notify_worker("notify-2")
        with running(replacement):
            wait_for(
                lambda: Delivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 1,
                timeout=60,
                what="the first digest delivered",
            )
            second = _fail_batch(api_client, url, 2)
            wait_for(
                lambda: Delivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 2,
                timeout=120,
                what="the second digest delivered",
            )
            time.sleep(3)
            arrivals = list(receiver.arrivals)
            digests = _digests(receiver)
    keys = list(Delivery.objects.order_by("id").values_list("idempotency_key", flat=True))
    assert len(keys) == 2 and set(receiver.accepted) == set(keys)
    counts = {key: sum(1 for arrival in arrivals if arrival.key == key) for key in keys}
    # The first digest reached the receiver twice (once to the killed sender, once more after its
    # lease ran out) under one key; deduplicated, one digest per window, each with all its events.
    assert counts == {keys[0]: 2, keys[1]: 1}, counts
    assert [sorted(item["task"]["id"] for item in digest["items"]) for digest in digests] == [
        sorted(first),
        sorted(second),
    ]
    assert [digest["total"] for digest in digests] == [3, 2]
