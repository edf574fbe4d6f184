"""Running a task now, outside its schedule (:func:`task_trigger`): the API's and the pages' run
now, a trigger URL (:mod:`tasks_api.hooks`) and ``manage.py tms_task run``. With
``trigger_debounce`` a burst of triggers joins one run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from executions import transitions
from executions.models import Execution, ExecutionOrigin, ExecutionStatus
from executions.notify import notify_due
from tasks_api.task_writes import _audit_task, _lock
from tasks_app.models import AuditAction, Task, TaskStatus
from tasks_app.quotas import quota_charge_executions
from tasks_app.run_config import input_check
from tms_core.clock import db_now
from tms_core.durations import format_duration
from tms_core.errors import ConflictError, GoneError


@dataclass(frozen=True)
class Trigger:
    """What a trigger (run now) did: the run it created, or the debounced run it joined."""

    execution: Execution
    #: True when the task's ``trigger_debounce`` folded this trigger into a run not started yet.
    joined: bool = False
    #: The run waits for the task's ``trigger_debounce`` before it is due (created or joined).
    debounced: bool = False


def task_check_input(*, task: Task, run_input: dict[str, Any] | None) -> None:
    """Raise :class:`InvalidInput` on ``input`` unless ``run_input`` may be given to a run of
    ``task`` (:func:`tasks_app.run_config.input_check`)."""
    input_check(task=task, run_input=run_input)


def task_trigger(*, task: Task, actor: str, run_input: dict[str, Any] | None = None) -> Trigger:
    """Run a task now, once, outside its schedule (whatever its status, unless deleted): a new
    execution due now, given ``run_input`` (checked by :func:`task_check_input`: 400 on
    ``input``). It counts against the hourly execution quota of the task's team
    (:class:`~tms_core.errors.QuotaExceeded` when used up).

    With ``trigger_debounce`` the run is due that long from now instead, and a trigger while a
    run of an earlier trigger is still waiting for its time joins that run: no new execution,
    nothing counted, the join audited. The run keeps its due time (the first trigger's) and takes
    the joining trigger's input: **the last input wins** (a burst of events runs once, on the
    latest). The task's row is locked for the decision, so concurrent triggers join one run.
    """
    task_check_input(task=task, run_input=run_input)
    for _ in range(3):  # a clash with an occurrence at the very same microsecond is retried
        with transaction.atomic():
            if task.trigger_debounce is not None:
                # FOR NO KEY UPDATE: debounced triggers of the task take turns, while the inserts
                # of executions (FOR KEY SHARE of the task, after the team's quota lock, as a
                # backfill takes them) are not blocked: a full lock here, before the quota's,
                # could deadlock with them.
                task = _lock(task.pk, no_key=True)
                waiting = _debounced_run(task)
                if waiting is not None and transitions.execution_join_trigger(
                    execution_id=waiting.pk, run_input=run_input
                ):
                    waiting.input = run_input
                    _audit_task(
                        task, AuditAction.TRIGGER, changes={"execution": waiting.pk}, detail=f"joined {waiting.pk}"
                    )
                    return Trigger(waiting, joined=True, debounced=True)
                # None waiting, or it was taken since it was read: this trigger's run is a new one.
            # Counted (under the team's quota lock) in the transaction that creates it.
            quota_charge_executions(team_id=task.team_id, count=1)
            new_id = transitions.execution_trigger(
                task_id=task.pk,
                actor=actor,
                detail=_trigger_detail(task, actor),
                delay=task.trigger_debounce,
                run_input=run_input,
            )
            if new_id is None:
                transaction.set_rollback(True)  # nothing created: nothing counted
            else:
                _audit_task(task, AuditAction.TRIGGER, changes={"execution": new_id}, detail=f"execution {new_id}")
        if new_id is not None:
            notify_due()
            return Trigger(Execution.objects.get(pk=new_id), debounced=task.trigger_debounce is not None)
        if not Task.objects.filter(pk=task.pk).exclude(status=TaskStatus.DELETED).exists():
            raise GoneError("The task no longer exists.")
    raise ConflictError("Could not trigger the task; try again.")  # pragma: no cover


def trigger_words(trigger: Trigger) -> str:
    """What a trigger did, in words, for the pages, the admin and the commands."""
    execution = trigger.execution
    if trigger.joined:
        return f"joined execution {execution.pk}, the debounced run due {execution.due_at:%Y-%m-%d %H:%M:%S} UTC"
    if trigger.debounced:
        return f"execution {execution.pk} created, due {execution.due_at:%Y-%m-%d %H:%M:%S} UTC (debounced)"
    return f"execution {execution.pk} created, due now"


def _trigger_detail(task: Task, actor: str) -> str:
    if task.trigger_debounce is None:
        return f"triggered by {actor}"
    return f"triggered by {actor}; debounced: due in {format_duration(task.trigger_debounce)}, later triggers join it"


def _debounced_run(task: Task) -> Execution | None:
    """The task's triggered run still waiting for its debounce time to pass (due in the future),
    if any: the run a trigger now joins."""
    waiting = Execution.objects.filter(
        task=task, origin=ExecutionOrigin.TRIGGER, status=ExecutionStatus.SCHEDULED, due_at__gt=db_now()
    )
    return waiting.order_by("due_at", "id").first()
