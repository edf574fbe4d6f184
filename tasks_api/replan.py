"""Replacing a task's planned future: its never-started occurrences cancelled as superseded, the
materialisation cursor moved back to the earliest of them, and the task materialised again by its
current settings. A change of its schedule or of what it runs (:mod:`tasks_api.editing`), a pause
(:mod:`tasks_api.lifecycle`) and a change of its business calendar (:mod:`tasks_api.calendars`)
go through here."""

from __future__ import annotations

from datetime import datetime

from executions import transitions
from executions.materialiser import materialise_task, task_schedule
from executions.models import OCCURRENCE_ORIGINS, Execution, ExecutionOrigin, SkippedOccurrence, SkipReason
from tasks_app.models import Task, TaskStatus
from tasks_app.schedules import Schedule
from tms_core.clock import db_now


def _on_schedule(schedule: Schedule, when: datetime) -> bool:
    return next(schedule.fire_times(since=when), None) == when


def _set_cursor(task: Task, cursor: datetime | None, schedule: Schedule) -> None:
    """Point the materialisation cursor at ``cursor`` and recount ``runs_materialised`` so that the
    materialiser, walking from there again, counts every occurrence once (``max_runs``)."""
    live = Execution.objects.filter(task=task, origin__in=OCCURRENCE_ORIGINS, superseded=False)
    runs = live.count()
    if cursor is not None:
        # Occurrences at or after the cursor that the walk meets again are counted again by it.
        ahead = live.filter(scheduled_for__gte=cursor).values_list("scheduled_for", flat=True)
        runs -= sum(1 for when in ahead if _on_schedule(schedule, when))
    task.next_run_at = cursor
    task.runs_materialised = max(0, runs)
    if cursor is not None and task.status == TaskStatus.COMPLETED:
        task.status = TaskStatus.ACTIVE


def _supersede(task: Task, *, only_from: frozenset[str], actor: str, reason: str) -> list[datetime]:
    """Cancel ``task``'s scheduled occurrences that never started (and are in ``only_from``) as
    superseded, so they can be materialised again; return the fire times of those cancelled
    (a run a business calendar moved: the fire time it was moved from)."""
    rows = Execution.objects.filter(
        task=task, origin=ExecutionOrigin.SCHEDULE, status__in=only_from, started_at__isnull=True
    ).values_list("pk", "scheduled_for", "moved_from")
    instants = []
    for pk, when, moved_from in rows:
        outcome = transitions.execution_cancel(
            execution_id=pk, actor=actor, reason=reason, only_from=only_from, supersede=True
        )
        if outcome.won:
            instants.append(moved_from or when)
    return instants


#: Skipped-occurrence reasons a business calendar writes: planned again, so recorded again.
CALENDAR_SKIPS = (SkipReason.HOLIDAY, SkipReason.MOVED)


def _forget_calendar_skips(task: Task, since: datetime) -> None:
    """Drop the task's calendar skips (holiday, moved) from ``since`` on: a re-plan records them
    again as the calendar now has them (a skipped row is never overwritten otherwise)."""
    SkippedOccurrence.objects.filter(task=task, scheduled_for__gte=since, reason__in=CALENDAR_SKIPS).delete()


def task_replan(*, task: Task, actor: str, reason: str, only_from: frozenset[str]) -> int:
    """Replace a task's future (its lock held by the caller): its executions in ``only_from``
    that never started are cancelled as superseded, the cursor goes back to the earliest of
    their fire times (or now), the calendar skips from there are forgotten, and the task is
    materialised again by its current settings. Returns how many executions were superseded."""
    superseded = _supersede(task, only_from=only_from, actor=actor, reason=reason)
    schedule = task_schedule(task)
    since = min([db_now(), *superseded])
    _forget_calendar_skips(task, since)
    _set_cursor(task, next(schedule.fire_times(since=since), None), schedule)
    task.save(update_fields=["next_run_at", "runs_materialised", "status", "updated_at"])
    if task.status == TaskStatus.ACTIVE:
        materialise_task(task_id=task.pk)
    return len(superseded)
