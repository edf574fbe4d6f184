"""A message RabbitMQ handed to a paused worker (SIGSTOP) is not held until the worker resumes:
the worker's AMQP heartbeats stop, RabbitMQ closes its connection after about two heartbeat
intervals without a frame (checked once an interval, so at most three intervals after the last
frame) and redelivers the unacknowledged message to another worker, which runs it."""

from __future__ import annotations

import json
import signal
import time

import pytest

from executions.models import Execution
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tests.factories import UserFactory
from tests.processes import LOG_DIR, running, start_monitor, start_worker, wait_for, wait_worker_ready

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HEARTBEAT = 4
#: The stated bound from the pause: RabbitMQ checks once per heartbeat interval and closes after
#: two checks without a frame, so at most three intervals after the last one; plus the claim.
BOUND = 3 * HEARTBEAT + 3
ENV = {"TMS_BROKER_HEARTBEAT": str(HEARTBEAT), "TMS_MONITOR_MAX_SLEEP": "0.3"}


def test_message_held_by_a_paused_worker_is_redelivered_within_the_heartbeat_bound():
    owner = UserFactory()
    paused = start_worker("paused", concurrency=1, **ENV)
    monitor = start_monitor(**ENV)
    with running(paused, monitor):
        wait_worker_ready(paused)
        paused.signal_group(signal.SIGSTOP)
        stopped = time.time()
        try:
            task = task_create(owner=owner, runner="sleep", config={"duration": "100ms"})
            wait_for(lambda: Execution.objects.filter(task=task, status=S.PENDING).exists(), timeout=20, what="PENDING")
            published = time.time() - stopped
            # The only consumer is paused: RabbitMQ has handed it the message, unacknowledged.
            with running(other := start_worker("other", concurrency=1, **ENV)):
                wait_worker_ready(other)
                wait_for(
                    lambda: Execution.objects.filter(task=task, status=S.SUCCEEDED).exists(),
                    timeout=BOUND + 30,
                    what="SUCCEEDED on the other worker",
                )
        finally:
            paused.signal_group(signal.SIGCONT)
    (execution,) = Execution.objects.filter(task=task)
    claimed = execution.events.get(to_status=S.RUNNING)
    assert claimed.actor.split(":")[1] == str(other.pid)
    # Published once: the monitor's 120 s republish played no part.
    assert execution.events.filter(to_status=S.PENDING).count() == 1
    delay = claimed.at.timestamp() - stopped
    report = {"heartbeat": HEARTBEAT, "published_after_pause": round(published, 3), "claimed_after_pause": delay}
    (LOG_DIR / "paused-worker.json").write_text(json.dumps(report))
    print("paused worker:", report)
    assert delay < BOUND, delay
