"""Turns tasks' upcoming occurrences into executions, idempotently.

A pass locks a batch of due tasks with ``FOR UPDATE SKIP LOCKED`` (so several materialisers
share the work instead of repeating it), inserts their occurrences up to the horizon with
``ON CONFLICT DO NOTHING`` on (task, scheduled_for), records the missed occurrences its misfire
policy drops as :class:`~executions.models.SkippedOccurrence` rows (bounded per pass), and
advances each task's cursor (``next_run_at``) in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, transaction

from executions import transitions
from executions.clock import db_now
from executions.conf import tms_settings
from executions.models import SkippedOccurrence, SkipReason
from executions.notify import notify_due
from tasks_app.models import MisfirePolicy, OverlapPolicy, Task, TaskStatus
from tasks_app.schedules import Schedule, jitter_for

logger = logging.getLogger(__name__)

ACTOR = "materialiser"
#: An occurrence more than this late when materialised is a misfire, handled per the task's policy.
MISFIRE_GRACE = timedelta(seconds=60)
#: The most catch-up runs ``run_all`` creates in one pass.
RUN_ALL_LIMIT = 100


def task_schedule(task: Task) -> Schedule:
    return Schedule(
        start_at=task.start_at, interval=task.interval, cron=task.cron, timezone=task.timezone, end_at=task.end_at
    )


@dataclass
class Plan:
    rows: list[transitions.NewExecution]
    next_run_at: datetime | None
    runs: int
    #: Occurrences the misfire policy dropped, to record as skipped (bounded per pass).
    skipped: list[SkippedOccurrence] = field(default_factory=list)


#: How many missed occurrences each misfire policy keeps (the latest ones).
_MISFIRE_KEEP = {MisfirePolicy.SKIP: 0, MisfirePolicy.RUN_ONCE: 1, MisfirePolicy.RUN_ALL: RUN_ALL_LIMIT}
#: The most dropped occurrences recorded one by one per task and pass (the latest ones); one
#: summary row stands for any earlier ones.
RECORD_LIMIT = 1000


def catch_up_since(schedule: Schedule, cursor: datetime, *, missed_before: datetime, keep: int) -> datetime:
    """Where a walk over a schedule's occurrences from ``cursor`` can start and still meet the
    latest ``keep`` occurrences before ``missed_before`` (the misfire policy drops older ones).

    A cursor far in the past (a start_at years ago, a long pause or outage) would otherwise mean
    walking every occurrence since, one by one: billions for a sub-second interval. The window
    before ``missed_before`` doubles until it holds ``keep`` occurrences, each probe counting at
    most ``keep`` of them.
    """
    if cursor >= missed_before:
        return cursor
    if keep <= 0:
        return missed_before
    span = timedelta(seconds=1)
    while span < missed_before - cursor:
        since = missed_before - span
        met = 0
        for when in schedule.fire_times(since=since):
            if when >= missed_before or met >= keep:
                break
            met += 1
        if met >= keep:
            return since
        span *= 2
    return cursor


def _skip_reason(task: Task, when: datetime) -> tuple[str, str]:
    policy = task.misfire_policy
    if policy == MisfirePolicy.RUN_ONCE:
        return SkipReason.COALESCED, "misfire policy run_once: folded into one catch-up run"
    if policy == MisfirePolicy.RUN_ALL:
        return SkipReason.COALESCED, f"misfire policy run_all: beyond its bound of {RUN_ALL_LIMIT} catch-up runs"
    if task.paused_at is not None and when >= task.paused_at:
        return SkipReason.PAUSED, "the task was paused at this time; misfire policy skip"
    return SkipReason.MISSED, f"missed by more than {MISFIRE_GRACE.total_seconds():g}s; misfire policy skip"


def _skipped(task: Task, dropped: list[datetime], *, unlisted: int | None) -> list[SkippedOccurrence]:
    """Rows for the latest :data:`RECORD_LIMIT` of ``dropped``, plus one summary row at the
    cursor standing for ``unlisted`` earlier ones and the rest of ``dropped`` (None: an unknown
    number, for a cron schedule whose earlier misses were not walked)."""
    rows = []
    for when in dropped[-RECORD_LIMIT:]:
        reason, detail = _skip_reason(task, when)
        rows.append(SkippedOccurrence(task_id=task.pk, scheduled_for=when, reason=reason, detail=detail))
    hidden = len(dropped) - len(rows)
    if (unlisted is None or unlisted + hidden) and rows:
        count = "more" if unlisted is None else str(unlisted + hidden)
        cursor = task.next_run_at
        reason, detail = _skip_reason(task, cursor)
        rows.append(
            SkippedOccurrence(
                task_id=task.pk,
                scheduled_for=cursor,
                reason=reason,
                detail=f"{detail}; summary: {count} occurrences from {cursor.isoformat()} to before "
                f"{rows[0].scheduled_for.isoformat()} did not run either and are not listed one by one",
            )
        )
    return rows


def _unlisted(schedule: Schedule, cursor: datetime, since: datetime) -> int | None:
    """How many occurrences lie in [cursor, since), which a walk from ``since`` does not meet:
    exact for interval schedules, None (unknown) for cron."""
    if since <= cursor:
        return 0
    if schedule.interval:
        return -(-(since - cursor) // schedule.interval)
    return None


def plan_task(task: Task, *, now: datetime, until: datetime) -> Plan:
    """The executions to create for ``task`` up to ``until``, where its cursor moves, and the
    missed occurrences its misfire policy drops (recorded as skipped occurrences)."""
    if task.next_run_at is None:
        return Plan([], None, task.runs_materialised)
    schedule = task_schedule(task)
    keep = _MISFIRE_KEEP[task.misfire_policy]
    missed_before = now - MISFIRE_GRACE
    since = catch_up_since(schedule, task.next_run_at, missed_before=missed_before, keep=keep + RECORD_LIMIT)
    fire_times: Iterator[datetime] = schedule.fire_times(since=since)
    remaining = None if task.max_runs is None else max(0, task.max_runs - task.runs_materialised)
    missed: list[datetime] = []
    lost = 0  # missed occurrences trimmed away during the walk (too many to list)
    due: list[datetime] = []
    nxt: datetime | None = None
    for when in fire_times:
        if when > until or (remaining is not None and min(len(missed), keep) + len(due) >= remaining):
            nxt = when
            break
        if when < missed_before:
            missed.append(when)
            if len(missed) > (keep + RECORD_LIMIT) * 2:  # a long outage: keep the latest as we go
                extra = len(missed) - keep - RECORD_LIMIT
                lost += extra
                missed = missed[extra:]
        else:
            due.append(when)
    kept = missed[len(missed) - keep :] if keep else []
    dropped = missed[: len(missed) - len(kept)]
    times = kept + due
    if remaining is not None and len(times) >= remaining:
        nxt = None
    unlisted = _unlisted(schedule, task.next_run_at, since)
    skipped = _skipped(task, dropped, unlisted=None if unlisted is None else unlisted + lost)
    exclusive = task.overlap_policy != OverlapPolicy.ALLOW
    rows = [
        transitions.NewExecution(
            task_id=task.pk,
            scheduled_for=when,
            priority=task.priority,
            # Deterministic per occurrence: materialising it again gives the same due time.
            due_at=when + jitter_for(key=f"{task.pk}:{when.isoformat()}", max_jitter=task.jitter)
            if task.jitter
            else None,
            exclusive=exclusive,
        )
        for when in times
    ]
    return Plan(rows, nxt, task.runs_materialised + len(rows), skipped)


def skipped_record(rows: list[SkippedOccurrence]) -> None:
    """Insert skipped-occurrence rows; ones already recorded are left as they are."""
    if rows:
        SkippedOccurrence.objects.bulk_create(rows, ignore_conflicts=True, batch_size=2000)


def _move_cursors(tasks: list[Task]) -> None:
    """Write each task's cursor, run count, status and pause mark in one UPDATE … FROM (VALUES …)."""
    if connection.vendor != "postgresql":
        Task.objects.bulk_update(tasks, ["next_run_at", "runs_materialised", "status", "paused_at"])
        return
    table = Task._meta.db_table
    values = ", ".join(["(%s::uuid, %s::timestamptz, %s::integer, %s)"] * len(tasks))
    params: list[object] = []
    for task in tasks:
        params += [task.pk, task.next_run_at, task.runs_materialised, task.status]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} t SET next_run_at = v.next_run_at, runs_materialised = v.runs, "  # noqa: S608
            f"status = v.status, paused_at = NULL FROM (VALUES {values}) AS v (id, next_run_at, runs, status) "
            "WHERE t.id = v.id",
            params,
        )


def _apply(tasks: list[Task], *, now: datetime, until: datetime) -> list[int]:
    plans = {task.pk: plan_task(task, now=now, until=until) for task in tasks}
    ids = transitions.executions_create(rows=[row for p in plans.values() for row in p.rows], actor=ACTOR)
    skipped_record([row for p in plans.values() for row in p.skipped])
    for task in tasks:
        plan = plans[task.pk]
        task.next_run_at = plan.next_run_at
        task.runs_materialised = plan.runs
        task.paused_at = None  # materialised again: any pause is over
        if plan.next_run_at is None:
            task.status = TaskStatus.COMPLETED
    _move_cursors(tasks)
    if ids:
        notify_due()
    return ids


def materialise_task(*, task_id: object, until: datetime | None = None) -> list[int]:
    """Materialise one task's occurrences up to ``until`` (default: the horizon); return new ids.

    Locks the task row, so it is safe beside a running materialiser pass.
    """
    now = db_now()
    until = until or now + timedelta(seconds=tms_settings().MATERIALISE_HORIZON)
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id, status=TaskStatus.ACTIVE).first()
        if task is None:
            return []
        return _apply([task], now=now, until=until)


def materialise_due(*, horizon: float | None = None, batch: int | None = None) -> int:
    """One materialiser pass over every active task due within the horizon; returns executions created."""
    conf = tms_settings()
    horizon = conf.MATERIALISE_HORIZON if horizon is None else horizon
    batch = batch or conf.MATERIALISE_BATCH
    created = 0
    now = db_now()
    until = now + timedelta(seconds=horizon)
    while True:
        with transaction.atomic():
            tasks = list(
                Task.objects.select_for_update(skip_locked=True)
                .filter(status=TaskStatus.ACTIVE, next_run_at__isnull=False, next_run_at__lte=until)
                .order_by("next_run_at")[:batch]
            )
            if not tasks:
                break
            created += len(_apply(tasks, now=now, until=until))
        if len(tasks) < batch:
            break
    if created:
        logger.info("materialised %d executions", created)
    return created
