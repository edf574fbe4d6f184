"""A task's occurrence timeline over a window: every fire time, execution and skipped
occurrence in it, each saying what became of it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from itertools import islice, takewhile
from uuid import UUID
from zoneinfo import ZoneInfo

from django.db import models
from django.db.models import Q, Subquery

from executions.materialiser import task_schedule
from executions.models import OCCURRENCE_ORIGINS, Execution, ExecutionStatus, SkippedOccurrence, SkipReason
from tasks_api.selectors.fate import Fate, OccurrenceFate, is_summary, occurrence_fate, recorded_by_materialiser
from tasks_api.selectors.previews import task_last_fire_time
from tasks_api.selectors.schedule_history import SchedulePeriod, fire_times_between, schedule_periods
from tasks_app.models import Task
from tasks_app.schedules import Schedule, walk_limit
from tms_core.clock import db_now, local_words
from tms_core.errors import InvalidInput

#: The most fire times one window may hold.
OCCURRENCES_MAX = 1000
#: The most executions, and the most skipped occurrences, one window may hold.
OCCURRENCE_RECORDS_MAX = 2000
#: The longest window.
OCCURRENCES_MAX_SPAN = timedelta(days=366)
#: The default window's length: around now, or from ``from`` on, or up to ``to``.
OCCURRENCES_DEFAULT_SPAN = timedelta(days=2)
#: A default window is never narrowed below this (no schedule fires 1000 times in it).
_MIN_DEFAULT_SPAN = timedelta(seconds=1)
#: Execution columns the timeline reads (output, handles and leases are not loaded).
_EXECUTION_COLUMNS = (
    "id",
    "scheduled_for",
    "status",
    "waiting",
    "attempt",
    "origin",
    "superseded",
    "moved_from",
    "retry_of_id",
    "due_at",
    "started_at",
    "finished_at",
    "error",
)


class OccurrenceState(models.TextChoices):
    EXECUTED = "executed"  #: its execution started, or ended (SUCCEEDED, FAILED, CANCELLED)
    SCHEDULED = "scheduled"  #: its execution waits (SCHEDULED or PENDING, a retry's wait included)
    SKIPPED = "skipped"  #: it did not run, for a recorded reason (or a pause still in force)
    UPCOMING = "upcoming"  #: not materialised yet: in the future, or the scheduler has not reached it
    SUPERSEDED = "superseded"  #: its execution was replaced before it started (schedule change, pause)
    MISSING = "missing"  #: past, behind the scheduler, with no execution and no recorded reason


@dataclass(frozen=True)
class OccurrenceSkip:
    reason: str
    detail: str
    #: False: not recorded (yet): the task is paused; its misfire policy decides at the resume.
    recorded: bool
    #: The row is a summary standing for many fire times that are not listed one by one.
    summary: bool = False
    #: The row's own time (a summary's, for the fire times it stands for) and when it was written.
    row_scheduled_for: datetime | None = None
    recorded_at: datetime | None = None

    @classmethod
    def of(cls, row: SkippedOccurrence) -> OccurrenceSkip:
        return cls(row.reason, row.detail, True, is_summary(row), row.scheduled_for, row.recorded_at)


@dataclass(frozen=True)
class Occurrence:
    scheduled_for: datetime
    #: The same instant in the task's time zone.
    local: datetime
    #: Whether it is a fire time of the task's schedule (else: a trigger, a retry, history).
    fire_time: bool
    state: OccurrenceState
    reason: str
    execution: Execution | None = None
    skip: OccurrenceSkip | None = None


@dataclass(frozen=True)
class OccurrenceWindow:
    task_id: UUID
    timezone: str
    start: datetime
    end: datetime
    now: datetime
    items: list[Occurrence]


def _holds_at_most(schedule: Schedule, start: datetime, end: datetime, count: int) -> bool:
    inside = takewhile(lambda when: when < end, schedule.fire_times(since=start))
    return sum(1 for _ in islice(inside, count + 1)) <= count


def occurrence_window(
    schedule: Schedule,
    now: datetime,
    start: datetime | None = None,
    end: datetime | None = None,
    most: int = OCCURRENCES_MAX,
) -> tuple[datetime, datetime]:
    """``[start, end)`` with the defaults applied. A bound not given makes the window
    :data:`OCCURRENCES_DEFAULT_SPAN` long, centred on ``now`` when neither is given, else
    reaching from the one given; halved as often as needed to hold at most ``most`` fire times
    of ``schedule`` (at most :data:`OCCURRENCES_MAX`, so that a default never fails; a page
    asks for fewer)."""
    most = min(most, OCCURRENCES_MAX)
    if start is not None and end is not None:
        return start, end
    span = OCCURRENCES_DEFAULT_SPAN
    while True:
        if start is not None:
            window = start, start + span
        elif end is not None:
            window = end - span, end
        else:
            window = now - span / 2, now + span / 2
        if span <= _MIN_DEFAULT_SPAN or _holds_at_most(schedule, *window, most):
            return window
        span /= 2


def _too_many(what: str, limit: int, first_beyond: datetime, start: datetime) -> InvalidInput:
    hint = f" to={first_beyond.isoformat()} holds the first {limit}." if first_beyond > start else ""
    return InvalidInput.on("to", f"The window holds more than {limit} {what}; ask for a shorter one.{hint}")


def _window_fire_times(
    periods: list[SchedulePeriod], start: datetime, end: datetime, last: datetime | None
) -> list[datetime]:
    """The fire times in ``[start, end)`` up to ``last``, each of the schedule in force at it."""
    times: list[datetime] = []
    for when in fire_times_between(periods, start, end):
        if when >= end or (last is not None and when > last):
            break
        if len(times) == OCCURRENCES_MAX:
            raise _too_many("fire times", OCCURRENCES_MAX, when, start)
        times.append(when)
    return times


def _window_executions(task: Task, start: datetime, end: datetime) -> tuple[list[Execution], datetime | None]:
    """The task's executions in ``[start, end)`` in time order, and (for a task the materialiser
    has finished with) its last live scheduled occurrence, from one query."""
    window = Q(scheduled_for__gte=start, scheduled_for__lt=end)
    if task.next_run_at is None:
        latest = Execution.objects.filter(task=task, origin__in=OCCURRENCE_ORIGINS, superseded=False)
        window |= Q(pk=Subquery(latest.order_by("-scheduled_for").values("pk")[:1]))
    rows = list(
        Execution.objects.filter(window, task=task)
        .only(*_EXECUTION_COLUMNS)
        .order_by("scheduled_for", "id")[: OCCURRENCE_RECORDS_MAX + 2]
    )
    inside = [row for row in rows if start <= row.scheduled_for < end]
    if len(inside) > OCCURRENCE_RECORDS_MAX:
        raise _too_many("executions", OCCURRENCE_RECORDS_MAX, inside[OCCURRENCE_RECORDS_MAX].scheduled_for, start)
    live = [row.scheduled_for for row in rows if row.origin in OCCURRENCE_ORIGINS and not row.superseded]
    return inside, max(live, default=None)


def _window_skipped(
    task: Task, start: datetime, end: datetime
) -> tuple[list[SkippedOccurrence], list[SkippedOccurrence], datetime | None]:
    """The task's skipped occurrences in ``[start, end)``; the materialiser's rows that decide
    which summary stands for which fire time (the latest one before ``start`` too), in time
    order; and (for a task the materialiser has finished with) its latest one; from one query."""
    materialiser = SkippedOccurrence.objects.filter(task=task).exclude(reason=SkipReason.OVERLAP)
    window = Q(scheduled_for__gte=start, scheduled_for__lt=end)
    window |= Q(pk=Subquery(materialiser.filter(scheduled_for__lt=start).order_by("-scheduled_for").values("pk")[:1]))
    if task.next_run_at is None:
        window |= Q(pk=Subquery(materialiser.order_by("-scheduled_for").values("pk")[:1]))
    rows = list(
        SkippedOccurrence.objects.filter(window, task=task).order_by("scheduled_for")[: OCCURRENCE_RECORDS_MAX + 3]
    )
    inside = [row for row in rows if start <= row.scheduled_for < end]
    if len(inside) > OCCURRENCE_RECORDS_MAX:
        raise _too_many(
            "skipped occurrences", OCCURRENCE_RECORDS_MAX, inside[OCCURRENCE_RECORDS_MAX].scheduled_for, start
        )
    by_materialiser = [row for row in rows if recorded_by_materialiser(row) and row.scheduled_for < end]
    latest = max((row.scheduled_for for row in rows if recorded_by_materialiser(row)), default=None)
    return inside, by_materialiser, latest


def _state_of(execution: Execution) -> OccurrenceState:
    if execution.superseded:
        return OccurrenceState.SUPERSEDED
    if execution.status in (ExecutionStatus.SCHEDULED, ExecutionStatus.PENDING):
        return OccurrenceState.SCHEDULED
    return OccurrenceState.EXECUTED


def _fire_time_item(
    fate: OccurrenceFate, skipped: SkippedOccurrence | None, when: datetime, local: datetime, now: datetime
) -> Occurrence:
    """The timeline item of a fire time, from what became of it (:func:`occurrence_fate`) and
    the skipped occurrence recorded at it, if any."""
    item = functools.partial(Occurrence, when, local, True, reason=fate.reason, execution=fate.execution)
    row = None if fate.skipped is None else OccurrenceSkip.of(fate.skipped)
    match fate.fate:
        case Fate.EXECUTION if fate.execution is not None:
            # A skip recorded at a fire time that ran after all (a backfill) stays visible.
            recorded = None if skipped is None else OccurrenceSkip.of(skipped)
            return item(_state_of(fate.execution), skip=recorded)
        case Fate.SKIPPED | Fate.SUMMARISED:
            return item(OccurrenceState.SKIPPED, skip=row)
        case Fate.PAUSED if when <= now:
            return item(OccurrenceState.SKIPPED, skip=OccurrenceSkip(SkipReason.PAUSED, fate.reason, recorded=False))
        case Fate.PAUSED | Fate.NOT_DUE:
            return item(OccurrenceState.UPCOMING)
        case Fate.SUPERSEDED:
            return item(OccurrenceState.SUPERSEDED)
        case _:
            return item(OccurrenceState.MISSING)


def _execution_item(execution: Execution, skipped: SkippedOccurrence | None, local: datetime, fire: bool) -> Occurrence:
    """The timeline item of an execution that is not a fire time's own: a trigger, a retry, a
    superseded one, or one of an earlier schedule."""
    what = f"Execution {execution.pk} ({execution.origin}"
    what += f", retry of {execution.retry_of_id})" if execution.retry_of_id else ")"
    if execution.moved_from is not None:  # a business calendar moved it here from a closed day
        what += f", moved here from {local_words(execution.moved_from, str(local.tzinfo))} by the task's calendar"
    if skipped is not None:
        reason = f"{what} was skipped ({skipped.reason}): {skipped.detail}"
        return Occurrence(
            execution.scheduled_for, local, fire, OccurrenceState.SKIPPED, reason, execution, OccurrenceSkip.of(skipped)
        )
    state = _state_of(execution)
    if state == OccurrenceState.SUPERSEDED:
        reason = f"{what} was replaced before it started: {execution.error}"
    else:
        reason = f"{what}, attempt {execution.attempt}, is {execution.status}"
        reason += f", waiting: {execution.waiting}." if execution.waiting else "."
    return Occurrence(execution.scheduled_for, local, fire, state, reason, execution)


@dataclass
class _Shown:
    """The executions and skipped occurrences an item already stands for."""

    executions: set[int] = field(default_factory=set)
    skipped: set[int] = field(default_factory=set)


def _fire_time_items(
    task: Task,
    fire_times: list[datetime],
    executions: list[Execution],
    skipped_rows: list[SkippedOccurrence],
    by_materialiser: list[SkippedOccurrence],
    *,
    zone: ZoneInfo,
    now: datetime,
    shown: _Shown,
) -> list[Occurrence]:
    """One item per fire time, from the records at it and the summary row that stands for it
    (the latest materialiser row before it, if a summary: see :func:`occurrence_fate`)."""
    at_instant: dict[datetime, list[Execution]] = {}
    for record in executions:
        at_instant.setdefault(record.scheduled_for, []).append(record)
    skipped_at = {row.scheduled_for: row for row in skipped_rows}
    rows = iter(by_materialiser)
    latest_row, next_row = None, next(rows, None)
    items = []
    for when in fire_times:
        while next_row is not None and next_row.scheduled_for < when:
            latest_row, next_row = next_row, next(rows, None)
        here = at_instant.get(when, [])
        execution = next((e for e in here if not e.superseded), None) or max(here, key=lambda e: e.pk, default=None)
        skipped = skipped_at.get(when)
        summary = latest_row if latest_row is not None and is_summary(latest_row) else None
        fate = occurrence_fate(task, when, execution=execution, skipped=skipped, summary=summary, now=now)
        item = _fire_time_item(fate, skipped, when, when.astimezone(zone), now)
        if item.execution is None and execution is not None and execution.superseded:
            # Its only execution was replaced (by a pause, or a change before it was made again):
            # the fire time's item stands for it, so the instant is listed once, not again as a
            # superseded record beside "upcoming" or "skipped".
            replaced = f" Its execution {execution.pk} was replaced before it started: {execution.error}"
            item = replace(item, execution=execution, reason=item.reason + replaced)
        if item.execution is not None:
            shown.executions.add(item.execution.pk)
        if skipped is not None and item.skip is not None and item.skip.row_scheduled_for == when:
            shown.skipped.add(skipped.pk)
        items.append(item)
    return items


def _record_items(
    executions: list[Execution],
    skipped_rows: list[SkippedOccurrence],
    fire_times: set[datetime],
    *,
    zone: ZoneInfo,
    shown: _Shown,
) -> list[Occurrence]:
    """One item per execution and per skipped occurrence that no fire time's item stands for
    (an execution skipped for overlap comes with its skip)."""
    skipped_at = {row.scheduled_for: row for row in skipped_rows}
    items = []
    for execution in executions:
        if execution.pk in shown.executions:
            continue
        row = skipped_at.get(execution.scheduled_for)
        own = row if row is not None and row.execution_id == execution.pk and row.pk not in shown.skipped else None
        if own is not None:
            shown.skipped.add(own.pk)
        local = execution.scheduled_for.astimezone(zone)
        items.append(_execution_item(execution, own, local, execution.scheduled_for in fire_times))
    for row in skipped_rows:
        if row.pk not in shown.skipped:
            when = row.scheduled_for
            reason = f"Skipped ({row.reason}): {row.detail}"
            skip = OccurrenceSkip.of(row)
            items.append(
                Occurrence(when, when.astimezone(zone), when in fire_times, OccurrenceState.SKIPPED, reason, skip=skip)
            )
    return items


def task_occurrences(
    *, task: Task, start: datetime | None = None, end: datetime | None = None, most: int = OCCURRENCES_MAX
) -> OccurrenceWindow:
    """The task's occurrence timeline over ``[start, end)`` (defaults: :func:`occurrence_window`,
    holding at most ``most`` fire times).

    One item per fire time in the window of the schedule in force at it (its versions:
    :func:`~tasks_api.selectors.schedule_history.schedule_periods`) (up to its last run, see
    :func:`task_last_fire_time`) saying what became of it (:func:`occurrence_fate`, as "why"
    says), and one per execution or skipped occurrence in the window that no fire time accounts
    for: triggered runs, retries, executions superseded by a schedule change or a pause, records
    of an earlier schedule. Every execution and every skipped occurrence in the window appears
    in exactly one item. Items are in time order; at one instant the fire time comes first, then
    executions by id, then skipped occurrences.

    Reads one query for the executions and one for the skipped occurrences. A window with more
    than :data:`OCCURRENCES_MAX` fire times or more than :data:`OCCURRENCE_RECORDS_MAX`
    executions or skipped occurrences is :class:`InvalidInput` on ``to`` (naming a ``to`` that fits).
    """
    now = db_now()
    schedule = task_schedule(task)
    start, end = occurrence_window(schedule, now, start, end, most)
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    executions, last_execution = _window_executions(task, start, end)
    skipped_rows, by_materialiser, last_skipped = _window_skipped(task, start, end)
    materialised = max((when for when in (last_execution, last_skipped) if when is not None), default=None)
    with walk_limit("from", "Fire times counted from the task's next run up to this window"):
        last = task_last_fire_time(task, schedule, materialised=materialised, until=end)
    # Each instant judged by the schedule in force then (the task's versions): after a change,
    # the old schedule's fire times stay fire times before it, and the new one's are not.
    fire_times = _window_fire_times(schedule_periods(task), start, end, last)
    zone, shown = ZoneInfo(task.timezone), _Shown()
    items = _fire_time_items(
        task, fire_times, executions, skipped_rows, by_materialiser, zone=zone, now=now, shown=shown
    )
    items += _record_items(executions, skipped_rows, set(fire_times), zone=zone, shown=shown)
    items.sort(key=lambda item: item.scheduled_for)  # stable: at one instant, in the order built
    return OccurrenceWindow(task.pk, task.timezone, start, end, now, items)
