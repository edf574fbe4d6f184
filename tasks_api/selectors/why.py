"""Why did this task (not) run at T?"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from zoneinfo import ZoneInfo

from executions.materialiser import task_calendar, task_schedule
from executions.models import Execution, ExecutionStatus, SkippedOccurrence, SkipReason
from tasks_api.selectors.fate import Fate, last_materialised, occurrence_fate, summary_before, workflow_cause
from tasks_api.selectors.previews import FireTime, calendar_marks, task_last_fire_time
from tasks_api.selectors.schedule_history import fire_time_at_or_before, period_at, schedule_periods
from tasks_api.workflows import follower_words
from tasks_app.calendars import calendar_place
from tasks_app.models import Task
from tasks_app.schedules import dst_note, walk_limit
from tms_core.clock import db_now, local_words

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
    #: What the task's business calendar makes of each of ``next_fire_times`` ("" for an open
    #: day, or no calendar): a closed day's fire time is skipped or moved, and says so.
    next_notes: list[str] = field(default_factory=list)
    #: Which DST rule decided the instant asked about or its occurrence, in words (empty: none did).
    dst: str = ""

    @property
    def next_with_notes(self) -> list[tuple[datetime, str]]:
        """Each of :attr:`next_fire_times` with its calendar note (for pages)."""
        notes = self.next_notes + [""] * (len(self.next_fire_times) - len(self.next_notes))
        return list(zip(self.next_fire_times, notes, strict=False))


def task_why(*, task: Task, at: datetime, next_count: int = 5) -> WhyAnswer:
    """Why the task did (not) run at ``at``: the fire time at or before it, and what became of
    it (:func:`occurrence_fate`), from its executions, its skipped occurrences and its schedule.

    A time given to the whole second (no fraction) means that second: a fire time within it is
    the one asked about (fire times keep their start's microseconds; pages and people show and
    type seconds)."""
    at = at.astimezone(UTC)

    def _t(when: datetime) -> str:  # instants in words as the pages show them: local, to the second
        return local_words(when, task.timezone)

    within = at + timedelta(microseconds=999_999) if at.microsecond == 0 else at
    if task.has_after:  # a workflow step's run at ``at``, or a task that runs only after others
        answer = _workflow_answer(task, at, within)
        if answer is not None:
            return answer
    schedule = task_schedule(task)
    now = db_now()
    upcoming = list(islice(schedule.fire_times(since=max(now, at)), next_count))
    # The instant is judged by the schedule in force then (the task's versions), not today's.
    periods = schedule_periods(task)
    found = fire_time_at_or_before(periods, within)
    occurrence, in_force = found if found is not None else (None, period_at(periods, within))
    materialised = last_materialised(task) if task.next_run_at is None else None
    with walk_limit("at", "Fire times counted from the task's next run up to this time"):
        last = task_last_fire_time(task, schedule, materialised=materialised, until=max([within, *upcoming]))
    if last is not None:
        upcoming = [when for when in upcoming if when <= last]
    answer = WhyAnswer(at, occurrence, "", "", next_fire_times=upcoming, next_notes=_calendar_notes(task, upcoming))
    if occurrence is None:
        answer.verdict = "before_start"
        answer.reason = f"The schedule starts at {_t(periods[0].schedule.start_at)}, after {_t(at)}."
        return answer
    if last is not None and occurrence > last:
        answer.verdict = "after_end"
        answer.reason = f"The task's runs ended {_ending(task, last)}: nothing is created after it."
        return answer
    verdict, reason = _occurrence_verdict(task, occurrence, answer, now)
    moved_here = _moved_here(task, at, within)
    if moved_here is not None and moved_here.moved_from is not None and not at <= occurrence <= within:
        # Not a fire time, but a business calendar moved one here: that is what ran (or runs).
        answer.occurrence, answer.execution, answer.skipped = moved_here.moved_from, moved_here, None
        answer.verdict = VERDICT_BY_STATUS[moved_here.status]
        answer.reason = (
            f"The fire time {_t(moved_here.moved_from)} fell on a closed day of calendar "
            f"{task.calendar.name if task.calendar else '?'} and was moved here ({task.calendar_policy}): "
            f"execution {moved_here.pk} is {moved_here.status}."
        )
        return answer
    if not at <= occurrence <= within:
        answer.verdict = "not_a_fire_time"
        which = "the schedule in force then" if len(periods) > 1 else "the schedule"
        answer.reason = (
            f"{_t(at)} is not a fire time of {which}; the latest fire time before it is "
            f"{_t(occurrence)} ({verdict}): {reason}"
        )
    else:
        answer.verdict, answer.reason = verdict, reason
    then = in_force.schedule
    if then.cron:
        rules = {"gap": then.dst_gap, "fold": then.dst_fold}
        answer.dst = dst_note(then.cron, then.timezone, at, **rules) or dst_note(
            then.cron, then.timezone, occurrence, **rules
        )
    if task.end_at is not None and at > task.end_at and answer.verdict == "not_a_fire_time":
        answer.verdict = "after_end"
        answer.reason = f"The schedule ended at {_t(task.end_at)}. " + answer.reason
    return answer


def _calendar_notes(task: Task, times: list[datetime]) -> list[str]:
    """What the task's calendar makes of each of ``times`` (see :attr:`WhyAnswer.next_notes`)."""
    rules = task_calendar(task)
    if rules is None or not times:
        return [""] * len(times)
    zone = ZoneInfo(task.timezone)
    marked = calendar_marks(
        [FireTime(when, when.astimezone(zone)) for when in times],
        rules,
        task.calendar_policy,
        timezone=task.timezone,
        dst_gap=task.dst_gap,
        dst_fold=task.dst_fold,
    )
    words = {"skipped": "closed day, will not run: ", "moved": "closed day, "}
    return [f"{words[time.calendar]}{time.calendar_reason}" if time.calendar else "" for time in marked]


def _step_words(step: Execution) -> str:
    return f"Execution {step.pk} (attempt {step.attempt}) is {step.status}, {workflow_cause(step)}."


def _workflow_answer(task: Task, at: datetime, within: datetime) -> WhyAnswer | None:
    """For a task that follows others: its workflow step's run at ``at`` (within the second asked
    about), named with the runs it followed; else, for one with no schedule of its own, why it
    has no fire times (verdict ``follows``) and its latest run before ``at``. None: neither (a
    scheduled follower asked about another time: its schedule answers)."""
    steps = Execution.objects.filter(task=task, upstream__isnull=False, superseded=False)
    step = steps.filter(scheduled_for__gte=at, scheduled_for__lte=within).order_by("-id").first()
    if step is not None:
        return WhyAnswer(at, None, VERDICT_BY_STATUS[step.status], _step_words(step), execution=step)
    words = follower_words(task)
    if not words:
        return None
    latest = steps.filter(scheduled_for__lt=at).order_by("-scheduled_for", "-id").first()
    before = f" Its latest run before then: {_step_words(latest)}" if latest else " It had not run before then."
    return WhyAnswer(at, None, "follows", words + before, execution=latest)


def _moved_here(task: Task, at: datetime, within: datetime) -> Execution | None:
    """The live execution a business calendar moved to ``at`` (within the second asked about)."""
    if task.calendar_id is None and not task.executions.filter(moved_from__isnull=False).exists():
        return None
    return (
        Execution.objects.filter(
            task=task, scheduled_for__gte=at, scheduled_for__lte=within, moved_from__isnull=False, superseded=False
        )
        .order_by("scheduled_for")
        .first()
    )


def _calendar_verdict(
    task: Task, occurrence: datetime, answer: WhyAnswer, verdict: str, reason: str
) -> tuple[str, str]:
    """The verdict with the task's business calendar: a recorded holiday or move says so (with
    the execution the move made), and a fire time not planned yet says what the calendar will do."""
    skipped = answer.skipped
    if skipped is not None and skipped.scheduled_for == occurrence and skipped.reason == SkipReason.HOLIDAY:
        return "holiday", f"Skipped: its day is closed, {skipped.detail}."
    if skipped is not None and skipped.scheduled_for == occurrence and skipped.reason == SkipReason.MOVED:
        moved = Execution.objects.filter(task=task, moved_from=occurrence, superseded=False).order_by("-id").first()
        if moved is not None:
            answer.execution = moved
            reason = f"Moved: {skipped.detail}; execution {moved.pk} is {moved.status}."
        else:
            reason = f"Moved: {skipped.detail}."
        return "moved", reason
    if verdict == "upcoming" and answer.execution is None:
        rules = task_calendar(task)
        if rules is not None:
            place = calendar_place(
                rules,
                task.calendar_policy,
                occurrence,
                timezone=task.timezone,
                dst_gap=task.dst_gap,
                dst_fold=task.dst_fold,
            )
            if place.run_at is None:
                return (
                    "holiday",
                    f"{reason} Its day is closed: {place.reason} (calendar {rules.name}): it will not run.",
                )
            if place.moved:
                return "moved", (
                    f"{reason} Its day is closed: {place.reason} (calendar {rules.name}): it will run at "
                    f"{local_words(place.run_at, task.timezone)} ({task.calendar_policy})."
                )
    return verdict, reason


def _ending(task: Task, last: datetime) -> str:
    runs = f"after max_runs ({task.max_runs})" if task.max_runs is not None else "after its last run"
    if last < task.start_at:
        return f"{runs} before any fire time"
    return f"{runs} with the occurrence at {local_words(last, task.timezone)}"


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
    return _calendar_verdict(task, occurrence, answer, VERDICT_BY_FATE[fate.fate], fate.reason)
