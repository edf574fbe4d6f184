"""Turns tasks' upcoming occurrences into executions, idempotently.

A pass locks a batch of due tasks with ``FOR UPDATE SKIP LOCKED`` (so several materialisers
share the work instead of repeating it), inserts their occurrences up to the horizon with
``ON CONFLICT DO NOTHING`` on (task, scheduled_for), and advances each task's cursor
(``next_run_at``) in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from executions import transitions
from executions.clock import db_now
from executions.conf import tms_settings
from executions.notify import notify_due
from tasks_app.models import MisfirePolicy, Task, TaskStatus
from tasks_app.schedules import Schedule, jitter_for

logger = logging.getLogger(__name__)

ACTOR = "materialiser"
#: An occurrence more than this late when materialised is a misfire, handled per the task's policy.
MISFIRE_GRACE = timedelta(seconds=60)
#: The most catch-up runs ``run_all`` creates in one pass.
RUN_ALL_LIMIT = 100


def task_schedule(task: Task) -> Schedule:
    return Schedule(
        start_at=task.start_at, interval=task.interval, cron=task.cron, timezone=task.timezone, end_at=task.end_at
    )


@dataclass
class Plan:
    rows: list[transitions.NewExecution]
    next_run_at: datetime | None
    runs: int


#: How many missed occurrences each misfire policy keeps (the latest ones).
_MISFIRE_KEEP = {MisfirePolicy.SKIP: 0, MisfirePolicy.RUN_ONCE: 1, MisfirePolicy.RUN_ALL: RUN_ALL_LIMIT}


def catch_up_since(schedule: Schedule, cursor: datetime, *, missed_before: datetime, keep: int) -> datetime:
    """Where a walk over a schedule's occurrences from ``cursor`` can start and still meet the
    latest ``keep`` occurrences before ``missed_before`` (the misfire policy drops older ones).

    A cursor far in the past (a start_at years ago, a long pause or outage) would otherwise mean
    walking every occurrence since, one by one: billions for a sub-second interval. The window
    before ``missed_before`` doubles until it holds ``keep`` occurrences, each probe counting at
    most ``keep`` of them.
    """
    if cursor >= missed_before:
        return cursor
    if keep <= 0:
        return missed_before
    span = timedelta(seconds=1)
    while span < missed_before - cursor:
        since = missed_before - span
        met = 0
        for when in schedule.fire_times(since=since):
            if when >= missed_before or met >= keep:
                break
            met += 1
        if met >= keep:
            return since
        span *= 2
    return cursor


def plan_task(task: Task, *, now: datetime, until: datetime) -> Plan:
    """The executions to create for ``task`` up to ``until``, and where its cursor moves."""
    if task.next_run_at is None:
        return Plan([], None, task.runs_materialised)
    schedule = task_schedule(task)
    since = catch_up_since(
        schedule, task.next_run_at, missed_before=now - MISFIRE_GRACE, keep=_MISFIRE_KEEP[task.misfire_policy]
    )
    fire_times: Iterator[datetime] = schedule.fire_times(since=since)
    remaining = None if task.max_runs is None else max(0, task.max_runs - task.runs_materialised)
    missed: list[datetime] = []
    due: list[datetime] = []
    nxt: datetime | None = None
    for when in fire_times:
        if when > until or (remaining is not None and len(missed) + len(due) >= remaining):
            nxt = when
            break
        (missed if when < now - MISFIRE_GRACE else due).append(when)
        if len(missed) > RUN_ALL_LIMIT * 10:  # a long outage: drop the oldest misses as we go
            missed = missed[-RUN_ALL_LIMIT:]
    if missed:
        if task.misfire_policy == MisfirePolicy.SKIP:
            missed = []
        elif task.misfire_policy == MisfirePolicy.RUN_ONCE:
            missed = missed[-1:]
        else:
            missed = missed[-RUN_ALL_LIMIT:]
    if remaining is not None and len(missed) + len(due) >= remaining:
        nxt = None
    times = missed + due
    rows = [
        transitions.NewExecution(
            task_id=task.pk,
            scheduled_for=when,
            priority=task.priority,
            # Deterministic per occurrence: materialising it again gives the same due time.
            due_at=when + jitter_for(key=f"{task.pk}:{when.isoformat()}", max_jitter=task.jitter)
            if task.jitter
            else None,
        )
        for when in times
    ]
    return Plan(rows, nxt, task.runs_materialised + len(rows))


def _apply(tasks: list[Task], *, now: datetime, until: datetime) -> list[int]:
    plans = {task.pk: plan_task(task, now=now, until=until) for task in tasks}
    ids = transitions.executions_create(rows=[row for p in plans.values() for row in p.rows], actor=ACTOR)
    for task in tasks:
        plan = plans[task.pk]
        task.next_run_at = plan.next_run_at
        task.runs_materialised = plan.runs
        if plan.next_run_at is None:
            task.status = TaskStatus.COMPLETED
    Task.objects.bulk_update(tasks, ["next_run_at", "runs_materialised", "status"])
    if ids:
        notify_due()
    return ids


def materialise_task(*, task_id: object, until: datetime | None = None) -> list[int]:
    """Materialise one task's occurrences up to ``until`` (default: the horizon); return new ids.

    Locks the task row, so it is safe beside a running materialiser pass.
    """
    now = db_now()
    until = until or now + timedelta(seconds=tms_settings().MATERIALISE_HORIZON)
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id, status=TaskStatus.ACTIVE).first()
        if task is None:
            return []
        return _apply([task], now=now, until=until)


def materialise_due(*, horizon: float | None = None, batch: int | None = None) -> int:
    """One materialiser pass over every active task due within the horizon; returns executions created."""
    conf = tms_settings()
    horizon = conf.MATERIALISE_HORIZON if horizon is None else horizon
    batch = batch or conf.MATERIALISE_BATCH
    created = 0
    now = db_now()
    until = now + timedelta(seconds=horizon)
    while True:
        with transaction.atomic():
            tasks = list(
                Task.objects.select_for_update(skip_locked=True)
                .filter(status=TaskStatus.ACTIVE, next_run_at__isnull=False, next_run_at__lte=until)
                .order_by("next_run_at")[:batch]
            )
            if not tasks:
                break
            created += len(_apply(tasks, now=now, until=until))
        if len(tasks) < batch:
            break
    if created:
        logger.info("materialised %d executions", created)
    return created
