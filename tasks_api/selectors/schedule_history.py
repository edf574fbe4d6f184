"""Which schedule a task had at each instant: the past is judged by the schedule in force then.

A task's versions (:class:`~tasks_app.models.TaskVersion`, written in the transaction of each
create and change) hold its schedule settings as they were from that change on. The occurrence
timeline and "why" ask, for an instant, which fire times it had under the schedule in force at
that instant, so a cron changed from ``*/2`` to ``*/3`` at 05:40 does not make 05:33 a missing
fire time, nor leave the old schedule's 05:32 unexplained.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils.dateparse import parse_datetime

from executions.materialiser import task_schedule
from tasks_api.selectors.previews import occurrence_at_or_before
from tasks_app.models import Task, TaskVersion
from tasks_app.schedules import Schedule, ScheduleError

#: The settings a schedule is built of (:func:`executions.materialiser.task_schedule`).
SCHEDULE_FIELDS = ("start_at", "interval", "cron", "timezone", "end_at", "dst_gap", "dst_fold")


@dataclass(frozen=True)
class SchedulePeriod:
    """``schedule`` was in force from ``since`` (None: from the task's creation) until just
    before ``until`` (None: it still is); ``version``: the task version that set it."""

    since: datetime | None
    until: datetime | None
    schedule: Schedule
    version: int | None

    def holds(self, when: datetime) -> bool:
        return (self.since is None or when >= self.since) and (self.until is None or when < self.until)


def _time(value: object) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) and value else None


def _schedule_of(values: dict[str, object]) -> Schedule | None:
    """The schedule a version's snapshot holds (None: it holds no valid one)."""
    start_at = _time(values.get("start_at"))
    if start_at is None:
        return None
    interval = values.get("interval")
    try:
        return Schedule(
            start_at=start_at,
            interval=timedelta(seconds=float(interval)) if isinstance(interval, int | float | str) else None,
            cron=str(values.get("cron") or ""),
            timezone=str(values.get("timezone") or "UTC"),
            end_at=_time(values.get("end_at")),
            dst_gap=str(values.get("dst_gap") or ""),
            dst_fold=str(values.get("dst_fold") or ""),
        )
    except (ScheduleError, ValueError, TypeError):
        return None


def schedule_periods(task: Task) -> list[SchedulePeriod]:
    """The task's schedules in time order, each with when it came into force (the time of the
    version that set it) and when the next one replaced it; the last is the task's current
    schedule. Versions that kept the schedule are merged into the period before them. One query
    (the versions' schedule settings only), none for a task never changed."""
    current = task_schedule(task)
    if task.version <= 1:
        return [SchedulePeriod(None, None, current, task.version)]
    rows = (
        TaskVersion.objects.filter(task=task)
        .order_by("number")
        .values_list("number", "created_at", *(f"snapshot__{name}" for name in SCHEDULE_FIELDS))
    )
    periods: list[SchedulePeriod] = []
    for number, created_at, *values in rows:
        schedule = _schedule_of(dict(zip(SCHEDULE_FIELDS, values, strict=True)))
        if schedule is None or (periods and periods[-1].schedule == schedule):
            continue
        if periods:
            last = periods[-1]
            periods[-1] = SchedulePeriod(last.since, created_at, last.schedule, last.version)
        periods.append(SchedulePeriod(None if not periods else created_at, None, schedule, number))
    if not periods or periods[-1].schedule != current:
        # No versions (a task from before them), or a change not versioned: the task's own.
        since = periods[-1].since if periods else None
        periods = [*periods[:-1], SchedulePeriod(since, None, current, task.version)]
    return periods


def fire_times_between(periods: list[SchedulePeriod], start: datetime, end: datetime) -> Iterator[datetime]:
    """The fire times in ``[start, end)``, in time order, each of the schedule in force at it."""
    for period in periods:
        if period.until is not None and period.until <= start:
            continue
        if period.since is not None and period.since >= end:
            break
        since = start if period.since is None else max(start, period.since)
        stop = end if period.until is None else min(end, period.until)
        for when in period.schedule.fire_times(since=since):
            if when >= stop:
                break
            yield when


def period_at(periods: list[SchedulePeriod], when: datetime) -> SchedulePeriod:
    """The period in force at ``when`` (the first one for an instant before every change)."""
    return next((period for period in periods if period.holds(when)), periods[0])


def fire_time_at_or_before(periods: list[SchedulePeriod], at: datetime) -> tuple[datetime, SchedulePeriod] | None:
    """The latest instant at or before ``at`` that was a fire time of the schedule in force at
    it, and that schedule's period; None when there is none."""
    for period in reversed(periods):
        if period.since is not None and period.since > at:
            continue
        limit = at if period.until is None else min(at, period.until - timedelta(microseconds=1))
        found = occurrence_at_or_before(period.schedule, limit)
        if found is not None and (period.since is None or found >= period.since):
            return found, period
    return None
