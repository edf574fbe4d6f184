"""Task operations (writes). Views and admin call these; they hold the business rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from rest_framework.exceptions import ValidationError

from executions.clock import db_now
from executions.conf import tms_settings
from executions.materialiser import ACTOR as MATERIALISER
from executions.materialiser import plan_task
from executions.notify import notify_due
from executions.transitions import executions_create
from runners.registry import UnknownRunner, get_runner, runner_aliases
from tasks_app.models import Task, TaskStatus
from tasks_app.schedules import Schedule, ScheduleError


def task_validate_runner(*, runner: str, config: Any) -> dict[str, Any]:
    """Return the runner's normalised config, or raise per-field ValidationError."""
    try:
        backend = get_runner(runner)
    except UnknownRunner:
        raise ValidationError(
            {"runner": [f"Unknown runner {runner!r}; choose one of: {', '.join(runner_aliases())}."]}
        ) from None
    try:
        backend.validate_config(config)
    except ValidationError as exc:
        raise ValidationError({"config": exc.detail}) from None
    return config


def _build_task(
    *,
    owner: AbstractBaseUser,
    now: datetime,
    runner: str,
    config: dict[str, Any] | None = None,
    name: str = "",
    start_at: datetime | None = None,
    interval: timedelta | None = None,
    cron: str = "",
    timezone: str = "UTC",
    end_at: datetime | None = None,
    **options: Any,
) -> Task:
    """A validated, unsaved Task whose cursor points at its first fire time."""
    config = config or {}
    task_validate_runner(runner=runner, config=config)
    start_at = start_at or now
    try:
        schedule = Schedule(start_at=start_at, interval=interval, cron=cron, timezone=timezone, end_at=end_at)
        first = next(schedule.fire_times(), None)
    except ScheduleError as exc:
        raise ValidationError({"schedule": [str(exc)]}) from None
    task = Task(
        owner=owner,
        name=name,
        runner=runner,
        config=config,
        start_at=start_at,
        interval=interval,
        cron=cron,
        timezone=timezone,
        end_at=end_at,
        next_run_at=first,
        status=TaskStatus.ACTIVE if first is not None else TaskStatus.COMPLETED,
        **options,
    )
    try:
        # Field checks only: the serializer validated the rest and the database's constraints
        # back it up (validating constraints here would cost a query each).
        task.full_clean(exclude=["owner"], validate_unique=False, validate_constraints=False)
    except DjangoValidationError as exc:
        raise ValidationError(exc.message_dict) from None
    return task


def task_create(*, owner: AbstractBaseUser, runner: str, **fields: Any) -> Task:
    """Create a task and, if its first run falls inside the horizon, its first executions.

    "Run now" therefore does not wait for the materialiser: the execution exists, and the monitor
    is notified, when this returns.
    """
    (task,) = task_bulk_create(owner=owner, specs=[{"runner": runner, **fields}])
    return task


def task_bulk_create(*, owner: AbstractBaseUser, specs: Sequence[Mapping[str, Any]]) -> list[Task]:
    """Create many tasks in one transaction, with their executions inside the horizon.

    Every spec is validated before anything is written: one bad spec fails the whole call with
    its errors keyed by position (``{"3": {"interval": [...]}}``) and writes nothing.
    """
    now = db_now()
    until = now + timedelta(seconds=tms_settings().MATERIALISE_HORIZON)
    tasks, errors = [], {}
    for index, spec in enumerate(specs):
        try:
            tasks.append(_build_task(owner=owner, now=now, **spec))
        except ValidationError as exc:
            errors[str(index)] = exc.detail
    if errors:
        raise ValidationError(errors if len(specs) > 1 else next(iter(errors.values())))
    rows = []
    for task in tasks:
        plan = plan_task(task, now=now, until=until)
        rows += plan.rows
        task.next_run_at, task.runs_materialised = plan.next_run_at, plan.runs
        if plan.next_run_at is None:
            task.status = TaskStatus.COMPLETED
    with transaction.atomic():
        Task.objects.bulk_create(tasks, batch_size=1000)
        if rows:
            executions_create(rows=rows, actor=MATERIALISER)
            notify_due()
    return tasks
