"""PENDING runs that no message carries (a monitor killed between its commit and its publish, a
message a cluster confirmed into a queue whose home node was down) do not stall the platform:
the monitor's fair-share pacer counted them as queued work and published nothing else until they
aged past TMS_PENDING_REPUBLISH_AFTER (120 s; issue 45: 133 interval runs then cancelled as late).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from executions import transitions
from executions.models import Execution
from executions.models import ExecutionStatus as S
from tests.factories import ExecutionFactory, TaskFactory
from tests.processes import running, start_monitor, start_worker, wait_for, wait_worker_ready
from tms_project.celery import app

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _due(count: int, *, ago: float = 1.0) -> list[int]:
    task = TaskFactory(misfire_grace=timedelta(hours=1))
    now = timezone.now()
    return [ExecutionFactory(task=task, scheduled_for=now - timedelta(seconds=ago + i / 1000)).pk for i in range(count)]


def test_runs_pending_without_a_message_neither_hold_the_pacer_back_nor_wait_for_the_republish_age():
    with app.connection_for_write() as conn, contextlib.suppress(Exception):  # no queue yet
        conn.default_channel.queue_purge(settings.TMS_QUEUE)
    # A monitor took 60 runs (more than the pacer's target of queued work) and died before it
    # published them: PENDING, no message.
    stranded = _due(60, ago=2.0)
    with transaction.atomic():
        taken = transitions.executions_take_due(limit=100, actor="monitor:killed")
    assert {item.execution_id for item in taken} == set(stranded)
    fresh = _due(5)

    env = {
        "TMS_PENDING_REPUBLISH_AFTER": "120",
        "TMS_MONITOR_QUEUE_SECONDS": "0.5",
        "TMS_MONITOR_MAX_SLEEP": "0.3",
        # Three heartbeats bound how long a paused worker holds a message: 3 s, plus UNCARRIED_AFTER.
        "TMS_BROKER_HEARTBEAT": "1",
    }
    worker, monitor = start_worker(concurrency=2, **env), start_monitor(**env)
    with running(worker, monitor):
        wait_worker_ready(worker)
        # Within seconds (the queue seen without them for UNCARRIED_AFTER + 3 heartbeats), not 120 s.
        wait_for(
            lambda: Execution.objects.filter(pk__in=[*stranded, *fresh], status=S.SUCCEEDED).count() == 65,
            timeout=25,
            what="every run, stranded or new, to succeed",
        )
    # Each stranded run was published again once, and started once.
    for execution in Execution.objects.filter(pk__in=stranded):
        assert execution.events.filter(from_status=S.PENDING, to_status=S.PENDING).count() == 1
        assert execution.events.filter(to_status=S.RUNNING).count() == 1
