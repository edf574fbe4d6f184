"""The outbox triggers, storm suppression, deliveries and their leases, in process on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from executions import transitions
from executions.models import Execution, SkippedOccurrence
from notifications import dispatch, services
from notifications.models import Channel, ChannelState, Delivery, DeliveryStatus, Outbox, Rule, RuleState
from tests.factories import TaskFactory, UserFactory
from tests.notifications.receiver import deliver_queued, webhook_receiver

pytestmark = pytest.mark.django_db


def _execution(task, *, late: float = 0.0) -> int:
    (pk,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, timezone.now() - timedelta(seconds=late), task.priority)], actor="t"
    )
    return pk


def _run(task, outcome: str, *, late: float = 0.0) -> int:
    """Drive one execution through the real transitions: take, claim, then succeed or fail."""
    pk = _execution(task, late=late)
    transitions.executions_take_due(limit=100, actor="monitor")
    assert transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id="w", lease_seconds=60)
    if outcome == "succeed":
        assert transitions.execution_succeed(execution_id=pk, attempt=1, worker_id="w", output="", max_chars=100)
    else:
        retry_in = 5.0 if outcome == "retry" else None
        assert transitions.execution_fail(
            execution_id=pk, attempt=1, worker_id="w", error="boom", output="", retry_in=retry_in, max_chars=100
        )
    return pk


def _channel(owner, url="http://127.0.0.1:9/hook", kind="webhook") -> Channel:
    return services.channel_create(owner=owner, data={"name": "ops", "kind": kind, "target": url})


def _send_all() -> list[str]:
    lease = dispatch.lease_due()
    return [dispatch.deliver(pk, lease.token) for pk in lease.delivery_ids]


def test_the_trigger_writes_the_outbox_only_for_tasks_with_a_rule_that_wants_the_event():
    quiet, watched = TaskFactory(), TaskFactory()
    services.rule_create(
        owner=watched.owner, data={"task": watched, "channel": _channel(watched.owner), "on_failure": True}
    )
    for task in (quiet, watched):
        _run(task, "fail")
        _run(task, "succeed")
        _run(task, "retry")
    # The watched task's final failure and success (the storm state needs both); no retry (no
    # on_retry), no start (no late rule); nothing at all for the task without rules.
    assert list(Outbox.objects.values_list("task_id", "kind")) == [(watched.pk, "failed"), (watched.pk, "succeeded")]


def test_failing_three_times_sends_one_failing_then_one_recovered_with_the_count():
    task = TaskFactory()
    channel = _channel(task.owner)
    services.rule_create(
        owner=task.owner, data={"task": task, "channel": channel, "on_failure": True, "on_recovery": True}
    )
    failed = [_run(task, "fail") for _ in range(3)]
    _run(task, "succeed")
    _run(task, "succeed")
    assert dispatch.dispatch_outbox() == 5
    deliveries = list(Delivery.objects.order_by("id"))
    assert [d.event for d in deliveries] == ["failing", "recovered"]
    assert deliveries[0].payload["execution"]["id"] == failed[0]
    assert deliveries[1].payload["failures"] == 3
    assert Outbox.objects.count() == 0
    assert RuleState.objects.get().failing is False
    # Dispatching again creates nothing more.
    assert dispatch.dispatch_outbox() == 0 and Delivery.objects.count() == 2


def test_retries_are_told_while_the_task_is_healthy_only():
    task = TaskFactory()
    services.rule_create(owner=task.owner, data={"task": task, "channel": _channel(task.owner), "on_retry": True})
    _run(task, "retry")
    dispatch.dispatch_outbox()
    assert list(Delivery.objects.values_list("event", flat=True)) == ["retry"]


def test_owner_defaults_apply_to_tasks_without_rules_of_their_own():
    owner = UserFactory()
    with_own, without = TaskFactory(owner=owner), TaskFactory(owner=owner)
    default_channel, own_channel = _channel(owner), _channel(owner, "http://127.0.0.1:8/other")
    services.rule_create(owner=owner, data={"channel": default_channel, "on_failure": True})
    services.rule_create(owner=owner, data={"task": with_own, "channel": own_channel, "on_retry": True})
    _run(with_own, "fail")
    _run(without, "fail")
    dispatch.dispatch_outbox()
    assert list(Delivery.objects.values_list("task_id", "channel_id", "event")) == [
        (without.pk, default_channel.pk, "failing")
    ]


def test_a_late_start_is_told_once_past_the_threshold():
    task = TaskFactory()
    services.rule_create(
        owner=task.owner, data={"task": task, "channel": _channel(task.owner), "late_after": timedelta(seconds=5)}
    )
    _run(task, "succeed", late=1)
    late = _run(task, "succeed", late=30)
    dispatch.dispatch_outbox()
    (delivery,) = Delivery.objects.all()
    assert delivery.event == "late" and delivery.execution_id == late
    assert 30 <= delivery.payload["lateness_seconds"] < 40


def test_skipped_occurrences_are_told_with_their_reason():
    task = TaskFactory()
    services.rule_create(owner=task.owner, data={"task": task, "channel": _channel(task.owner), "on_skip": True})
    SkippedOccurrence.objects.create(task=task, scheduled_for=timezone.now(), reason="paused", detail="by user")
    dispatch.dispatch_outbox()
    (delivery,) = Delivery.objects.all()
    assert delivery.event == "skipped" and delivery.payload["detail"] == "paused: by user"


def test_long_runs_and_the_dead_mans_switch_are_told_once():
    task = TaskFactory(interval=timedelta(seconds=10))
    channel = _channel(task.owner)
    rule = services.rule_create(
        owner=task.owner,
        data={
            "task": task,
            "channel": channel,
            "running_longer_than": timedelta(seconds=5),
            "no_success_within": timedelta(seconds=30),
        },
    )
    pk = _execution(task)
    transitions.executions_take_due(limit=10, actor="m")
    transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id="w", lease_seconds=60)
    Execution.objects.filter(pk=pk).update(started_at=timezone.now() - timedelta(seconds=6))
    assert dispatch.check_long_runs() == 1
    assert dispatch.check_long_runs() == 0
    assert dispatch.check_dead_mans_switch() == 0  # the rule is younger than 30 s
    Rule.objects.filter(pk=rule.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    type(task).objects.filter(pk=task.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    assert dispatch.check_dead_mans_switch() == 1
    assert dispatch.check_dead_mans_switch() == 0
    transitions.execution_succeed(execution_id=pk, attempt=1, worker_id="w", output="", max_chars=10)
    dispatch.dispatch_outbox()
    assert list(Delivery.objects.order_by("id").values_list("event", flat=True)) == [
        "running_long",
        "overdue",
        "recovered",
    ]


def test_a_webhook_is_signed_and_carries_the_idempotency_key():
    task = TaskFactory()
    with webhook_receiver() as receiver:
        channel = _channel(task.owner, receiver.url)
        services.rule_create(owner=task.owner, data={"task": task, "channel": channel, "on_failure": True})
        _run(task, "fail")
        dispatch.dispatch_outbox()
        assert _send_all() == ["delivered"]
        (arrival,) = receiver.arrivals
    delivery = Delivery.objects.get()
    assert arrival.key == delivery.idempotency_key
    assert arrival.signature_valid(channel.secret) and not arrival.signature_valid("other")
    assert arrival.payload["event"] == "failing" and arrival.payload["task"]["id"] == str(task.pk)
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.DELIVERED, 1)


def test_server_errors_are_retried_with_backoff_and_a_refusal_marks_the_channel_failing():
    task = TaskFactory()
    with webhook_receiver() as receiver:
        channel = _channel(task.owner, receiver.url)
        services.rule_create(owner=task.owner, data={"task": task, "channel": channel, "on_failure": True})
        _run(task, "fail")
        dispatch.dispatch_outbox()
        receiver.status = 503
        assert _send_all() == ["retry"]
        delivery = Delivery.objects.get()
        assert delivery.status == DeliveryStatus.PENDING and delivery.attempts == 1
        assert delivery.next_attempt_at > timezone.now() + timedelta(seconds=3)  # 5 s backoff
        assert "HTTP 503" in delivery.last_error
        assert _send_all() == []  # not due yet
        Delivery.objects.update(next_attempt_at=timezone.now())
        receiver.status = 410
        assert _send_all() == ["failed"]
        channel.refresh_from_db()
        assert channel.state == ChannelState.FAILING and "HTTP 410" in channel.last_error
        receiver.status = 200
        test = services.channel_send_test(channel=channel)
        assert test.status == DeliveryStatus.PENDING and deliver_queued() == ["delivered"]
        test.refresh_from_db()
    assert test.status == DeliveryStatus.DELIVERED
    channel.refresh_from_db()
    assert channel.state == ChannelState.OK


def test_an_expired_lease_hands_the_delivery_to_another_sender():
    task = TaskFactory()
    with webhook_receiver() as receiver:
        channel = _channel(task.owner, receiver.url)
        services.rule_create(owner=task.owner, data={"task": task, "channel": channel, "on_failure": True})
        _run(task, "fail")
        dispatch.dispatch_outbox()
        first = dispatch.lease_due()
        assert dispatch.lease_due().delivery_ids == []  # leased: nobody else takes it
        Delivery.objects.update(lease_until=timezone.now() - timedelta(seconds=1))  # its sender died
        second = dispatch.lease_due()
        assert second.delivery_ids == first.delivery_ids
        assert dispatch.deliver(first.delivery_ids[0], first.token) == "not leased"  # fenced out
        assert dispatch.deliver(second.delivery_ids[0], second.token) == "delivered"
        assert len(receiver.arrivals) == 1


def test_the_trigger_costs_one_probe_on_tasks_without_rules():
    # The function exists and fires only on the counted transitions (see docs/benchmarks.md for figures).
    with connection.cursor() as cursor:
        cursor.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE 'tms_%' AND NOT tgisinternal ORDER BY 1")
        # The outbox's execution events are a part of the status trigger (notifications/triggers.py).
        assert [row[0] for row in cursor.fetchall()] == [
            "tms_execution_task_version",
            "tms_notify_skipped",
            "tms_status_changed",
            "tms_task_deleted_without_executions",
        ]
