"""Fire times of a schedule or a task: previews, the fire time at or before an instant, and
where a task's runs end (``max_runs``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo

from executions.materialiser import task_calendar, task_schedule
from tasks_app.calendars import CalendarRules, calendar_place
from tasks_app.models import CalendarPolicy, Task
from tasks_app.schedules import Schedule, dst_gap_skipped_note, dst_note, walk_limit
from tms_core.clock import db_now, local_words

#: A ``max_runs`` bound larger than this is not applied to previews (walking it would be too slow).
_MAX_RUNS_WALK = 100_000


@dataclass(frozen=True)
class FireTime:
    utc: datetime
    local: datetime
    #: Which DST rule decided this time, in words (empty on an ordinary day: :func:`dst_note`).
    dst: str = ""
    #: What a business calendar made of it: "" (nothing: an open day, or no calendar), ``skipped``, ``moved``.
    calendar: str = ""
    #: Why its day is closed (a holiday's name, an extra date's label, ``weekend``), and what followed.
    calendar_reason: str = ""
    #: When it runs: ``utc``, the moved instant, or None (skipped).
    runs_at: datetime | None = None


def calendar_marks(
    times: list[FireTime], rules: CalendarRules, policy: str, *, timezone: str, dst_gap: str = "", dst_fold: str = ""
) -> list[FireTime]:
    """``times`` marked with what the calendar and ``policy`` make of each: skipped (and why),
    moved (and where to), or nothing; a move onto an instant another fire time runs at says so."""
    policy = policy or CalendarPolicy.SKIP
    marked = []
    runs = {time.utc for time in times if not rules.closed(time.local.date())}
    for time in times:
        place = calendar_place(rules, policy, time.utc, timezone=timezone, dst_gap=dst_gap, dst_fold=dst_fold)
        if place.run_at == time.utc:
            marked.append(FireTime(time.utc, time.local, time.dst, runs_at=time.utc))
        elif place.run_at is None:
            note = f"; {policy} found no place: {place.note}" if place.note else ""
            marked.append(FireTime(time.utc, time.local, time.dst, "skipped", f"{place.reason} ({rules.name}){note}"))
        else:
            reason = f"{place.reason} ({rules.name}): moved to {local_words(place.run_at, timezone)} ({policy})"
            if place.run_at in runs:
                reason += "; another occurrence runs at that instant already: one run"
            runs.add(place.run_at)
            marked.append(FireTime(time.utc, time.local, time.dst, "moved", reason, place.run_at))
    return marked


def _fire_times(schedule: Schedule, times: list[datetime]) -> list[FireTime]:
    """``times`` as :class:`FireTime`, each with its DST note: the rule that decided it, or,
    under ``dst_gap`` skip, the gap since the previous fire time that swallowed wall times (so a
    day dropped by the gap is said, not silently missing from the list)."""
    zone = ZoneInfo(schedule.timezone)
    if not schedule.cron:
        return [FireTime(when, when.astimezone(zone), runs_at=when) for when in times]
    rules = {"gap": schedule.dst_gap, "fold": schedule.dst_fold}
    result = []
    for index, when in enumerate(times):
        notes = [dst_note(schedule.cron, schedule.timezone, when, **rules)]
        if index:
            notes.append(dst_gap_skipped_note(schedule.cron, schedule.timezone, times[index - 1], when, **rules))
        result.append(FireTime(when, when.astimezone(zone), "; ".join(n for n in notes if n), runs_at=when))
    return result


def _runs_end(schedule: Schedule, max_runs: int, *, until: datetime) -> datetime | None:
    """The ``max_runs``-th fire time of ``schedule`` if it lies at or before ``until`` (None: it
    lies after, the schedule ends before it, or ``max_runs`` is too large to walk)."""
    if max_runs > _MAX_RUNS_WALK:
        return None
    for count, when in enumerate(schedule.fire_times(), 1):
        if count == max_runs:
            return when if when <= until else None
        if when >= until:  # not one further: the walk that found ``until`` stopped there too
            return None
    return None


def schedule_preview(
    schedule: Schedule, *, count: int, after: datetime | None = None, max_runs: int | None = None
) -> list[FireTime]:
    """The first ``count`` fire times of ``schedule`` at or after ``after`` (default: its start),
    in UTC and in the schedule's time zone, stopping after its ``max_runs``-th fire time.

    :class:`InvalidInput` on ``count`` if they reach further than a cron schedule is walked
    (:data:`~tasks_app.schedules.MAX_WALK_YEARS`).
    """
    with walk_limit("count", f"The first {count} fire times"):
        times = list(islice(schedule.fire_times(since=after), count))
        if max_runs is not None and times:
            last = _runs_end(schedule, max_runs, until=times[-1])
            if last is not None:
                times = [when for when in times if when <= last]
    return _fire_times(schedule, times)


def task_preview(*, task: Task, count: int, after: datetime | None = None) -> list[FireTime]:
    """The task's next ``count`` fire times at or after ``after`` (default: now), up to where its
    runs end (``max_runs`` counted from its cursor: see :func:`task_last_fire_time`).

    :class:`InvalidInput` on ``count`` if they reach further than a cron schedule is walked, on
    ``after`` if it lies that far beyond the task's cursor (where ``max_runs`` is counted from).
    """
    schedule = task_schedule(task)
    with walk_limit("count", f"The next {count} fire times"):
        times = list(islice(schedule.fire_times(since=after or db_now()), count))
    if times:
        with walk_limit("after", "Fire times counted from the task's next run up to this time"):
            last = task_last_fire_time(task, schedule, materialised=None, until=times[-1])
        if last is not None:
            times = [when for when in times if when <= last]
    fire_times = _fire_times(schedule, times)
    rules = task_calendar(task)
    if rules is None:
        return fire_times
    return calendar_marks(
        fire_times, rules, task.calendar_policy, timezone=task.timezone, dst_gap=task.dst_gap, dst_fold=task.dst_fold
    )


def occurrence_at_or_before(schedule: Schedule, at: datetime) -> datetime | None:
    """The schedule's latest fire time at or before ``at`` (None if it first fires after ``at``).

    The window before ``at`` doubles until it holds a fire time, so the walk stays short for
    any spacing of fire times.
    """
    if at < schedule.start_at:
        return None
    span = timedelta(seconds=1)
    while True:
        since = schedule.start_at if span >= at - schedule.start_at else at - span
        found = None
        for when in schedule.fire_times(since=since):
            if when > at:
                break
            found = when
        if found is not None or since == schedule.start_at:
            return found
        span *= 2


def task_last_fire_time(
    task: Task, schedule: Schedule, *, materialised: datetime | None, until: datetime
) -> datetime | None:
    """The task's last fire time where its runs end other than by ``end_at`` (which bounds the
    schedule itself), if it lies before ``until``; None if they go on until then.

    A task the materialiser has finished with (no cursor: ``max_runs`` used up, a one-shot run
    created) ends with the last occurrence it handled, ``materialised`` (before ``start_at``
    if none). While ``max_runs`` still counts, it is the fire time that uses up the remaining
    runs, counted from the cursor: a forecast, as misses the misfire policy drops do not count.
    """
    if task.next_run_at is None:
        return materialised if materialised is not None else schedule.start_at - timedelta(microseconds=1)
    if task.max_runs is None:
        return None
    remaining = task.max_runs - task.runs_materialised
    if remaining <= 0:  # used up: the materialiser's next pass completes the task
        return task.next_run_at - timedelta(microseconds=1)
    if remaining > _MAX_RUNS_WALK:
        return None
    for count, when in enumerate(schedule.fire_times(since=task.next_run_at), 1):
        if count == remaining:
            return when
        if when >= until:
            break
    return None
