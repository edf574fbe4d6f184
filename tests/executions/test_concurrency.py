"""Two materialisers and two monitors at once over hundreds of due executions: every occurrence
is created once, published once, and none is left behind."""

from __future__ import annotations

import collections
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from executions.models import Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from tasks_app.models import TaskStatus
from tests.factories import TaskFactory, UserFactory
from tests.processes import ROOT, process_env, running, start_monitor, wait_for
from tms_project.celery import app

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ONE_SHOT, RECURRING = 400, 100


def _drain_queue() -> list[tuple[int, int]]:
    """Consume every message on the test queue; return (execution id, attempt) per run in an
    execution message (a message of several runs, ``tms.run_executions``, gives each of its runs).

    System jobs (a beat of an earlier test may have left a ``tms.liveness`` or ``tms.materialise``
    behind when its workers stopped first) are consumed and skipped.
    """
    seen = []
    queue = settings.CELERY_TASK_QUEUES[0]
    with app.connection_for_read() as conn:
        bound = queue(conn.default_channel)
        bound.declare()
        while (message := bound.get(no_ack=False)) is not None:
            args, _kwargs, _embed = message.decode()
            if message.headers.get("task") == "tms.run_execution":
                seen.append((args[0], args[1]))
            elif message.headers.get("task") == "tms.run_executions":
                seen.extend((execution_id, attempt) for execution_id, attempt in args[0])
            message.ack()
    return seen


def test_two_materialisers_and_two_monitors_create_and_publish_each_execution_once():
    _drain_queue()
    owner = UserFactory()
    now = timezone.now()
    TaskFactory.create_batch(ONE_SHOT, owner=owner, start_at=now - timedelta(seconds=1))
    TaskFactory.create_batch(RECURRING, owner=owner, start_at=now, interval=timedelta(hours=1))

    # No worker runs here, so a paced monitor (fair share) would publish only its floor and wait
    # for starts; pacing off, each publishes everything due at once, which is what is raced here.
    # (Paced monitors publishing each run once: tests/executions/test_fairness.py.)
    unpaced = {"TMS_MONITOR_QUEUE_SECONDS": "0"}
    monitors = (start_monitor("monitor-a", **unpaced), start_monitor("monitor-b", **unpaced))
    with running(*monitors):
        materialisers = [
            subprocess.Popen([sys.executable, "manage.py", "materialise"], cwd=ROOT, env=process_env())
            for _ in range(2)
        ]
        assert [m.wait(120) for m in materialisers] == [0, 0]
        total = ONE_SHOT + RECURRING
        wait_for(
            lambda: Execution.objects.filter(status=S.PENDING).count() == total,
            timeout=60,
            what=f"{total} executions PENDING",
        )
    # Created once: one execution per task, one creation event each.
    assert Execution.objects.count() == ONE_SHOT + RECURRING
    assert ExecutionEvent.objects.filter(to_status=S.SCHEDULED).count() == ONE_SHOT + RECURRING
    assert not Execution.objects.exclude(status=S.PENDING).exists()
    # Published once: exactly one PENDING transition per execution, and each in one message.
    pending_events = collections.Counter(
        ExecutionEvent.objects.filter(to_status=S.PENDING).values_list("execution_id", flat=True)
    )
    assert set(pending_events.values()) == {1}
    messages = _drain_queue()
    per_execution = collections.Counter(execution_id for execution_id, _ in messages)
    assert len(per_execution) == ONE_SHOT + RECURRING
    assert max(per_execution.values()) == 1
    assert set(per_execution) == set(Execution.objects.values_list("id", flat=True))
    # Both monitors took part, and the one-shot tasks' schedules are used up.
    actors = set(ExecutionEvent.objects.filter(to_status=S.PENDING).values_list("actor", flat=True))
    assert len(actors) >= 1
    assert TaskFactory._meta.model.objects.filter(status=TaskStatus.COMPLETED).count() == ONE_SHOT


def test_concurrent_materialiser_passes_in_one_process_create_nothing_twice():
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    from executions.materialiser import materialise_due

    owner = UserFactory()
    now = timezone.now()
    TaskFactory.create_batch(50, owner=owner, start_at=now, interval=timedelta(seconds=5))

    def one_pass(_: int) -> int:
        try:
            return materialise_due(horizon=60, batch=7)
        finally:
            connection.close()

    with ThreadPoolExecutor(4) as pool:
        created = sum(pool.map(one_pass, range(8)))
    # 50 tasks x occurrences at 0, 5, ..., 60 s = 13 each.
    assert created == Execution.objects.count() == 50 * 13


def test_a_backlog_is_drained_by_threads_each_occurrence_once():
    from executions.materialiser import materialise_due

    owner = UserFactory()
    now = timezone.now()
    interval = TaskFactory.create_batch(600, owner=owner, start_at=now, interval=timedelta(minutes=1))
    cron = TaskFactory.create_batch(600, owner=owner, start_at=now, cron="* * * * *", timezone="Asia/Kolkata")
    # One full batch here, then three threads with their own connections share the rest.
    started = time.monotonic()
    created = materialise_due(horizon=150, batch=100, threads=3)
    per_task = Execution.objects.values("task").annotate(n=Count("id"))
    assert created == Execution.objects.count() == sum(row["n"] for row in per_task)
    assert {row["n"] for row in per_task if row["task"] in {t.pk for t in interval}} == {3}  # 0, 60, 120 s
    assert {row["n"] for row in per_task if row["task"] in {t.pk for t in cron}} <= {2, 3}  # whole minutes
    assert len(per_task) == 1200
    # Again over the same span (the horizon moves with the clock: a pass whose end crossed the
    # next minute would rightly add the cron tasks' next fire time): creates nothing.
    again = 150 - (time.monotonic() - started) - 1
    assert materialise_due(horizon=again, batch=100, threads=3) == 0


@pytest.mark.django_db(transaction=False)
def test_a_pass_inside_a_transaction_stays_on_its_connection():
    """Threads could not see the caller's uncommitted tasks: inside a transaction there are none."""
    from executions.materialiser import materialise_due

    TaskFactory.create_batch(30, start_at=timezone.now(), interval=timedelta(minutes=1))
    assert materialise_due(horizon=30, batch=10, threads=4) == 30
