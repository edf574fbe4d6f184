"""Named events (:func:`event_post`): ``POST /api/v1/events/{name}`` records an event in each of
the caller's teams, starts a run of every active task of those teams subscribed to its name
(``Task.on_events``), debounced by a key of the payload where the subscription asks, and nudges the
wait-for-event steps (``wait_event`` runner) waiting for it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from executions import transitions
from executions.models import EventRun, Execution, ReceivedEvent
from executions.notify import notify_due
from tasks_api.task_writes import _audit_task, _lock
from tasks_api.triggers import task_check_input, task_trigger
from tasks_app.event_subscriptions import Subscription, event_name_check, subscription_of
from tasks_app.models import AuditAction, Task, TaskStatus
from tasks_app.quotas import quota_charge_executions
from tasks_app.run_input import check_input
from tms_core.durations import format_duration
from tms_core.errors import DomainError, InvalidInput
from tms_core.json_paths import MISSING, json_path_get


class EventOutcome:
    CREATED = "created"  #: a run of the task was created
    JOINED = "joined"  #: the event joined a debounced run still waiting (its due time moved on)
    REFUSED = "refused"  #: the task refused the payload (its input_schema), or its quota is used up


@dataclass(frozen=True)
class TaskOutcome:
    """What an event did for one subscribed task."""

    task: Task
    outcome: str
    execution_id: int | None = None
    due_at: Any = None
    errors: Any = None


@dataclass(frozen=True)
class EventPosted:
    """What :func:`event_post` did: the events recorded (one per team), each subscribed task's
    outcome, and how many wait-for-event runs were nudged."""

    name: str
    event_ids: list[int]
    tasks: list[TaskOutcome] = field(default_factory=list)
    nudged: int = 0


def subscribed_tasks(*, team_ids: Iterable[int], name: str) -> list[Task]:
    """The ACTIVE tasks of these teams subscribed to ``name``, oldest first."""
    return list(
        Task.objects.filter(team_id__in=list(team_ids), status=TaskStatus.ACTIVE, on_events__contains=[{"name": name}])
        # Said again for the planner: the subscribers' index holds only tasks that subscribe (task_on_events_idx).
        .exclude(on_events=[])
        .order_by("created_at", "id")
    )


def event_post(
    *, team_ids: Iterable[int], name: str, payload: dict[str, Any], actor: str, key: str = ""
) -> EventPosted:
    """Record the event ``name`` with ``payload`` in each of ``team_ids`` and start a run of every
    ACTIVE task of those teams subscribed to it, the payload as the run's input, in one transaction.

    A task that refuses the payload (its ``input_schema``, its ``input_fills``) or whose team's
    hourly quota is used up gets no run: its outcome says why, and the other tasks still start.
    A subscription with a ``debounce`` joins the run an earlier event of the same key started
    while it still waits (:func:`transitions.execution_debounce_event`). Raises
    :class:`InvalidInput` on ``name`` or ``payload`` when they are not an event's."""
    try:
        event_name_check(name)
    except Exception as exc:  # noqa: BLE001 - a DRF ValidationError: its message per field
        raise InvalidInput({"name": [str(getattr(exc, "detail", [exc])[0])]}) from None
    try:
        check_input(payload, None)
    except InvalidInput as exc:
        raise InvalidInput({"payload": exc.errors.get("input", ["Not an event payload."])}) from None
    teams = sorted(set(team_ids))
    outcomes: list[TaskOutcome] = []
    with transaction.atomic():
        events = {
            team_id: ReceivedEvent.objects.create(name=name, team_id=team_id, payload=payload, key=key, actor=actor)
            for team_id in teams
        }
        for task in subscribed_tasks(team_ids=teams, name=name):
            subscription = subscription_of(task.on_events, name) or Subscription(name=name)
            outcome = _start(task, subscription, payload, actor=f"{actor} (event {name})")
            outcomes.append(outcome)
            if outcome.execution_id is not None:
                EventRun.objects.create(
                    event=events[task.team_id],
                    task=task,
                    execution_id=outcome.execution_id,
                    debounce_key=_debounce_key(subscription, payload),
                )
        nudged = transitions.executions_nudge_event_waits(team_ids=teams, name=name)
        if nudged:
            notify_due()
    return EventPosted(name=name, event_ids=[event.pk for event in events.values()], tasks=outcomes, nudged=nudged)


def _start(task: Task, subscription: Subscription, payload: dict[str, Any], *, actor: str) -> TaskOutcome:
    try:
        task_check_input(task=task, run_input=payload)
        with transaction.atomic():  # a savepoint: a refused task leaves the others' runs
            if subscription.debounce is None:
                trigger = task_trigger(task=task, actor=actor, run_input=payload)
                execution = trigger.execution
                outcome = EventOutcome.JOINED if trigger.joined else EventOutcome.CREATED
                return TaskOutcome(task, outcome, execution.pk, execution.due_at)
            return _debounced(task, subscription, payload, actor=actor)
    except InvalidInput as exc:
        return TaskOutcome(task, EventOutcome.REFUSED, errors=exc.errors)
    except DomainError as exc:  # the quota, a task deleted meanwhile
        return TaskOutcome(task, EventOutcome.REFUSED, errors={"non_field_errors": [exc.message]})


def _debounced(task: Task, subscription: Subscription, payload: dict[str, Any], *, actor: str) -> TaskOutcome:
    """A debounced subscription's event: join the run an earlier event of the same key started
    while it still waits (moving its due time to now + window, within the maximum wait), or
    start a run due a window from now. The task's row is locked for the decision, as
    :func:`task_trigger` does, so concurrent events of one key make one run."""
    assert subscription.debounce is not None
    task = _lock(task.pk, no_key=True)
    key = _debounce_key(subscription, payload)
    waiting = (
        EventRun.objects.filter(task=task, debounce_key=key)
        .order_by("-execution_id")
        .values_list("execution_id", flat=True)
        .first()
    )
    if waiting is not None and transitions.execution_debounce_event(
        execution_id=waiting, run_input=payload, window=subscription.debounce, max_wait=subscription.debounce_max_wait
    ):
        _audit_task(
            task,
            AuditAction.TRIGGER,
            changes={"execution": waiting},
            detail=f"event {subscription.name} joined {waiting}",
        )
        due_at = Execution.objects.filter(pk=waiting).values_list("due_at", flat=True).first()
        return TaskOutcome(task, EventOutcome.JOINED, waiting, due_at)
    # None waiting, or the monitor took it: this event's run starts a new window.
    quota_charge_executions(team_id=task.team_id, count=1)
    new_id = transitions.execution_trigger(
        task_id=task.pk,
        actor=actor,
        detail=f"event {subscription.name}; debounced: due in {format_duration(subscription.debounce)}, "
        "later events of its key move it on",
        delay=subscription.debounce,
        run_input=payload,
    )
    if new_id is None:
        raise DomainError("The task could not be started; try again.")
    _audit_task(
        task,
        AuditAction.TRIGGER,
        changes={"execution": new_id},
        detail=f"event {subscription.name}: execution {new_id}",
    )
    notify_due()
    due_at = Execution.objects.filter(pk=new_id).values_list("due_at", flat=True).first()
    return TaskOutcome(task, EventOutcome.CREATED, new_id, due_at)


def _debounce_key(subscription: Subscription, payload: dict[str, Any]) -> str:
    """The debounce key of ``payload`` for ``subscription`` as JSON text: '' without a debounce or
    a ``debounce_key`` (every event of the name together), ``null`` when the payload lacks it."""
    if subscription.debounce is None or not subscription.debounce_key:
        return ""
    value = json_path_get(payload, subscription.debounce_key)
    return json.dumps(None if value is MISSING else value, sort_keys=True, separators=(",", ":"))[:500]
