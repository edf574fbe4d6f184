"""Task reads that need more than a queryset: fire-time previews, "why did it not run at T?" and a
task's occurrence timeline over a window."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from itertools import islice
from zoneinfo import ZoneInfo

from executions.clock import db_now
from executions.materialiser import task_schedule
from executions.models import Execution, ExecutionOrigin, ExecutionStatus, SkippedOccurrence, SkipReason
from tasks_app.models import Task, TaskStatus
from tasks_app.schedules import Schedule

#: The most fire times one preview lists.
PREVIEW_MAX = 1000
#: A ``max_runs`` bound larger than this is not applied to previews (walking it would be too slow).
_MAX_RUNS_WALK = 100_000


@dataclass(frozen=True)
class FireTime:
    utc: datetime
    local: datetime


def last_fire_time(schedule: Schedule, max_runs: int | None) -> datetime | None:
    """The ``max_runs``-th fire time of ``schedule``: the last one its task runs (None: no such
    bound, the schedule ends before it, or ``max_runs`` is too large to walk)."""
    if max_runs is None or max_runs > _MAX_RUNS_WALK:
        return None
    runs = list(islice(schedule.fire_times(), max_runs))
    return runs[-1] if len(runs) == max_runs else None


def schedule_preview(
    schedule: Schedule, *, count: int, after: datetime | None = None, max_runs: int | None = None
) -> list[FireTime]:
    """The first ``count`` fire times of ``schedule`` at or after ``after`` (default: its start),
    in UTC and in the schedule's time zone, stopping after its ``max_runs``-th fire time."""
    last = last_fire_time(schedule, max_runs)
    zone = ZoneInfo(schedule.timezone)
    times = []
    for when in schedule.fire_times(since=after):
        if len(times) >= count or (last is not None and when > last):
            break
        times.append(FireTime(when, when.astimezone(zone)))
    return times


def task_preview(*, task: Task, count: int, after: datetime | None = None) -> list[FireTime]:
    """The task's next ``count`` fire times at or after ``after`` (default: now)."""
    return schedule_preview(task_schedule(task), count=count, after=after or db_now(), max_runs=task.max_runs)


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


# --- what became of a fire time: shared by "why" and the occurrence timeline -------------------


def is_summary(row: SkippedOccurrence) -> bool:
    """Whether a skipped-occurrence row is a materialiser summary standing for many fire times."""
    return "summary:" in row.detail


def recorded_by_materialiser(row: SkippedOccurrence) -> bool:
    """Whether the materialiser wrote the row (a misfire or a pause), not a claim (an overlap)."""
    return row.reason != SkipReason.OVERLAP


def summary_before(task: Task, occurrence: datetime) -> SkippedOccurrence | None:
    """The summary row standing for ``occurrence``, if one does (see :func:`occurrence_fate`)."""
    row = (
        SkippedOccurrence.objects.filter(task=task, scheduled_for__lt=occurrence)
        .exclude(reason=SkipReason.OVERLAP)
        .order_by("-scheduled_for")
        .first()
    )
    return row if row is not None and is_summary(row) else None


def last_materialised(task: Task) -> datetime | None:
    """The latest occurrence the materialiser handled for ``task`` (ran or recorded as skipped)."""
    executions = Execution.objects.filter(task=task, origin=ExecutionOrigin.SCHEDULE, superseded=False)
    skipped = SkippedOccurrence.objects.filter(task=task).exclude(reason=SkipReason.OVERLAP)
    latest = [
        rows.order_by("-scheduled_for").values_list("scheduled_for", flat=True).first()
        for rows in (executions, skipped)
    ]
    return max((when for when in latest if when is not None), default=None)


def task_last_fire_time(task: Task, schedule: Schedule, *, materialised: datetime | None) -> datetime | None:
    """The task's last fire time where its runs end other than by ``end_at`` (which bounds the
    schedule itself); None while they are unbounded.

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
    runs = list(islice(schedule.fire_times(since=task.next_run_at), remaining))
    return runs[-1] if len(runs) == remaining else None


class Fate(StrEnum):
    """What became of one fire time of a task."""

    SKIPPED = "skipped"  #: a skipped occurrence is recorded at it
    SUMMARISED = "summarised"  #: a summary row stands for it (one of many not listed one by one)
    EXECUTION = "execution"  #: it has a live (not superseded) execution
    PAUSED = "paused"  #: the task was paused before it and is still paused
    NOT_DUE = "not_due"  #: the materialiser has not reached it yet (at or after the task's cursor)
    SUPERSEDED = "superseded"  #: its only execution was replaced before it started
    UNRECORDED = "unrecorded"  #: behind the cursor with no execution and no recorded reason


@dataclass(frozen=True)
class OccurrenceFate:
    fate: Fate
    #: The explanation, for people.
    reason: str
    #: The execution the fate is about (live, or superseded for ``SUPERSEDED``), if any.
    execution: Execution | None = None
    #: The skipped-occurrence row the fate rests on: recorded at the fire time, or a summary.
    skipped: SkippedOccurrence | None = None


def occurrence_fate(
    task: Task,
    occurrence: datetime,
    *,
    execution: Execution | None,
    skipped: SkippedOccurrence | None,
    summary: SkippedOccurrence | None,
    now: datetime,
    detail: str = "",
) -> OccurrenceFate:
    """What became of the fire time ``occurrence``, from the records the caller fetched for it.

    ``execution`` is its live execution, or else its latest superseded one; ``skipped`` the row
    recorded at it; ``summary`` the summary row that stands for it. A summary row, written at the
    materialiser's cursor when a pass drops more occurrences than it lists, stands for the fire
    times after it up to the next row the materialiser recorded (the first one the pass listed):
    the latest materialiser row before ``occurrence``, if it is a summary (:func:`summary_before`).
    ``detail`` completes the sentence about a live execution (its latest event, its error).

    In order: a recorded skip (unless a later live execution ran the fire time, as a backfill
    does), a live execution, a pause still in force, the materialiser not there yet, a summary,
    a superseded execution; else nothing is recorded at all, which should not happen.
    """
    live = execution if execution is not None and not execution.superseded else None
    if skipped is not None and (live is None or live.pk == skipped.execution_id):
        return OccurrenceFate(Fate.SKIPPED, f"Skipped ({skipped.reason}): {skipped.detail}", live, skipped)
    if live is not None:
        text = f"Execution {live.pk} (attempt {live.attempt}) is {live.status}"
        return OccurrenceFate(Fate.EXECUTION, text + (f": {detail}" if detail else "."), live)
    if task.status == TaskStatus.PAUSED and task.paused_at is not None and occurrence >= task.paused_at:
        reason = f"The task was paused at {task.paused_at.isoformat()} and has not been resumed."
        return OccurrenceFate(Fate.PAUSED, reason)
    if task.next_run_at is not None and occurrence >= task.next_run_at:
        if occurrence > now:
            return OccurrenceFate(Fate.NOT_DUE, "Not due yet: it is created shortly before its time.")
        return OccurrenceFate(Fate.NOT_DUE, "Not created yet: the materialiser has not reached it.")
    if summary is not None:
        reason = f"Skipped ({summary.reason}), one of many recorded in one row: {summary.detail}"
        return OccurrenceFate(Fate.SUMMARISED, reason, skipped=summary)
    if execution is not None:  # superseded: replaced by a schedule change or a pause
        reason = f"Execution {execution.pk} was replaced before it started: {execution.error}"
        return OccurrenceFate(Fate.SUPERSEDED, reason, execution)
    return OccurrenceFate(Fate.UNRECORDED, "No execution was created for this fire time and no reason was recorded.")


# --- "why did this task (not) run at T?" -----------------------------------------------------

#: Verdicts of "why did this task not run at T?" for a live execution, by its status.
VERDICT_BY_STATUS = {
    ExecutionStatus.SUCCEEDED: "ran",
    ExecutionStatus.RUNNING: "running",
    ExecutionStatus.FAILED: "failed",
    ExecutionStatus.CANCELLED: "cancelled",
    ExecutionStatus.SCHEDULED: "upcoming",
    ExecutionStatus.PENDING: "upcoming",
}
#: Verdicts for the other fates.
VERDICT_BY_FATE = {
    Fate.SKIPPED: "skipped",
    Fate.SUMMARISED: "skipped",
    Fate.PAUSED: "paused",
    Fate.NOT_DUE: "upcoming",
    Fate.SUPERSEDED: "cancelled",
    Fate.UNRECORDED: "skipped",
}


@dataclass
class WhyAnswer:
    at: datetime
    occurrence: datetime | None
    verdict: str
    reason: str
    execution: Execution | None = None
    skipped: SkippedOccurrence | None = None
    next_fire_times: list[datetime] = field(default_factory=list)


def task_why(*, task: Task, at: datetime, next_count: int = 5) -> WhyAnswer:
    """Why the task did (not) run at ``at``: the fire time at or before it, and what became of
    it (:func:`occurrence_fate`), from its executions, its skipped occurrences and its schedule."""
    at = at.astimezone(UTC)
    schedule = task_schedule(task)
    now = db_now()
    upcoming = list(islice(schedule.fire_times(since=max(now, at)), next_count))
    occurrence = occurrence_at_or_before(schedule, at)
    materialised = last_materialised(task) if task.next_run_at is None else None
    last = task_last_fire_time(task, schedule, materialised=materialised)
    if last is not None:
        upcoming = [when for when in upcoming if when <= last]
    answer = WhyAnswer(at, occurrence, "", "", next_fire_times=upcoming)
    if occurrence is None:
        answer.verdict = "before_start"
        answer.reason = f"The schedule starts at {schedule.start_at.isoformat()}, after {at.isoformat()}."
        return answer
    if last is not None and occurrence > last:
        answer.verdict = "after_end"
        answer.reason = f"The task's runs ended {_ending(task, last)}: nothing is created after it."
        return answer
    verdict, reason = _occurrence_verdict(task, occurrence, answer, now)
    if occurrence != at:
        answer.verdict = "not_a_fire_time"
        answer.reason = (
            f"{at.isoformat()} is not a fire time of the schedule; the latest fire time before it is "
            f"{occurrence.isoformat()} ({verdict}): {reason}"
        )
    else:
        answer.verdict, answer.reason = verdict, reason
    if task.end_at is not None and at > task.end_at and answer.verdict == "not_a_fire_time":
        answer.verdict = "after_end"
        answer.reason = f"The schedule ended at {task.end_at.isoformat()}. " + answer.reason
    return answer


def _ending(task: Task, last: datetime) -> str:
    runs = f"after max_runs ({task.max_runs})" if task.max_runs is not None else "after its last run"
    if last < task.start_at:
        return f"{runs} before any fire time"
    return f"{runs} with the occurrence at {last.isoformat()}"


def _occurrence_verdict(task: Task, occurrence: datetime, answer: WhyAnswer, now: datetime) -> tuple[str, str]:
    execution = Execution.objects.filter(task=task, scheduled_for=occurrence).order_by("superseded", "-id").first()
    skipped = SkippedOccurrence.objects.filter(task=task, scheduled_for=occurrence).first()
    detail = ""
    if execution is not None and not execution.superseded:
        last = execution.events.order_by("-id").first()
        detail = last.detail if last and last.detail else execution.error[:500]
    unrun = skipped is None and (execution is None or execution.superseded)
    summary = summary_before(task, occurrence) if unrun else None
    fate = occurrence_fate(
        task, occurrence, execution=execution, skipped=skipped, summary=summary, now=now, detail=detail
    )
    answer.execution, answer.skipped = execution, fate.skipped or skipped
    if fate.fate == Fate.EXECUTION and fate.execution is not None:
        return VERDICT_BY_STATUS[fate.execution.status], fate.reason
    return VERDICT_BY_FATE[fate.fate], fate.reason
