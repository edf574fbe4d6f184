"""An event records the time of its write, not its transaction's (or statement's) start: a
transition that waited behind another transaction's row lock is recorded when it happened."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg2
import pytest
from django.db import connection, transaction
from django.utils import timezone

from executions import transitions
from executions.models import Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)

HOLD_SECONDS = 2.0


def _locker(execution_id: int, locked: threading.Event, released: list) -> None:
    """Another connection: lock the row, hold it, note the database time, then let go."""
    settings = connection.settings_dict
    other = psycopg2.connect(
        dbname=settings["NAME"],
        user=settings["USER"],
        password=settings["PASSWORD"],
        host=settings["HOST"],
        port=settings["PORT"] or 5432,
    )
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {Execution._meta.db_table} WHERE id = %s FOR UPDATE", [execution_id])  # noqa: S608
            locked.set()
            time.sleep(HOLD_SECONDS)
            cursor.execute("SELECT clock_timestamp()")
            released.append(cursor.fetchone()[0])
        other.commit()
    finally:
        other.close()


def test_an_event_blocked_behind_a_row_lock_is_recorded_after_the_release():
    task = TaskFactory()
    (pk,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, timezone.now() - timedelta(seconds=1), 5)], actor="test"
    )
    Execution.objects.filter(pk=pk).update(status=S.RUNNING, lease_owner="w:1:1")
    locked, released = threading.Event(), []
    locker = threading.Thread(target=_locker, args=(pk, locked, released))
    locker.start()
    try:
        assert locked.wait(30)
        # In a transaction that started before the wait, as a worker's outcome may be.
        with transaction.atomic():
            Execution.objects.filter(pk=pk).values_list("id").first()
            won = transitions.execution_succeed(execution_id=pk, attempt=1, worker_id="w:1:1", output="", max_chars=10)
    finally:
        locker.join(30)
    assert won
    event = ExecutionEvent.objects.get(execution_id=pk, to_status=S.SUCCEEDED)
    (released_at,) = released
    assert event.at >= released_at, f"recorded at {event.at}, the lock was released at {released_at}"
