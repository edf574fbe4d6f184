"""What a task is doing, as people read it, and when it runs next, computed in the database.

``Task.status`` is the scheduling lifecycle: ACTIVE while the materialiser has occurrences left to
create, COMPLETED once it has created the last one, PAUSED, DELETED. A one-shot task is therefore
COMPLETED as soon as its only execution exists, before it has run, and stays COMPLETED when that
run fails. :class:`TaskState` says what users ask ("has it run? did it work?"), and ``next_run``
is the next time something of the task is due, where ``Task.next_run_at`` is the materialisation
cursor (the next fire time not yet turned into an execution).

Both come from :func:`with_state`, a handful of correlated subqueries that each read one row
through the ``(task, -scheduled_for)`` index, so a page of tasks costs one query, not one per task.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from typing import TYPE_CHECKING, TypedDict, cast
from zoneinfo import ZoneInfo

from django.db import models
from django.db.models import Case, F, OuterRef, Q, QuerySet, Subquery, When
from django.db.models.functions import Coalesce, Least, Now
from django.utils import timezone

from executions.materialiser import task_calendar, task_schedule
from executions.models import Execution, ExecutionStatus
from tasks_app.calendars import MAX_CLOSED_RUN, calendar_place
from tasks_app.models import CalendarPolicy, Task, TaskStatus
from tasks_app.schedules import ScheduleError

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class TaskState(models.TextChoices):
    SCHEDULED = "scheduled"  #: waiting for its next run
    RUNNING = "running"  #: its latest due run is running
    SUCCEEDED = "succeeded"  #: one-shot: its run succeeded
    FAILED = "failed"  #: one-shot: its run failed for good (retries exhausted)
    CANCELLED = "cancelled"  #: one-shot: its run was cancelled
    COMPLETED = "completed"  #: recurring: its schedule has ended (end_at or max_runs) and nothing is left to run
    PAUSED = "paused"  #: paused: nothing new runs until it is resumed
    DELETED = "deleted"  #: deleted; its history is kept


_WAITING = (ExecutionStatus.SCHEDULED, ExecutionStatus.PENDING)
_OUTCOME = {
    ExecutionStatus.SUCCEEDED: TaskState.SUCCEEDED,
    ExecutionStatus.FAILED: TaskState.FAILED,
    ExecutionStatus.CANCELLED: TaskState.CANCELLED,
}


class StateColumns(TypedDict):
    """The columns :func:`with_state` adds to each task."""

    latest_status: str | None
    latest_due_status: str | None
    next_run: datetime | None
    #: The database's time of the read: a run due before it and not started yet is due now.
    read_at: datetime


def with_state(queryset: QuerySet[Task]) -> QuerySet[WithAnnotations[Task, StateColumns]]:
    """Annotate tasks with ``latest_status`` (their latest execution's status), ``latest_due_status``
    (the latest one due by now) and ``next_run`` (when something of theirs is next due: the
    earliest SCHEDULED execution's due time, else the cursor; null when paused, deleted or done).
    Read them through :func:`task_state` and :func:`task_next_run`."""
    mine = Execution.objects.filter(task=OuterRef("pk"), superseded=False).order_by("-scheduled_for", "-id")
    next_due = (
        Execution.objects.filter(task=OuterRef("pk"), status=ExecutionStatus.SCHEDULED)
        .order_by("due_at")
        .values("due_at")[:1]
    )
    return queryset.annotate(
        latest_status=Subquery(mine.values("status")[:1]),
        latest_due_status=Subquery(mine.filter(scheduled_for__lte=Now()).values("status")[:1]),
        next_run=Case(
            When(Q(status__in=(TaskStatus.PAUSED, TaskStatus.DELETED)), then=None),
            default=Coalesce(Least(Subquery(next_due), F("next_run_at")), Subquery(next_due), F("next_run_at")),
        ),
        read_at=Now(),
    )


def _annotated(task: Task) -> WithAnnotations[Task, StateColumns]:
    if not hasattr(task, "latest_status"):
        columns = ("latest_status", "latest_due_status", "next_run", "read_at")
        fresh = with_state(Task.objects.filter(pk=task.pk)).values(*columns)
        row = fresh.first() or {"latest_status": None, "latest_due_status": None, "next_run": None, "read_at": None}
        for name, value in row.items():
            setattr(task, name, value)
    # Either it came from with_state or the loop above set the same columns: the type cannot follow hasattr.
    return cast("WithAnnotations[Task, StateColumns]", task)


def task_state(task: Task) -> TaskState:
    """The task's :class:`TaskState` (one query unless ``task`` came from :func:`with_state`)."""
    if task.status == TaskStatus.DELETED:
        return TaskState.DELETED
    if task.status == TaskStatus.PAUSED:
        return TaskState.PAUSED
    task = _annotated(task)
    latest, latest_due = task.latest_status, task.latest_due_status
    if ExecutionStatus.RUNNING in (latest, latest_due):
        return TaskState.RUNNING
    if task.interval is not None or task.cron:
        return TaskState.SCHEDULED if task.status == TaskStatus.ACTIVE or latest in _WAITING else TaskState.COMPLETED
    # One-shot: its latest execution (the run, or a retry or trigger of it) says how it went.
    if latest is None or latest in _WAITING:
        return TaskState.SCHEDULED if latest is not None or task.status == TaskStatus.ACTIVE else TaskState.COMPLETED
    return _OUTCOME[ExecutionStatus(latest)]


def task_next_run(task: Task) -> datetime | None:
    """When something of the task is next due (a datetime), or None.

    A task on a business calendar runs its next fire time where the calendar puts it (moved to
    another day, or not at all), so its next run is read through the calendar: the annotation's
    cursor is a fire time, not yet placed (a screenshot showed "Next run: today 01:32" for a
    task whose runs today all move to Monday).

    A run whose due time has passed and that has not started yet (the catch-up run a resume
    creates, a run waiting for a worker or held back by a limit) is due now: its next run is the
    time of the read, never a time already past ("Next run" right after a resume showed the
    missed fire time the misfire policy ran).
    """
    annotated = _annotated(task)
    when = annotated.next_run
    if not (when is None or task.calendar_id is None or task.next_run_at is None or when < task.next_run_at):
        when = _placed_next_run(task)
    read_at = getattr(annotated, "read_at", None)
    if when is not None and read_at is not None and when < read_at:
        return read_at
    return when


#: Local days with fire times read, at most, to find a calendar task's next run (a year and more:
#: a yearly task whose day is always closed is found to have none).
_PLACE_DAYS = 400
#: Jumps within one day towards its first fire time placed at or after now (one is enough but
#: where a DST change lies between a fire time and its placement).
_PLACE_JUMPS = 4


def _placed_next_run(task: Task) -> datetime | None:
    """The earliest of the task's next SCHEDULED execution and its coming fire times as its
    calendar places them.

    Walked a local day at a time, not a fire time at a time (an every-minute task with a closed
    week ahead was 2,000 placements, 0.1-0.2 s per task on the task list): the fire times of one
    local day are all placed on one day (the day itself when it is open, one business day when
    it is closed) in their own order, at a fixed offset from their fire time, so the day's best is
    its first fire time placed at or after now, found by a jump, and the rest of the day is
    skipped. A day's placement can only be beaten by one at most
    :data:`~tasks_app.calendars.MAX_CLOSED_RUN` days (plus the day itself) later, which
    ``previous_business_day`` moves back: the walk stops there."""
    rules = task_calendar(task)
    scheduled = (
        Execution.objects.filter(task=task, status=ExecutionStatus.SCHEDULED)
        .order_by("due_at")
        .values("due_at")
        .first()
    )
    best = scheduled["due_at"] if scheduled else None
    if rules is None:
        return best or task.next_run_at
    now = timezone.now()
    reach = (
        timedelta(days=MAX_CLOSED_RUN + 1)
        if task.calendar_policy == CalendarPolicy.PREVIOUS_BUSINESS_DAY
        else timedelta()
    )
    schedule, zone = task_schedule(task), ZoneInfo(task.timezone)

    def first(since: datetime | None) -> datetime | None:
        return next(iter(schedule.fire_times(since)), None)

    def place(fire: datetime) -> datetime | None:
        return calendar_place(
            rules, task.calendar_policy, fire, timezone=task.timezone, dst_gap=task.dst_gap, dst_fold=task.dst_fold
        ).run_at

    since = task.next_run_at
    try:
        for _ in range(_PLACE_DAYS):
            fire = first(since)
            if fire is None or (best is not None and fire - reach > best):
                break
            day = fire.astimezone(zone).date()
            placed, probe = place(fire), fire
            for _ in range(_PLACE_JUMPS):
                if placed is None or placed >= now:
                    break
                # Placed before now: the day's fire time placed at now lies as far after it.
                later = first(probe + (now - placed))
                if later is None or later.astimezone(zone).date() != day:
                    placed = None
                else:
                    placed, probe = place(later), later
            if placed is not None and placed >= now and (best is None or placed < best):
                best = placed
            since = datetime.combine(day + timedelta(days=1), time.min, tzinfo=zone)
    except ScheduleError:
        pass  # a cron walk too long: what is found so far
    return best
