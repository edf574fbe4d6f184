"""What resuming a paused task will do, said before it is done (the task page's Resume button).

Resuming hands the task back to the materialiser, which applies the task's misfire policy to the
fire times that passed while it was paused. :func:`resume_preview` plans that pass with the
materialiser's own planner (:func:`executions.materialiser.plan_task`) as of now, without
writing anything, and says it in words.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from executions.materialiser import plan_task, task_schedule
from tasks_app.models import MisfirePolicy, Task, TaskStatus
from tms_core.clock import db_now

#: Fire times counted one by one while paused; beyond, "more than" this many.
COUNT_LIMIT = 10_000


@dataclass(frozen=True)
class ResumePreview:
    #: Fire times that passed while the task was paused (from its cursor to now), at most COUNT_LIMIT.
    passed: int
    more: bool
    #: The runs resume creates due at once: the policy's catch-up runs and times within the grace.
    run_now: list[datetime]
    #: Of the times passed, those recorded as skipped with the reason ``paused``.
    skipped: int
    next_fire_time: datetime | None
    words: str


def _plural(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def resume_preview(task: Task) -> ResumePreview | None:
    """What :func:`tasks_api.lifecycle.task_resume` would do to ``task`` now (None unless paused)."""
    if task.status != TaskStatus.PAUSED or task.next_run_at is None:
        return None
    now = db_now()
    passed, more = 0, False
    for when in task_schedule(task).fire_times(since=task.next_run_at):
        if when > now or (task.end_at is not None and when > task.end_at):
            break
        if passed == COUNT_LIMIT:
            more = True
            break
        passed += 1
    plan = plan_task(task, now=now, until=now)
    run_now = [row.scheduled_for for row in plan.rows]
    skipped = max(0, passed - len(run_now))
    policy = task.misfire_policy
    count = f"{'more than ' if more else ''}{_plural(passed, 'fire time')}"
    if not passed:
        words = "Nothing was missed while it was paused: resuming picks up at its next fire time."
    elif not run_now:
        words = (
            f"{count} passed while it was paused; under its misfire policy ({policy}) none of them runs: "
            f"all are recorded as skipped, reason paused."
        )
    else:
        latest = run_now[-1]
        if policy == MisfirePolicy.RUN_ONCE and len(run_now) == 1:
            runs = f"one catch-up run, due at once, for the latest of them ({latest:%Y-%m-%d %H:%M:%S} UTC)"
        else:
            runs = f"{_plural(len(run_now), 'run')} due at once, for the latest of them (up to {latest:%H:%M:%S} UTC)"
        rest = f"; the other {skipped} are recorded as skipped, reason paused" if skipped else ""
        words = (
            f"{count} passed while it was paused; under its misfire policy ({policy}) resuming creates {runs}{rest}."
        )
    return ResumePreview(passed, more, run_now, skipped, plan.next_run_at, words)
