"""Celery tasks of the notification queue (TMS_NOTIFY_QUEUE): thin, one service call each."""

from __future__ import annotations

from celery import shared_task

from notifications import dispatch


@shared_task(name="tms.notify_dispatch", ignore_result=True, send_events=False)
def notify_dispatch() -> int:
    """Beat's pass: outbox -> deliveries (or digest items), digests whose window ended ->
    deliveries, then hand each due delivery to a sender task."""
    taken = dispatch.dispatch_outbox()
    dispatch.flush_digests()
    lease = dispatch.lease_due()
    for delivery_id in lease.delivery_ids:
        # Published after the lease committed; a lost publish only waits for the lease to end.
        notify_deliver.delay(delivery_id, lease.token)
    return taken


@shared_task(name="tms.notify_deliver", ignore_result=True)
def notify_deliver(delivery_id: int, token: str) -> str:
    return dispatch.deliver(delivery_id, token)


@shared_task(name="tms.notify_checks", ignore_result=True, send_events=False)
def notify_checks() -> tuple[int, int]:
    return dispatch.check_long_runs(), dispatch.check_dead_mans_switch()
