"""Task operations (writes). Views and admin call these; they hold the business rules."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from rest_framework.exceptions import ValidationError

from executions.clock import db_now
from executions.materialiser import materialise_task
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


def task_create(
    *,
    owner: AbstractBaseUser,
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
    """Create a task and, if its first run falls inside the horizon, its first executions.

    "Run now" therefore does not wait for the materialiser: the execution exists, and the monitor
    is notified, when this returns.
    """
    config = config or {}
    task_validate_runner(runner=runner, config=config)
    start_at = start_at or db_now()
    try:
        schedule = Schedule(start_at=start_at, interval=interval, cron=cron, timezone=timezone, end_at=end_at)
        first = next(schedule.fire_times(), None)
    except ScheduleError as exc:
        raise ValidationError({"schedule": [str(exc)]}) from None
    with transaction.atomic():
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
            **options,
        )
        if first is None:
            task.status = TaskStatus.COMPLETED
        try:
            task.full_clean(exclude=["owner"])
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from None
        task.save()
        if first is not None:
            materialise_task(task_id=task.pk)
    task.refresh_from_db()
    return task
