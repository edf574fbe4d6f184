"""What became of one fire time of a task: shared by "why" and the occurrence timeline."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from executions.models import OCCURRENCE_ORIGINS, Execution, ExecutionStatus, SkippedOccurrence, SkipReason
from executions.workflow_runs import dependency_on, upstream_runs
from tasks_app.models import JoinRule, Task, TaskStatus
from tms_core.clock import local_words


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
    executions = Execution.objects.filter(task=task, origin__in=OCCURRENCE_ORIGINS, superseded=False)
    skipped = SkippedOccurrence.objects.filter(task=task).exclude(reason=SkipReason.OVERLAP)
    latest = [
        rows.order_by("-scheduled_for").values_list("scheduled_for", flat=True).first()
        for rows in (executions, skipped)
    ]
    return max((when for when in latest if when is not None), default=None)


#: How an upstream's run ended, in the words of a step's explanation.
_ENDED: dict[str, str] = {ExecutionStatus.SUCCEEDED: "succeeded", ExecutionStatus.FAILED: "failed for good"}


def workflow_cause(execution: Execution) -> str:
    """Why a workflow step's run exists: the runs it followed and how they ended, with the
    ``after`` entries they met ("created because extract run #41 succeeded (after: on success),
    in workflow run #41"), and its join when it is not all_success; "" for a run that is no step.
    Three queries for a step, none otherwise."""
    if "upstream" in execution.get_deferred_fields() or not execution.upstream:
        return ""  # a list that read only some columns (the occurrence timeline): no query per row
    runs = upstream_runs(execution)
    if not runs:
        return f"created after execution(s) {', '.join(map(str, execution.upstream))}, no longer kept"
    on = dependency_on(execution.task_id, {run.task_id for run in runs})
    causes = [
        f"{run.task} run #{run.pk} {_ENDED.get(run.status, run.status.lower())}"
        + (f" (after: on {on[run.task_id]})" if run.task_id in on else " (no longer followed)")
        for run in runs
    ]
    joined = causes[0] if len(causes) == 1 else ", ".join(causes[:-1]) + " and " + causes[-1]
    join = Task.objects.filter(pk=execution.task_id).values_list("join", flat=True).first()
    if join is not None and join != JoinRule.ALL_SUCCESS:
        joined += f" (join {join})"
    retry = f", run again on request after execution #{execution.retry_of_id}" if execution.retry_of_id else ""
    return f"created because {joined}, in workflow run #{execution.workflow_run}{retry}"


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
        cause = workflow_cause(live)
        if cause:
            text += f", {cause}"
        if live.waiting:  # held back although due: say by what
            text += f", waiting: {live.waiting}"
            detail = "" if detail.startswith("waiting:") else detail
        return OccurrenceFate(Fate.EXECUTION, text + (f": {detail}" if detail else "."), live)
    if task.status == TaskStatus.PAUSED and task.paused_at is not None and occurrence >= task.paused_at:
        reason = f"The task was paused at {local_words(task.paused_at, task.timezone)} and has not been resumed."
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
