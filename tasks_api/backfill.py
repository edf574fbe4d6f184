"""Running a task's past fire times that have no execution yet (:func:`task_backfill`), all due now."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from executions import transitions
from executions.materialiser import task_schedule
from executions.models import Execution, ExecutionOrigin
from executions.notify import notify_due
from executions.transitions import executions_create
from tasks_api.task_writes import _audit_task
from tasks_app.models import AuditAction, Task, TaskStatus, claims_exclusive
from tasks_app.quotas import quota_charge_executions
from tasks_app.schedules import walk_limit
from tms_core.clock import db_now, local_words
from tms_core.conf import tms_settings
from tms_core.errors import GoneError, InvalidInput


@dataclass(frozen=True)
class BackfillReport:
    task_id: uuid.UUID
    start: datetime
    end: datetime
    execution_ids: list[int]
    #: Fire times in the range that already had an execution (run, running or waiting).
    existing: int
    #: Fire times the range holds (created + existing): 0 says the schedule has none there.
    fire_times: int = 0
    #: What the backfill did, in words (the range in the task's time zone, to the second).
    detail: str = ""


def task_backfill(*, task: Task, start: datetime, end: datetime, actor: str) -> BackfillReport:
    """Run a task's past fire times in ``[start, end]`` that have no execution yet: one new
    execution each, all due now. They are claimed under the task's overlap policy like any other
    run. At most ``TMS_BACKFILL_MAX`` fire times per call (a wider range is :class:`InvalidInput`);
    ``end`` must not be in the future. Fire times already run, running or waiting are counted in
    ``existing`` and not created again; ``detail`` says what was done, and a range that holds
    no fire time of the task says so ("No fire times between ... and ..."). The executions
    created count against the team's hourly execution quota: all of them fit, or none is
    created (:class:`~tms_core.errors.QuotaExceeded`).
    """
    backfill_max = tms_settings().BACKFILL_MAX
    now = db_now()
    errors: dict[str, list[str]] = {}
    if end < start:
        errors["end"] = ["Must not be before start."]
    if end > now:
        errors["end"] = ["Must not be in the future: backfill covers past fire times."]
    if errors:
        raise InvalidInput(errors)
    if task.status == TaskStatus.DELETED:
        raise GoneError("The task no longer exists.")
    times: list[datetime] = []
    with walk_limit("end", "Fire times up to this time"):
        for when in task_schedule(task).fire_times(since=start):
            if when > end:
                break
            if len(times) == backfill_max:
                raise InvalidInput.on(
                    "end",
                    f"The range holds more than {backfill_max} fire times (TMS_BACKFILL_MAX); "
                    "backfill a shorter range.",
                )
            times.append(when)
    existing = set(
        Execution.objects.filter(task=task, scheduled_for__in=times, superseded=False).values_list(
            "scheduled_for", flat=True
        )
    )
    exclusive = claims_exclusive(
        overlap_policy=task.overlap_policy, max_concurrency=task.max_concurrency, has_limits=task.has_limits
    )
    rows = [
        transitions.NewExecution(task.pk, when, task.priority, due_at=now, exclusive=exclusive)
        for when in times
        if when not in existing
    ]
    with transaction.atomic():
        quota_charge_executions(team_id=task.team_id, count=len(rows), field="end")
        ids = executions_create(
            rows=rows,
            actor=actor,
            detail=f"backfill of {start.isoformat()} to {end.isoformat()}",
            origin=ExecutionOrigin.BACKFILL,
        )
        _audit_task(
            task,
            AuditAction.BACKFILL,
            changes={
                "start": start.isoformat(),
                "end": end.isoformat(),
                "created": len(ids),
                "existing": len(times) - len(ids),
            },
        )
    if ids:
        notify_due()
    between = f"between {local_words(start, task.timezone)} and {local_words(end, task.timezone)}"
    if not times:
        detail = f"No fire times {between}: nothing to backfill."
    else:
        detail = (
            f"{len(times)} fire time(s) {between}: {len(ids)} execution(s) created, due now; "
            f"{len(times) - len(ids)} already had one."
        )
    return BackfillReport(task.pk, start, end, ids, len(times) - len(ids), len(times), detail)
