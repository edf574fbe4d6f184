"""An execution always has its task, without a foreign-key constraint (migration 0016): every
insert reads and locks the task's row, and a deferred trigger refuses to delete a task that still
has executions, as the constraint did."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.utils import timezone

from executions import transitions
from executions.materialiser import materialise_task
from executions.models import Execution, ExecutionEvent, ExecutionStatus
from tasks_app.models import Task
from tests.factories import ExecutionFactory, TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _constraint_names() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'executions_execution'::regclass AND contype = 'f'"
        )
        return {name for (name,) in cursor.fetchall()}


def test_the_execution_table_has_no_foreign_key_to_tasks():
    assert not any("task_id" in name for name in _constraint_names())


def test_deleting_a_task_that_has_executions_fails_at_commit_and_changes_nothing():
    execution = ExecutionFactory()
    with (
        pytest.raises(IntegrityError, match="task still has executions"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("DELETE FROM tasks_app_task WHERE id = %s", [execution.task_id])
    assert Task.objects.filter(pk=execution.task_id).exists()
    assert Execution.objects.filter(pk=execution.pk).exists()


def test_deleting_a_task_through_django_deletes_its_executions_and_their_events():
    execution = ExecutionFactory()
    assert ExecutionEvent.objects.filter(execution_id=execution.pk).exists()
    Task.objects.filter(pk=execution.task_id).delete()
    assert not Execution.objects.filter(pk=execution.pk).exists()
    assert not ExecutionEvent.objects.filter(execution_id=execution.pk).exists()


@pytest.mark.parametrize("create", ["rows", "trigger"])
def test_no_execution_of_a_missing_task_can_be_inserted(create):
    missing = uuid.uuid4()
    if create == "rows":
        with pytest.raises(IntegrityError):
            transitions.executions_create(rows=[transitions.NewExecution(missing, timezone.now(), 5)], actor="test")
    else:
        assert transitions.execution_trigger(task_id=missing, actor="test") is None
    assert not Execution.objects.filter(task_id=missing).exists()


def test_a_task_deleted_while_a_materialiser_batch_holds_it_is_refused_not_orphaned():
    """The race the constraint's check covered: a materialiser batch has the task locked and is
    writing its executions while Django deletes the task (its executions collected before the
    batch commits). The delete waits for the batch, then fails at commit; nothing is orphaned."""
    task = TaskFactory(start_at=timezone.now() + timedelta(seconds=30), interval=timedelta(seconds=60))
    locked = threading.Event()
    outcome: dict[str, object] = {}

    def batch() -> None:
        try:
            with transaction.atomic():
                Task.objects.select_for_update().get(pk=task.pk)
                locked.set()
                time.sleep(0.5)  # the delete below has collected (no executions) and waits on the row
                outcome["created"] = len(materialise_task(task_id=task.pk))
        finally:
            close_old_connections()
            connection.close()

    writer = threading.Thread(target=batch)
    writer.start()
    assert locked.wait(10)
    try:
        Task.objects.filter(pk=task.pk).delete()
    except IntegrityError as error:
        outcome["delete"] = str(error)
    writer.join(10)
    assert outcome["created"] and "task still has executions" in str(outcome.get("delete"))
    assert Task.objects.filter(pk=task.pk).exists()
    runs = Execution.objects.filter(task_id=task.pk)
    assert runs.count() == outcome["created"]
    assert set(runs.values_list("status", flat=True)) == {ExecutionStatus.SCHEDULED}
