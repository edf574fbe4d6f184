"""Turns tasks' upcoming occurrences into executions, idempotently.

A pass locks a batch of due tasks with ``FOR UPDATE SKIP LOCKED`` (so several materialisers
share the work instead of repeating it), inserts their occurrences up to the horizon with
``ON CONFLICT DO NOTHING`` on (task, scheduled_for), records the missed occurrences its misfire
policy drops as :class:`~executions.models.SkippedOccurrence` rows (bounded per pass), and
advances each task's cursor (``next_run_at``) in the same transaction.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from django.db import connection, transaction

from executions import transitions
from executions.models import SkippedOccurrence, SkipReason
from executions.notify import notify_due
from tasks_app.audit import audit_record_many
from tasks_app.calendars import CalendarRules, calendar_place, lookahead
from tasks_app.models import (
    AuditAction,
    Calendar,
    CalendarPolicy,
    MisfirePolicy,
    Task,
    TaskStatus,
    claims_exclusive,
    status_for_cursor,
)
from tasks_app.schedules import MAX_WALK, Schedule, jitter_for
from tms_core import metrics, tracing
from tms_core.clock import db_now, local_words
from tms_core.conf import tms_settings

logger = logging.getLogger(__name__)

ACTOR = "materialiser"


class DueTask(NamedTuple):
    """The columns of a task that a pass plans from, loaded as plain rows (building 100,000 model
    instances costs more than planning them)."""

    #: Text on a pass (the id is only ever written back), a UUID from the model.
    pk: uuid.UUID | str
    start_at: datetime
    interval: timedelta | None
    cron: str
    timezone: str
    end_at: datetime | None
    dst_gap: str
    dst_fold: str
    max_runs: int | None
    jitter: timedelta
    misfire_policy: str
    misfire_grace: timedelta
    catch_up_limit: int
    overlap_policy: str
    max_concurrency: int | None
    has_limits: bool
    priority: int
    next_run_at: datetime | None
    runs_materialised: int
    paused_at: datetime | None
    owner_id: int
    team_id: int
    #: Its business calendar and policy (the defaults: none), applied by :func:`plan_task`.
    calendar_id: int | None = None
    calendar_policy: str = ""
    #: Its version (``Task.version``), which its executions record.
    version: int = 1
    #: Whether it follows other tasks: then the end of its own schedule does not complete it.
    has_after: bool = False


_DUE_COLUMNS = ("id", *DueTask._fields[1:])
#: What planning reads a task from: the model (creating, resuming) or a row of a pass.
Plannable = Task | DueTask


def task_schedule(task: Plannable) -> Schedule:
    return Schedule(
        start_at=task.start_at,
        interval=task.interval,
        cron=task.cron,
        timezone=task.timezone,
        end_at=task.end_at,
        dst_gap=task.dst_gap,
        dst_fold=task.dst_fold,
    )


@dataclass
class Plan:
    rows: list[transitions.NewExecution]
    next_run_at: datetime | None
    runs: int
    #: Occurrences the misfire policy dropped, to record as skipped (bounded per pass).
    skipped: list[SkippedOccurrence] = field(default_factory=list)


def _misfire_keep(task: Plannable) -> int:
    """How many missed occurrences the task's misfire policy runs (the latest ones)."""
    if task.misfire_policy == MisfirePolicy.RUN_ALL:
        return task.catch_up_limit
    return 1 if task.misfire_policy == MisfirePolicy.RUN_ONCE else 0


#: Longer than a valid cron expression goes without a fire time (40 years: both day fields must
#: match when one starts with "*", and 29 February falls on a given weekday up to 40 years apart).
_CRON_SILENCE = timedelta(days=366 * 41)

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


def _skip_reason(task: Plannable, when: datetime) -> tuple[str, str]:
    policy = task.misfire_policy
    # A time that passed while the task was paused did not run because of the pause, whatever
    # the policy then made of the catch-up: it keeps the reason ``paused`` (it was relabelled
    # "coalesced" under run_once and run_all), and the detail says what the policy did.
    paused = task.paused_at is not None and when >= task.paused_at
    if policy == MisfirePolicy.RUN_ONCE:
        detail = "misfire policy run_once: folded into one catch-up run"
    elif policy == MisfirePolicy.RUN_ALL:
        detail = f"misfire policy run_all: beyond its bound of {task.catch_up_limit} catch-up runs"
    else:
        detail = "misfire policy skip"
    if paused:
        return SkipReason.PAUSED, f"the task was paused at this time; {detail}"
    if policy != MisfirePolicy.SKIP:
        return SkipReason.COALESCED, detail
    grace = task.misfire_grace.total_seconds()
    return SkipReason.MISSED, f"missed by more than its misfire grace of {grace:g}s; misfire policy skip"


def _skipped(
    task: Plannable, dropped: list[datetime], *, cursor: datetime, unlisted: int | None
) -> list[SkippedOccurrence]:
    """Rows for the latest :data:`RECORD_LIMIT` of ``dropped``, plus one summary row at the
    ``cursor`` (the task's next run) standing for ``unlisted`` earlier ones and the rest of
    ``dropped`` (None: an unknown number, for a cron schedule whose earlier misses were not walked)."""
    rows = []
    for when in dropped[-RECORD_LIMIT:]:
        reason, detail = _skip_reason(task, when)
        rows.append(SkippedOccurrence(task_id=task.pk, scheduled_for=when, reason=reason, detail=detail))
    hidden = len(dropped) - len(rows)
    if (unlisted is None or unlisted + hidden) and rows:
        count = "more" if unlisted is None else str(unlisted + hidden)
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


#: Business calendars by id, as a pass reads them once for its batch.
Calendars = Mapping[int, CalendarRules]


def calendars_load(ids: set[int]) -> dict[int, CalendarRules]:
    """The rules of the calendars ``ids``, read once for a batch of tasks."""
    return {calendar.pk: CalendarRules.of(calendar) for calendar in Calendar.objects.filter(pk__in=ids)}


def task_calendar(task: Plannable, calendars: Calendars | None = None) -> CalendarRules | None:
    """The rules of the task's calendar (None: it has none)."""
    if task.calendar_id is None:
        return None
    rules = (calendars or {}).get(task.calendar_id)
    if rules is None:
        rules = calendars_load({task.calendar_id}).get(task.calendar_id)
    return rules


def plan_task(task: Plannable, *, now: datetime, until: datetime, calendars: Calendars | None = None) -> Plan:
    """The executions to create for ``task`` up to ``until``, where its cursor moves, and the
    missed occurrences its misfire policy drops (recorded as skipped occurrences).

    An occurrence more than the task's ``misfire_grace`` before ``now`` is a misfire: of those,
    the policy keeps the latest 0 (skip), 1 (run_once) or ``catch_up_limit`` (run_all).

    A task with a business calendar then has its calendar applied to the fire times kept
    (:func:`_apply_calendar`). Under ``previous_business_day`` the fire times are planned further
    ahead, by the longest run of closed days near the horizon: one after the horizon may move
    back inside it.
    """
    rules = task_calendar(task, calendars)
    if rules is None:
        return _plan_raw(task, now=now, until=until)
    if task.calendar_policy == CalendarPolicy.PREVIOUS_BUSINESS_DAY:
        until = until + lookahead(rules, until, task.timezone)
    return _apply_calendar(task, _plan_raw(task, now=now, until=until), rules, now=now)


def _apply_calendar(task: Plannable, plan: Plan, rules: CalendarRules, *, now: datetime) -> Plan:
    """``plan`` with the task's calendar applied: a fire time on a closed day is dropped and
    recorded as skipped (``holiday``, policy skip), or moved to the same wall time on a
    business day (its execution at the moved instant, ``moved_from`` the fire time, and a skipped
    row ``moved`` at the fire time saying where it went).

    Occurrences landing on the same instant run once: a fire time on an open day keeps its
    execution, a moved one landing there says so. A fire time moved back to before the task's
    start or its misfire grace (a task created, edited or resumed just before a closed stretch)
    is skipped rather than run late (a missed fire time the misfire policy keeps runs as its
    catch-up, moved or not). ``runs`` (``max_runs``) counts fire times, skipped ones too.
    """
    policy = task.calendar_policy
    where = f"calendar {rules.name}"
    kept: list[transitions.NewExecution] = []
    moved: list[tuple[transitions.NewExecution, str]] = []
    skipped = list(plan.skipped)
    for row in plan.rows:
        place = calendar_place(
            rules, policy, row.scheduled_for, timezone=task.timezone, dst_gap=task.dst_gap, dst_fold=task.dst_fold
        )
        if place.run_at == row.scheduled_for:
            kept.append(row)
        elif place.run_at is None:
            note = f"; {policy} found no place: {place.note}" if place.note else ""
            skipped.append(
                _calendar_skip(task, row.scheduled_for, SkipReason.HOLIDAY, f"{place.reason} ({where}){note}")
            )
        elif (
            place.run_at < max(task.start_at, now - task.misfire_grace)
            and place.run_at < row.scheduled_for
            and row.scheduled_for >= now - task.misfire_grace  # a catch-up the misfire policy kept runs
        ):
            detail = (
                f"{place.reason} ({where}); {policy} {local_words(place.run_at, task.timezone)} had already passed "
                "when it was planned"
            )
            skipped.append(_calendar_skip(task, row.scheduled_for, SkipReason.HOLIDAY, detail))
        else:
            # Calendar notes are read on pages that show local time: the task's, to the second.
            detail = f"moved to {local_words(place.run_at, task.timezone)} ({policy}): {place.reason} ({where})"
            moved.append((_moved_row(task, row, place.run_at), detail))
    taken = {row.scheduled_for for row in kept}
    for row, detail in moved:
        assert row.moved_from is not None
        if row.scheduled_for in taken:
            detail += "; another occurrence runs at that instant already: one run"
        else:
            taken.add(row.scheduled_for)
            kept.append(row)
        skipped.append(_calendar_skip(task, row.moved_from, SkipReason.MOVED, detail))
    kept.sort(key=lambda row: row.scheduled_for)
    return Plan(kept, plan.next_run_at, plan.runs, skipped)


def _calendar_skip(task: Plannable, when: datetime, reason: str, detail: str) -> SkippedOccurrence:
    return SkippedOccurrence(task_id=task.pk, scheduled_for=when, reason=reason, detail=detail[:2000])


def _moved_row(task: Plannable, row: transitions.NewExecution, to: datetime) -> transitions.NewExecution:
    return transitions.NewExecution(
        task_id=row.task_id,
        scheduled_for=to,
        priority=row.priority,
        due_at=to + jitter_for(key=f"{task.pk}:{to.isoformat()}", max_jitter=task.jitter) if task.jitter else None,
        exclusive=row.exclusive,
        moved_from=row.scheduled_for,
    )


def _plan_raw(task: Plannable, *, now: datetime, until: datetime) -> Plan:
    """:func:`plan_task` before any calendar."""
    if task.next_run_at is None:
        return Plan([], None, task.runs_materialised)
    remaining = None if task.max_runs is None else max(0, task.max_runs - task.runs_materialised)
    if remaining == 0:  # its runs are used up: the task is complete, nothing further was missed
        return Plan([], None, task.runs_materialised)
    schedule = task_schedule(task)
    exclusive = claims_exclusive(
        overlap_policy=task.overlap_policy, max_concurrency=task.max_concurrency, has_limits=task.has_limits
    )
    if remaining is None and task.next_run_at >= now - task.misfire_grace:
        return _plan_on_time(task, schedule, cursor=task.next_run_at, until=until, exclusive=exclusive)
    # The latest missed fire times the policy runs, no more than the runs the task has left.
    keep = _misfire_keep(task) if remaining is None else min(_misfire_keep(task), remaining)
    missed_before = now - task.misfire_grace
    cursor = task.next_run_at
    if schedule.cron:
        # A cron walk stops MAX_WALK past its start (its cost grows with the span walked) and
        # this one must reach the first fire time after ``until`` (at most 40 years on): from a
        # cursor older than that (API dates start in 1970, so only after 2030 or for rows made
        # otherwise) only the later fire times are walked, the earlier ones are summarised as "more".
        cursor = max(cursor, until - MAX_WALK + _CRON_SILENCE)
    since = catch_up_since(schedule, cursor, missed_before=missed_before, keep=keep + RECORD_LIMIT)
    fire_times: Iterator[datetime] = schedule.fire_times(since=since)
    missed: list[datetime] = []
    lost = 0  # missed occurrences trimmed away during the walk (too many to list)
    due: list[datetime] = []
    nxt: datetime | None = None
    for when in fire_times:
        if when > until:
            nxt = when
            break
        if when < missed_before:
            missed.append(when)
            if len(missed) > (keep + RECORD_LIMIT) * 2:  # a long outage: keep the latest as we go
                extra = len(missed) - keep - RECORD_LIMIT
                lost += extra
                missed = missed[extra:]
        elif remaining is not None and min(len(missed), keep) + len(due) >= remaining:
            nxt = when
            break
        else:
            due.append(when)
    kept = missed[max(0, len(missed) - keep) :]
    dropped = missed[: len(missed) - len(kept)]
    times = kept + due
    if remaining is not None and len(times) >= remaining:
        nxt = None
    unlisted = _unlisted(schedule, task.next_run_at, since)
    skipped = _skipped(task, dropped, cursor=task.next_run_at, unlisted=None if unlisted is None else unlisted + lost)
    rows = _rows(task, times, exclusive=exclusive)
    return Plan(rows, nxt, task.runs_materialised + len(rows), skipped)


def _plan_on_time(task: Plannable, schedule: Schedule, *, cursor: datetime, until: datetime, exclusive: bool) -> Plan:
    """:func:`plan_task` for the common case, kept short for a pass over many tasks: the cursor
    is not late (nothing missed) and no ``max_runs`` counts down."""
    since = max(cursor, schedule.start_at)
    if schedule.cron:
        times, nxt = _cron_window(schedule.cron, schedule.timezone, schedule.end_at, since, until)
    else:
        times, nxt = _window(schedule, since, until)
    rows = _rows(task, times, exclusive=exclusive)
    return Plan(rows, nxt, task.runs_materialised + len(rows))


def _window(schedule: Schedule, since: datetime, until: datetime) -> tuple[tuple[datetime, ...], datetime | None]:
    """The fire times from ``since`` up to ``until``, and the first one after it (None: no more)."""
    times: list[datetime] = []
    for when in schedule.fire_times(since=since):
        if when > until:
            return tuple(times), when
        times.append(when)
    return tuple(times), None


@functools.lru_cache(maxsize=4096)
def _cron_window(
    cron: str, timezone: str, end_at: datetime | None, since: datetime, until: datetime
) -> tuple[tuple[datetime, ...], datetime | None]:
    """:func:`_window` of a cron schedule, shared by the tasks of a pass with the same expression,
    zone and cursor (popular expressions such as ``0 * * * *`` have many); ``since`` is already
    at or after the schedule's start, which therefore does not matter."""
    if end_at is not None and end_at < since:
        return (), None
    return _window(Schedule(start_at=since, cron=cron, timezone=timezone, end_at=end_at), since, until)


def _rows(task: Plannable, times: Sequence[datetime], *, exclusive: bool) -> list[transitions.NewExecution]:
    return [
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


def skipped_record(rows: list[SkippedOccurrence]) -> None:
    """Insert skipped-occurrence rows; ones already recorded are left as they are."""
    if rows:
        SkippedOccurrence.objects.bulk_create(rows, ignore_conflicts=True, batch_size=2000)


class _Batch:
    """What a pass writes, kept as columns of preformatted array elements rather than an object
    per row: a pass over 100,000 tasks spent about a third of its Python time building and
    formatting ``NewExecution`` and cursor objects."""

    def __init__(self) -> None:
        self.task_ids: list[str] = []
        self.times: list[str] = []
        self.dues: list[str] = []
        self.priorities: list[str] = []
        self.exclusive: list[str] = []
        self.owners: list[str] = []
        self.teams: list[str] = []
        self.versions: list[str] = []
        self.cursor_ids: list[str] = []
        self.cursor_times: list[str] = []
        self.cursor_runs: list[str] = []
        self.cursor_status: list[str] = []
        #: The tasks this batch completes (every task a pass plans is ACTIVE), with their owners:
        #: a change of a task's status is in its audit log, the system's as much as a user's.
        self.completed: list[tuple[str, int]] = []
        self.skipped: list[SkippedOccurrence] = []
        #: Executions a business calendar moved: few, inserted with their ``moved_from``.
        self.moved: list[transitions.NewExecution] = []
        #: Most tasks of a pass share their fire times (a popular cron expression), so each
        #: time is formatted once.
        self._iso: dict[datetime, str] = {}

    def iso(self, when: datetime) -> str:
        text = self._iso.get(when)
        if text is None:
            text = self._iso[when] = when.isoformat()
        return text

    def add(self, task: Plannable, times: Sequence[datetime], nxt: datetime | None, runs: int) -> None:
        """Add ``task``'s executions at ``times`` and its cursor (``nxt``; None completes it,
        unless it follows other tasks: :func:`~tasks_app.models.status_for_cursor`)."""
        pk = str(task.pk)
        if times:
            iso = self.iso
            count = len(times)
            stamps = [iso(when) for when in times]
            self.task_ids += [pk] * count
            self.times += stamps
            if task.jitter:
                # Deterministic per occurrence: materialising it again gives the same due time.
                self.dues += [
                    iso(when + jitter_for(key=f"{pk}:{stamp}", max_jitter=task.jitter))
                    for when, stamp in zip(times, stamps, strict=True)
                ]
            else:
                self.dues += stamps
            self.priorities += [str(task.priority)] * count
            exclusive = claims_exclusive(
                overlap_policy=task.overlap_policy, max_concurrency=task.max_concurrency, has_limits=task.has_limits
            )
            self.exclusive += ["t" if exclusive else "f"] * count
            self.owners += [str(task.owner_id)] * count
            self.teams += [str(task.team_id)] * count
            self.versions += [str(task.version)] * count
        self.cursor_ids.append(pk)
        self.cursor_times.append("NULL" if nxt is None else self.iso(nxt))
        self.cursor_runs.append(str(runs))
        status = status_for_cursor(next_run_at=nxt, has_after=task.has_after)
        self.cursor_status.append(status)
        if status == TaskStatus.COMPLETED:
            self.completed.append((pk, task.owner_id))

    def add_plan(self, task: Plannable, plan: Plan) -> None:
        times = [row.scheduled_for for row in plan.rows if row.moved_from is None]
        self.add(task, times, plan.next_run_at, plan.runs)
        self.moved += [row for row in plan.rows if row.moved_from is not None]
        self.skipped += plan.skipped

    def insert(self) -> list[int]:
        moved = transitions.executions_create(rows=self.moved, actor=ACTOR) if self.moved else []
        return self._insert() + moved

    def _insert(self) -> list[int]:
        if not self.task_ids:
            return []
        return transitions.executions_create_arrays(
            task_ids=_array(self.task_ids),
            scheduled_for=_array(self.times),
            due_at=_array(self.dues),
            priority=_array(self.priorities),
            exclusive=_array(self.exclusive),
            owner_ids=_array(self.owners),
            team_ids=_array(self.teams),
            versions=_array(self.versions),
            actor=ACTOR,
        )

    def audit_completed(self) -> None:
        """Record in the audit log each task this batch completes (one INSERT, none if none)."""
        audit_record_many(
            [
                {
                    "action": AuditAction.MATERIALISE,
                    "object_type": "task",
                    "object_id": pk,
                    "owner": owner,
                    "task_id": pk,
                    "changes": {"status": {"from": TaskStatus.ACTIVE, "to": TaskStatus.COMPLETED}},
                    "detail": "completed: its schedule has no further occurrence",
                }
                for pk, owner in self.completed
            ]
        )

    def move_cursors(self) -> None:
        """Write each task's cursor, run count and status, and end any pause, in one statement."""
        with connection.cursor() as cursor:
            # The rows to update were read by this batch's lock moments ago, so their pages are in
            # shared buffers. At the default random_page_cost (4, a disk read per probe) the
            # planner hashed the whole task table for each batch instead of probing the primary
            # key for its 2,000 rows: 19 of the statement's 35 ms at 100,000 tasks, and a cost
            # that grows with the table. For the rest of this batch's transaction only.
            cursor.execute("SET LOCAL random_page_cost = 1.1")
            cursor.execute(
                f"""
                UPDATE {Task._meta.db_table} t
                SET next_run_at = v.next_run_at, runs_materialised = v.runs, status = v.status, paused_at = NULL
                FROM unnest(%s::uuid[], %s::timestamptz[], %s::integer[], %s::text[])
                    AS v (id, next_run_at, runs, status)
                WHERE t.id = v.id
                """,  # noqa: S608 - the table name is ours, the values are parameters
                [
                    _array(self.cursor_ids),
                    _array(self.cursor_times),
                    _array(self.cursor_runs),
                    _array(self.cursor_status),
                ],
            )


def _array(elements: list[str]) -> str:
    """An array literal of elements that need no quoting (UUIDs, ISO timestamps, numbers,
    booleans, upper-case words, NULL): :func:`transitions.pg_array` without the per-value work."""
    return "{" + ",".join(elements) + "}"


def _interval_window(
    start_at: datetime, interval: timedelta, end_at: datetime | None, since: datetime, until: datetime
) -> tuple[list[datetime], datetime | None]:
    """:func:`_window` of an interval schedule (``Schedule.fire_times`` without building a
    schedule, which validates it again): the grid of ``start_at`` from ``since`` up to ``until``."""
    start = start_at.astimezone(UTC)
    end = None if end_at is None else end_at.astimezone(UTC)
    since = max(since.astimezone(UTC), start)
    steps = max(0, -((start - since) // interval))
    times: list[datetime] = []
    while True:
        try:
            when = start + steps * interval
        except OverflowError:
            return times, None
        if end is not None and when > end:
            return times, None
        if when > until:
            return times, when
        times.append(when)
        steps += 1


def _on_time_window(
    task: Plannable, *, now: datetime, until: datetime
) -> tuple[Sequence[datetime], datetime | None] | None:
    """The fire times and next cursor of :func:`_plan_on_time` for a recurring task whose cursor
    is on time and which has no ``max_runs``; None for any other task (planned by :func:`plan_task`).

    Cron tasks sharing an expression, zone, end and cursor (a herd of ``* * * * *``) share one
    walk (:func:`_cron_window` is cached); an interval task is a few additions.
    """
    cursor = task.next_run_at
    if cursor is None or task.max_runs is not None or cursor < now - task.misfire_grace or task.calendar_id is not None:
        return None
    since = max(cursor, task.start_at)
    if task.cron:
        return _cron_window(task.cron, task.timezone, task.end_at, since, until)
    if task.interval is not None:
        return _interval_window(task.start_at, task.interval, task.end_at, since, until)
    return None


def _apply(tasks: Sequence[Plannable], *, now: datetime, until: datetime) -> list[int]:
    """Plan ``tasks`` (locked by the caller), create their executions and skipped occurrences,
    and move their cursors; return the new execution ids."""
    batch = _Batch()
    calendar_ids = {task.calendar_id for task in tasks if task.calendar_id is not None}
    calendars = calendars_load(calendar_ids) if calendar_ids else {}
    for task in tasks:
        window = _on_time_window(task, now=now, until=until)
        if window is None:
            batch.add_plan(task, plan_task(task, now=now, until=until, calendars=calendars))
        else:
            times, nxt = window
            batch.add(task, times, nxt, task.runs_materialised + len(times))
    ids = batch.insert()
    skipped_record(batch.skipped)
    batch.move_cursors()
    batch.audit_completed()
    if ids:
        notify_due()
    return ids


def materialise_task(*, task_id: uuid.UUID | str, until: datetime | None = None) -> list[int]:
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


def _commit_without_waiting_for_disk() -> None:
    """Let this transaction's commit return before its WAL reaches the disk.

    A pass of many batches then does not wait for a disk flush per batch. Safe for a
    materialiser batch: it is atomic and idempotent, so a database crash that loses
    it loses its executions and the cursor moves together, and the next pass makes them again.
    Nothing outside the database can depend on a lost batch: the monitor publishes an execution
    only after its own (synchronous) commit, and flushing that commit's WAL flushes this
    batch's, which precedes it.
    """
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit = off")


def _batch(*, now: datetime, until: datetime, size: int) -> tuple[int, bool]:
    """Lock up to ``size`` due tasks no other pass holds, materialise them, commit; return the
    executions created and whether the batch was full (more may be due)."""
    with transaction.atomic():
        _commit_without_waiting_for_disk()
        tasks = _lock_due(until=until, size=size)
        created = len(_apply(tasks, now=now, until=until)) if tasks else 0
    return created, len(tasks) == size


def _lock_due(*, until: datetime, size: int) -> list[DueTask]:
    """Lock up to ``size`` due tasks no other pass holds, earliest cursor first."""
    # The ORM's values_list costs more per row than the planning; the id is read as text, as it
    # is written back.
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_DUE_SQL, [TaskStatus.ACTIVE, until, size])
        return [DueTask._make(row) for row in cursor.fetchall()]


_LOCK_DUE_SQL = (
    "SELECT id::text, "  # noqa: S608 - the names are ours
    + ", ".join(f'"{column}"' for column in _DUE_COLUMNS[1:])
    + f""" FROM {Task._meta.db_table}
    WHERE status = %s AND next_run_at IS NOT NULL AND next_run_at <= %s
    ORDER BY next_run_at LIMIT %s FOR UPDATE SKIP LOCKED"""
)


def _drain(*, now: datetime, until: datetime, size: int) -> int:
    created, full = 0, True
    while full:
        count, full = _batch(now=now, until=until, size=size)
        created += count
    return created


def _drain_in_thread(*, now: datetime, until: datetime, size: int) -> int:
    try:
        return _drain(now=now, until=until, size=size)
    finally:
        connection.close()  # this thread's own connection


def materialise_due(*, horizon: float | None = None, batch: int | None = None, threads: int | None = None) -> int:
    """One materialiser pass over every active task due within the horizon; returns executions created.

    The first batch runs here. If it was full (a backlog: a cold start, a long outage), the rest
    is drained by ``threads`` threads with a connection each (``MATERIALISE_THREADS``): their
    batches never meet (SKIP LOCKED), and one plans in Python while another waits on the
    database. Inside a caller's transaction the pass stays on one connection.
    """
    started = time.perf_counter()
    try:
        if tracing.ON:
            # Scheduled runs start traces of their own (linked to their task), not the pass's.
            with tracing.pass_span("tms.materialiser.pass") as span, tracing.own_traces():
                created = _materialise_due(horizon=horizon, batch=batch, threads=threads)
                span.set_attribute("tms.created", created)
                if not created:
                    tracing.drop(span)
        else:
            created = _materialise_due(horizon=horizon, batch=batch, threads=threads)
    finally:
        # Failed passes too: a pass that times out against a slow database is what to see.
        metrics.MATERIALISER_PASS_SECONDS.observe(time.perf_counter() - started)
    metrics.MATERIALISED.inc(created)
    return created


def _materialise_due(*, horizon: float | None, batch: int | None, threads: int | None) -> int:
    conf = tms_settings()
    horizon = conf.MATERIALISE_HORIZON if horizon is None else horizon
    size = batch or conf.MATERIALISE_BATCH
    threads = threads or conf.MATERIALISE_THREADS
    now = db_now()
    until = now + timedelta(seconds=horizon)
    created, full = _batch(now=now, until=until, size=size)
    # Threads share the work through row locks (SKIP LOCKED), each on a connection of its own.
    parallel = threads > 1 and not connection.in_atomic_block
    if full and parallel:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="materialise") as pool:
            drains = [pool.submit(_drain_in_thread, now=now, until=until, size=size) for _ in range(threads)]
            created += sum(drain.result() for drain in drains)
    elif full:
        created += _drain(now=now, until=until, size=size)
    if created:
        logger.info("materialised %d executions", created)
    return created
