"""Why did this task (not) run at T?"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice

from executions.materialiser import task_schedule
from executions.models import Execution, ExecutionStatus, SkippedOccurrence
from tasks_api.selectors.fate import Fate, last_materialised, occurrence_fate, summary_before
from tasks_api.selectors.previews import occurrence_at_or_before, task_last_fire_time
from tasks_app.models import Task
from tasks_app.schedules import dst_note, walk_limit
from tms_core.clock import db_now

#: Verdicts of "why did this task not run at T?" for a live execution, by its status.
VERDICT_BY_STATUS: dict[str, str] = {  # keyed by the status as stored (ExecutionStatus values)
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
    #: Which DST rule decided the instant asked about or its occurrence, in words (empty: none did).
    dst: str = ""


def task_why(*, task: Task, at: datetime, next_count: int = 5) -> WhyAnswer:
    """Why the task did (not) run at ``at``: the fire time at or before it, and what became of
    it (:func:`occurrence_fate`), from its executions, its skipped occurrences and its schedule.

    A time given to the whole second (no fraction) means that second: a fire time within it is
    the one asked about (fire times keep their start's microseconds; pages and people show and
    type seconds)."""
    at = at.astimezone(UTC)
    schedule = task_schedule(task)
    now = db_now()
    upcoming = list(islice(schedule.fire_times(since=max(now, at)), next_count))
    within = at + timedelta(microseconds=999_999) if at.microsecond == 0 else at
    occurrence = occurrence_at_or_before(schedule, within)
    materialised = last_materialised(task) if task.next_run_at is None else None
    with walk_limit("at", "Fire times counted from the task's next run up to this time"):
        last = task_last_fire_time(task, schedule, materialised=materialised, until=max([within, *upcoming]))
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
    if not at <= occurrence <= within:
        answer.verdict = "not_a_fire_time"
        answer.reason = (
            f"{at.isoformat()} is not a fire time of the schedule; the latest fire time before it is "
            f"{occurrence.isoformat()} ({verdict}): {reason}"
        )
    else:
        answer.verdict, answer.reason = verdict, reason
    if task.cron:
        rules = {"gap": task.dst_gap, "fold": task.dst_fold}
        answer.dst = dst_note(task.cron, task.timezone, at, **rules) or dst_note(
            task.cron, task.timezone, occurrence, **rules
        )
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
