"""Task reads that need more than a queryset: fire-time previews and "why did it not run at T?"."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo

from executions.clock import db_now
from executions.materialiser import task_schedule
from executions.models import Execution, ExecutionStatus, SkippedOccurrence
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


def schedule_preview(
    schedule: Schedule, *, count: int, after: datetime | None = None, max_runs: int | None = None
) -> list[FireTime]:
    """The first ``count`` fire times of ``schedule`` at or after ``after`` (default: its start),
    in UTC and in the schedule's time zone, stopping after its ``max_runs``-th fire time."""
    last: datetime | None = None
    if max_runs is not None and max_runs <= _MAX_RUNS_WALK:
        runs = list(islice(schedule.fire_times(), max_runs))
        last = runs[-1] if len(runs) == max_runs else None
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


#: Verdicts of "why did this task not run at T?".
VERDICT_BY_STATUS = {
    ExecutionStatus.SUCCEEDED: "ran",
    ExecutionStatus.RUNNING: "running",
    ExecutionStatus.FAILED: "failed",
    ExecutionStatus.CANCELLED: "cancelled",
    ExecutionStatus.SCHEDULED: "upcoming",
    ExecutionStatus.PENDING: "upcoming",
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
    it, from its executions, its skipped occurrences and its schedule."""
    at = at.astimezone(UTC)
    schedule = task_schedule(task)
    now = db_now()
    upcoming = list(islice(schedule.fire_times(since=max(now, at)), next_count))
    occurrence = occurrence_at_or_before(schedule, at)
    answer = WhyAnswer(at, occurrence, "", "", next_fire_times=upcoming)
    if occurrence is None:
        answer.verdict = "before_start"
        answer.reason = f"The schedule starts at {schedule.start_at.isoformat()}, after {at.isoformat()}."
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


def _occurrence_verdict(task: Task, occurrence: datetime, answer: WhyAnswer, now: datetime) -> tuple[str, str]:
    executions = Execution.objects.filter(task=task, scheduled_for=occurrence).order_by("superseded", "-id")
    execution = executions.first()
    skipped = SkippedOccurrence.objects.filter(task=task, scheduled_for=occurrence).first()
    answer.execution, answer.skipped = execution, skipped
    if skipped is not None and (execution is None or execution.pk == skipped.execution_id):
        return "skipped", f"Skipped ({skipped.reason}): {skipped.detail}"
    if execution is not None and not execution.superseded:
        verdict = VERDICT_BY_STATUS[execution.status]
        last = execution.events.order_by("-id").first()
        detail = last.detail if last and last.detail else execution.error[:500]
        text = f"Execution {execution.pk} (attempt {execution.attempt}) is {execution.status}"
        return verdict, text + (f": {detail}" if detail else ".")
    if task.status == TaskStatus.PAUSED and task.paused_at is not None and occurrence >= task.paused_at:
        return "paused", f"The task was paused at {task.paused_at.isoformat()} and has not been resumed."
    if task.next_run_at is None or occurrence >= task.next_run_at:
        if occurrence > now:
            return "upcoming", "Not due yet: it is created shortly before its time."
        return "upcoming", "Not created yet: the materialiser has not reached it."
    summary = (
        SkippedOccurrence.objects.filter(task=task, scheduled_for__lt=occurrence, detail__contains="summary:")
        .order_by("-scheduled_for")
        .first()
    )
    if summary is not None:
        answer.skipped = summary
        return "skipped", f"Skipped ({summary.reason}), one of many recorded in one row: {summary.detail}"
    if execution is not None:  # superseded: replaced by a schedule change or a pause
        return "cancelled", f"Execution {execution.pk} was replaced before it started: {execution.error}"
    return "skipped", "No execution was created for this fire time and no reason was recorded."
