"""Task operations (writes). Views and admin call these; they hold the business rules."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import ForeignKey
from django.db.models.expressions import DatabaseDefault
from django.utils import timezone

from executions import transitions
from executions.materialiser import ACTOR as MATERIALISER
from executions.materialiser import materialise_task, plan_task, skipped_record, task_schedule
from executions.models import (
    OCCURRENCE_ORIGINS,
    Execution,
    ExecutionOrigin,
    ExecutionStatus,
    SkippedOccurrence,
    SkipReason,
    TaskRollup,
)
from executions.notify import notify_due
from executions.runs import CancelReport
from executions.services import executions_cancel_active, stop_external_runs
from executions.transitions import executions_create
from runners.registry import UnknownRunner, get_runner
from tasks_api.limits import limits_resolve, task_limit_names, task_set_limits
from tasks_api.workflows import After, after_links, after_resolve, task_after_entries, task_set_after
from tasks_app.audit import audit_diff, audit_record, audit_record_many, audit_values
from tasks_app.fields import AUDITED_COLUMNS, UPDATABLE_FIELDS
from tasks_app.masking import ENV_NAMES, environment_changed_names, environment_changes
from tasks_app.models import (
    MIN_MISFIRE_GRACE,
    Artifact,
    AuditAction,
    Calendar,
    CalendarPolicy,
    Task,
    TaskDependency,
    TaskStatus,
    TaskVersion,
    Team,
    TeamRole,
    claims_exclusive,
    status_for_cursor,
)
from tasks_app.quotas import quota_charge_executions, quota_check_tasks
from tasks_app.run_config import destination_moved, input_check, task_validate_runner
from tasks_app.schedules import Schedule, ScheduleError, shortest_gap, walk_limit
from tasks_app.secrets import (
    check_secret_fields,
    config_carry_secrets,
    config_masked,
    config_masked_pair,
    config_open,
    config_seal,
    config_unmask_kept,
)
from tasks_app.teams import require, team_for_new
from tasks_app.versions import NOT_VERSIONED, version_record, version_record_many, version_snapshot
from tms_core.bulk import JsonText, insert_columns, json_encoder
from tms_core.clock import db_now, local_words
from tms_core.conf import tms_settings
from tms_core.durations import format_duration
from tms_core.errors import ConflictError, GoneError, InvalidInput
from tms_core.together import sent_together


def task_check_secret_fields(*, config: Any, secret_fields: Any) -> None:
    """Raise :class:`InvalidInput` on ``secret_fields`` unless each path names something in ``config``."""
    errors = check_secret_fields(config, secret_fields)
    if errors:
        raise InvalidInput(errors)


def task_config(task: Task) -> dict[str, Any]:
    """The task's runner config with its secrets decrypted: for the runner (and edits), never for display."""
    opened: dict[str, Any] = config_open(task.config)
    return opened


def task_config_masked(task: Task) -> dict[str, Any]:
    """The task's runner config as people may see it: every secret value masked."""
    masked: dict[str, Any] = config_masked(task.runner, task.config, task.secret_fields or [])
    return masked


def _snapshot(task: Task, config: Any) -> dict[str, Any]:
    """The audited fields of ``task``, with ``config`` (already masked) in place of its own."""
    values = {
        name: getattr(task, name) for name in AUDITED_COLUMNS if name not in ("config", "artifact", "calendar", "team")
    }
    calendar = task.calendar.name if task.calendar_id is not None and task.calendar is not None else None
    artifact = str(task.artifact_id) if task.artifact_id else None
    return {**values, "config": config, "artifact": artifact, "calendar": calendar, "team": task.team_id}


def _audit_task(task: Task, action: str, *, changes: dict[str, Any] | None = None, detail: str = "") -> None:
    audit_record(
        action=action,
        object_type="task",
        object_id=task.pk,
        owner=task.owner_id,
        task_id=task.pk,
        changes=changes,
        detail=detail,
    )


#: The settings :func:`task_check_rules` reads.
RULE_FIELDS = (
    "interval",
    "cron",
    "start_at",
    "end_at",
    "retry_backoff",
    "retry_backoff_max",
    "jitter",
    "max_age",
    "dst_gap",
    "dst_fold",
    "calendar",
    "calendar_policy",
)


def task_check_rules(settings: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidInput` unless a task's settings (those of :data:`RULE_FIELDS` given;
    for an update, all of the task's with the changes merged) agree with each other. The create and update
    services apply them, so the API, the admin and the pages share them; the API's serializers
    call this too, to report them beside their own field errors."""
    errors: dict[str, list[str]] = {}
    if settings.get("interval") is not None and settings.get("cron"):
        errors["cron"] = ["Give an interval or a cron expression, not both."]
    start, end = settings.get("start_at"), settings.get("end_at")
    if start and end and end < start:
        errors["end_at"] = ["Must not be before start_at."]
    backoff, most = settings.get("retry_backoff"), settings.get("retry_backoff_max")
    if backoff is not None and most is not None and most < backoff:
        errors["retry_backoff_max"] = ["Must not be less than retry_backoff."]
    jitter, interval = settings.get("jitter") or timedelta(0), settings.get("interval")
    if interval is not None and jitter > interval:
        # The start window of one run would reach past the next run's fire time.
        errors["jitter"] = ["The start window (jitter) must not be longer than the interval."]
    max_age = settings.get("max_age")
    if max_age is not None and max_age < jitter + MIN_MISFIRE_GRACE:
        errors["max_age"] = ["Must be at least the start window (jitter) plus 1 s, or every run could expire."]
    if not settings.get("cron"):
        # DST rules choose what a cron schedule does when the clock changes: an interval is real
        # elapsed time and a one-shot time one instant: there they would be accepted and do nothing.
        for name in ("dst_gap", "dst_fold"):
            if settings.get(name):
                errors[name] = [
                    "Applies to cron schedules only: an interval or a one-shot time is not read on a clock."
                ]
    if settings.get("calendar_policy") and not settings.get("calendar"):
        errors["calendar_policy"] = ["Applies only with a calendar: give calendar too (or no calendar_policy)."]
    if errors:
        raise InvalidInput(errors)


def calendar_resolve(*, team_id: int, calendar: Any) -> Calendar | None:
    """The calendar of team ``team_id`` named ``calendar`` (a name, or a Calendar already chosen:
    checked to be the team's). A calendar of another team is reported exactly as a missing one (on
    ``calendar``): a task uses its own team's calendars only, and another team's do not leak."""
    if calendar in (None, ""):
        return None
    if isinstance(calendar, Calendar):
        if calendar.team_id == team_id:
            return calendar
        calendar = calendar.name
    found = Calendar.objects.filter(team_id=team_id, name=calendar).first()
    if found is None:
        raise InvalidInput.on(
            "calendar", f"The task's team has no calendar named {calendar!r} (GET /api/v1/calendars?team=...)."
        )
    return found


def _calendar_settings(team_id: int, spec: dict[str, Any]) -> None:
    """Resolve a spec's ``calendar`` (a name) to the team's calendar and give it its default
    policy (skip); a policy without a calendar is left for :func:`task_check_rules` to report."""
    if "calendar" in spec:
        spec["calendar"] = calendar_resolve(team_id=team_id, calendar=spec["calendar"])
    if spec.get("calendar") is not None and not spec.get("calendar_policy"):
        spec["calendar_policy"] = CalendarPolicy.SKIP
    elif spec.get("calendar") is None and "calendar_policy" in spec and spec["calendar_policy"] is None:
        spec["calendar_policy"] = CalendarPolicy.NONE


def artifact_check_team(*, team_id: int, artifact: Any) -> None:
    """A task runs only an artifact of its own team: another team's is an error on ``artifact``
    (the serializers already hide those of teams the caller is not in)."""
    if artifact is not None and getattr(artifact, "team_id", team_id) != team_id:
        raise InvalidInput.on("artifact", "This artifact belongs to another team: upload it to the task's team.")


def _check_rules(task: Task) -> None:
    task_check_rules({name: getattr(task, name) for name in RULE_FIELDS})


def task_check_min_interval(*, runner: str, schedule: Schedule, jitter: timedelta | None = None) -> None:
    """Raise :class:`InvalidInput` on ``schedule`` when it can fire more often than the runner's
    ``min_interval`` allows (its ``MIN_INTERVAL`` in ``TMS_RUNNERS``). A jitter can bring two
    fire times closer by up to itself, so it counts against the gap."""
    try:
        minimum = get_runner(runner).min_interval
    except UnknownRunner:
        return  # reported on "runner" by task_validate_runner
    gap = shortest_gap(schedule)
    if gap is None or not minimum:
        return
    effective = gap - (jitter or timedelta(0))
    if effective.total_seconds() < minimum:
        what = f"{gap.total_seconds():g} s apart"
        if jitter:
            what += f" ({effective.total_seconds():g} s with the jitter)"
        raise InvalidInput.on(
            "schedule",
            f"The {runner!r} runner allows at most one run every {minimum:g} s; this schedule fires {what}.",
        )


#: The fields :func:`_build_task` sets itself from its arguments (always checked); the others are
#: checked only when a spec gives them.
_BUILT = frozenset(
    {"name", "runner", "config", "secret_fields", "start_at", "interval", "cron", "timezone", "end_at"}
    | {"dst_gap", "dst_fold"}
)
_UNCHECKED = frozenset(field.name for field in Task._meta.concrete_fields) - _BUILT


class _TaskRows:
    """Builds a batch's unsaved tasks positionally (``Task(*values)``, Django's fast path) from
    one list of the model's defaults evaluated once per batch: by keywords each task looked up
    26 defaults and was the largest single item of a bulk create's profile."""

    def __init__(self) -> None:
        self.fields = Task._meta.concrete_fields
        self.index = {name: i for i, field in enumerate(self.fields) for name in {field.name, field.attname}}
        # Per task below: the primary key, and the two JSON fields (a shared dict would be shared).
        self.defaults = [
            None if field.name in ("id", "config", "secret_fields") else field.get_default() for field in self.fields
        ]

    def default(self, name: str) -> Any:
        return self.defaults[self.index[name]]

    def build(self, values: Mapping[str, Any]) -> Task:
        row = self.defaults.copy()
        related: list[tuple[ForeignKey, Any]] = []
        for name, value in values.items():
            try:
                index = self.index[name]
            except KeyError:
                raise TypeError(f"Task got an unexpected keyword argument {name!r}") from None
            field = self.fields[index]
            if isinstance(field, ForeignKey) and name == field.name and value is not None:
                related.append((field, value))
                value = value.pk
            row[index] = value
        row[self.index["id"]] = uuid.uuid4()
        task = Task(*row)  # type: ignore[misc]  # django-stubs types keyword construction only
        for field, value in related:
            field.set_cached_value(task, value)
        return task


def _build_task(
    *,
    rows: _TaskRows,
    owner: User,
    team: Team,
    now: datetime,
    runner: str,
    config: dict[str, Any] | None = None,
    name: str = "",
    start_at: datetime | None = None,
    interval: timedelta | None = None,
    cron: str = "",
    timezone: str = "UTC",
    end_at: datetime | None = None,
    dst_gap: str = "",
    dst_fold: str = "",
    **options: Any,
) -> Task:
    """A validated, unsaved Task whose cursor points at its first fire time."""
    given = {"interval": interval, "cron": cron, "start_at": start_at, "end_at": end_at}
    given |= {"dst_gap": dst_gap, "dst_fold": dst_fold}
    task_check_rules(
        {name: given[name] if name in given else options.get(name, rows.default(name)) for name in RULE_FIELDS}
    )
    config = config or {}
    task_validate_runner(runner=runner, config=config)
    secret_fields = options.pop("secret_fields", None) or []
    task_check_secret_fields(config=config, secret_fields=secret_fields)
    start_at = start_at or now
    try:
        schedule = Schedule(
            start_at=start_at,
            interval=interval,
            cron=cron,
            timezone=timezone,
            end_at=end_at,
            dst_gap=dst_gap,
            dst_fold=dst_fold,
        )
        first = next(schedule.fire_times(), None)
    except ScheduleError as exc:
        raise InvalidInput.on("schedule", str(exc)) from None
    task_check_min_interval(runner=runner, schedule=schedule, jitter=options.get("jitter"))
    task = rows.build(
        {
            **options,
            "owner": owner,
            "team": team,
            "name": name,
            "runner": runner,
            "config": config_seal(runner, config, secret_fields),
            "secret_fields": secret_fields,
            "start_at": start_at,
            "interval": interval,
            "cron": cron,
            "timezone": timezone,
            "end_at": end_at,
            "dst_gap": dst_gap,
            "dst_fold": dst_fold,
            "next_run_at": first,
            "status": TaskStatus.ACTIVE if first is not None else TaskStatus.COMPLETED,
        }
    )
    try:
        # Field checks only: the serializer validated the rest and the database's constraints
        # back it up (validating constraints here would cost a query each). A field left at its
        # model default is valid by construction: only the ones given are checked (their
        # validators were a third of a bulk create's Python time).
        exclude = _UNCHECKED - set(options)
        task.full_clean(exclude=exclude, validate_unique=False, validate_constraints=False)
    except DjangoValidationError as exc:
        raise InvalidInput(exc.message_dict) from None
    return task


def task_create(*, owner: User, runner: str, team: Team | None = None, **fields: Any) -> Task:
    """Create a task and, if its first run falls inside the horizon, its first executions.

    "Run now" therefore does not wait for the materialiser: the execution exists, and the monitor
    is notified, when this returns. It belongs to ``team`` (default: the owner's personal team),
    where the owner must be an editor.
    """
    (task,) = task_bulk_create(owner=owner, specs=[{"runner": runner, **fields}], team=team)
    return task


def task_bulk_create(*, owner: User, specs: Sequence[Mapping[str, Any]], team: Team | None = None) -> list[Task]:
    """Create many tasks in one transaction, with their executions inside the horizon.

    Every task belongs to ``team`` (default: the owner's personal team), in which the owner needs
    the editor role (PermissionDenied otherwise: 403).

    Every spec is validated before anything is written: one bad spec fails the whole call with
    its errors keyed by position (``{"3": {"interval": [...]}}``, :class:`InvalidInput`) and
    writes nothing. The team's task quota is checked once for the whole batch (under the
    team's quota lock, so concurrent creates take turns); the tasks, their audit entries and
    their executions are each one INSERT of column arrays, and the monitor is notified once.

    The tasks returned carry what the API shows of a new task (its state, when it next runs,
    its first execution) so that reading them back costs no query.
    """
    now = db_now()
    until = now + timedelta(seconds=tms_settings().MATERIALISE_HORIZON)
    tasks, errors, named = [], {}, []
    followed: list[list[After]] = []  # each task's ``after``
    resolved: dict[tuple[str, ...], list[Any]] = {}  # a batch names the same limits again and again
    builder = _TaskRows()
    team = team_for_new(owner, team, permission="tasks_app.add_task", what="this team's tasks")
    for index, spec in enumerate(specs):
        try:
            spec = dict(spec)
            names = tuple(spec.pop("limits", None) or ())
            chosen = resolved.get(names)
            if chosen is None:
                chosen = resolved[names] = limits_resolve(team_id=team.pk, names=names)
            after = after_resolve(team_id=team.pk, entries=spec.pop("after", None))
            _calendar_settings(team.pk, spec)
            artifact_check_team(team_id=team.pk, artifact=spec.get("artifact"))
            task = _build_task(rows=builder, owner=owner, team=team, now=now, **spec)
            task.has_limits = bool(chosen)
            if after:
                task.has_after = True
                if not any(spec.get(name) for name in ("start_at", "interval", "cron")):
                    # Following others with no schedule of its own: it runs only after them.
                    task.next_run_at, task.status = None, TaskStatus.ACTIVE
            tasks.append(task)
            named.append(chosen)
            followed.append(after)
        except InvalidInput as exc:
            errors[str(index)] = exc.errors
    if errors:
        raise InvalidInput(errors if len(specs) > 1 else next(iter(errors.values())))
    rows: list[transitions.NewExecution] = []
    skipped: list[Any] = []
    planned: list[int] = []  # how many of ``rows`` each task has, in order
    for task in tasks:
        if task.has_after and task.next_run_at is None:
            planned.append(0)  # nothing to plan: its runs come from its upstreams' ends
            continue
        plan = plan_task(task, now=now, until=until)
        rows += plan.rows
        skipped += plan.skipped
        planned.append(len(plan.rows))
        task.next_run_at, task.runs_materialised = plan.next_run_at, plan.runs
        task.status = status_for_cursor(next_run_at=plan.next_run_at, has_after=task.has_after)
    ids: list[int] = []
    with transaction.atomic():
        quota_check_tasks(team_id=team.pk, adding=len(tasks))
        # The writes below go to PostgreSQL in one round trip (the last one carries the others).
        with sent_together():
            _insert_tasks(tasks)
            links = [
                Task.limits.through(task_id=task.pk, limit_id=limit.pk)
                for task, chosen in zip(tasks, named, strict=True)
                for limit in chosen
            ]
            if links:
                Task.limits.through.objects.bulk_create(links)
            dependencies = after_links(tasks, followed)
            if dependencies:
                TaskDependency.objects.bulk_create(dependencies)
            snapshots = [
                _created_snapshot(task, sorted(limit.name for limit in chosen), [link.entry() for link in after])
                for task, chosen, after in zip(tasks, named, followed, strict=True)
            ]
            changes, versions = _created_json(snapshots)
            audit_record_many(
                [
                    {
                        "action": AuditAction.CREATE,
                        "object_type": "task",
                        "object_id": task.pk,
                        "owner": task.owner_id,
                        "task_id": task.pk,
                        "changes": text,
                    }
                    for task, text in zip(tasks, changes, strict=True)
                ]
            )
            # Version 1 of each (Task.version's default): what its first executions run with.
            version_record_many([(task.pk, 1, text, []) for task, text in zip(tasks, versions, strict=True)])
            skipped_record(skipped)
            if rows:
                notify_due()  # delivered at the commit: it can go first, with the executions
                ids = executions_create(rows=rows, actor=MATERIALISER)
    if len(ids) == len(rows):  # always, for new tasks: no occurrence of theirs existed
        _set_created_state(tasks, rows, ids, planned, now=now)
    return tasks


def _insert_tasks(tasks: list[Task]) -> None:
    """Insert ``tasks`` (built, unsaved) in one statement and mark them saved."""
    stamp = timezone.now()
    for task in tasks:
        task.created_at = task.updated_at = stamp  # what auto_now(_add) would set
    first = tasks[0]
    fields = [
        field
        for field in Task._meta.concrete_fields
        # A column left to its database default (none of the task's today) is not sent.
        if not isinstance(getattr(first, field.attname), DatabaseDefault)
    ]
    insert_columns(Task, {field.attname: [getattr(task, field.attname) for task in tasks] for field in fields})
    for task in tasks:
        task._state.adding = False
        task._state.db = "default"


def _created_snapshot(task: Task, limits: list[str], after: list[dict[str, str]]) -> dict[str, Any]:
    """A new task's audited values as the audit log stores them (config masked, and the names of
    its limits and the tasks it follows if it has any, as an update records them)."""
    snapshot = _snapshot(task, task_config_masked(task))
    if limits:
        snapshot["limits"] = limits
    if after:
        snapshot["after"] = after
    return audit_values(snapshot)


#: Values a batch's tasks share by the thousand (names, numbers, defaults): their JSON is made once.
_SHARED_JSON_TYPES = frozenset({str, int, float, bool, type(None)})


def _created_json(snapshots: Sequence[Mapping[str, Any]]) -> tuple[list[JsonText], list[JsonText]]:
    """Each new task's audit changes (every audited field from nothing to its value, as
    ``audit_diff({}, snapshot)`` gives them) and its first version's snapshot
    (:func:`~tasks_app.versions.version_snapshot`), as JSON text.

    The tasks of a batch share most of their values, so each field's part of both texts is
    encoded once per distinct value: encoding each task's two documents whole (about 50 fields
    each) was a fifth of a bulk create's time."""
    encode = json_encoder(DjangoJSONEncoder)
    parts: dict[tuple[str, type, Any], tuple[str, str]] = {}
    changes, versions = [], []
    for snapshot in snapshots:
        changed, versioned = [], []
        for name in sorted(snapshot):
            value = snapshot[name]
            shared = type(value) in _SHARED_JSON_TYPES
            # -0.0 == 0.0, yet each has its own text.
            memo = (name, type(value), value.hex() if type(value) is float else value) if shared else None
            part = parts.get(memo) if memo is not None else None
            if part is None:
                key, text = encode(name), encode(value)
                part = (
                    "" if value is None else f'{key}:{{"from":null,"to":{text}}}',
                    "" if name in NOT_VERSIONED else f"{key}:{text}",
                )
                if memo is not None:
                    parts[memo] = part
            if part[0]:
                changed.append(part[0])
            if part[1]:
                versioned.append(part[1])
        changes.append(JsonText("{" + ",".join(changed) + "}"))
        versions.append(JsonText("{" + ",".join(versioned) + "}"))
    return changes, versions


def _set_created_state(
    tasks: list[Task], rows: list[transitions.NewExecution], ids: list[int], planned: list[int], *, now: datetime
) -> None:
    """Give each new task the columns :func:`tasks_api.states.with_state` would read for it, and
    its first execution, from what was just written (rows and their ids in the order listed)."""
    start = 0
    for task, count in zip(tasks, planned, strict=True):
        mine = rows[start : start + count]
        due = min((row.due_at or row.scheduled_for for row in mine), default=None)
        columns = {
            "latest_status": ExecutionStatus.SCHEDULED if mine else None,
            "latest_due_status": ExecutionStatus.SCHEDULED if any(row.scheduled_for <= now for row in mine) else None,
            "next_run": min((when for when in (due, task.next_run_at) if when is not None), default=None),
            "first_execution": ids[start] if mine else None,
        }
        for name, value in columns.items():
            setattr(task, name, value)
        start += count


# --- changing a task ---------------------------------------------------------------------------

#: Fields whose change replaces the task's future executions: the schedule ...
SCHEDULE_FIELDS = frozenset(
    {"start_at", "interval", "cron", "timezone", "dst_gap", "dst_fold", "end_at", "max_runs", "jitter"}
    | {"calendar", "calendar_policy"}
)
#: ... and what each execution runs (executions copy the priority when they are created).
RUN_FIELDS = frozenset({"runner", "config", "priority"})


def _lock(task_id: uuid.UUID | str, *, no_key: bool = False) -> Task:
    task = Task.objects.select_for_update(no_key=no_key).filter(pk=task_id).exclude(status=TaskStatus.DELETED).first()
    if task is None:
        raise GoneError("The task no longer exists.")
    return task


def _clean(task: Task) -> None:
    try:
        task.full_clean(exclude=["owner", "team"], validate_constraints=True)
    except DjangoValidationError as exc:
        raise InvalidInput(exc.message_dict) from None


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


def task_update(*, task: Task, actor: str, changes: Mapping[str, Any], detail: str = "") -> Task:
    """Apply a partial update (``changes`` validated by the API) to a task.

    A change to the schedule, the runner, its config or the priority replaces the task's future:
    its scheduled executions that have not started (SCHEDULED or PENDING) are cancelled as
    superseded, the materialisation cursor is reset from the new schedule, at the earliest of
    them or now (a one-shot task whose ``start_at`` changed starts from the new ``start_at``),
    and the task is materialised again. Running executions, retries of ones that already ran and
    history are left alone. ``detail``: what the change was (a restore of a version), audited.
    """
    unknown = set(changes) - UPDATABLE_FIELDS
    if unknown:
        raise InvalidInput({name: ["This field cannot be changed."] for name in sorted(unknown)})
    changes = dict(changes)
    new_limits = changes.pop("limits", None)
    new_after = changes.pop("after", None)
    with transaction.atomic():
        task = _lock(task.pk)
        if "calendar" in changes or "calendar_policy" in changes:
            merged = {"calendar": task.calendar, "calendar_policy": task.calendar_policy, **changes}
            if "calendar" in changes and changes["calendar"] in (None, "") and "calendar_policy" not in changes:
                merged["calendar_policy"] = CalendarPolicy.NONE  # no calendar: no policy
            if "calendar" in changes and "calendar_policy" not in changes and task.calendar_id is None:
                merged["calendar_policy"] = ""  # a first calendar takes the default policy
            _calendar_settings(task.team_id, merged)
            changes["calendar"], changes["calendar_policy"] = merged["calendar"], merged["calendar_policy"] or ""
        sealed, plain = task.config, task_config(task)
        before = (task.runner, plain, list(task.secret_fields or []))
        snapshot_before = _snapshot(task, None)
        limits_changed = False
        if new_limits is not None:
            chosen = limits_resolve(team_id=task.team_id, names=new_limits)
            old_names = task_limit_names(task)
            if sorted(limit.name for limit in chosen) != old_names:
                task_set_limits(task=task, limits=chosen)
                limits_changed = True
                snapshot_before["limits"] = old_names
        after_changed = False
        if new_after is not None:
            old_after = task_after_entries(task)
            if task_set_after(task=task, after=after_resolve(team_id=task.team_id, entries=new_after, task_id=task.pk)):
                after_changed = True
                snapshot_before["after"] = old_after
        kept = None  # no config sent: every stored secret is kept
        if "config" in changes:
            # A secret sent back as its mask keeps its stored value.
            changes["config"], kept = config_unmask_kept(changes["config"], plain)
        task.config = plain  # compared and validated in the clear; sealed again below
        changed = {name for name, value in changes.items() if getattr(task, name) != value}
        for name in changed:
            setattr(task, name, changes[name])
        if changed & set(RULE_FIELDS):
            _check_rules(task)
        if changed & {"runner", "config"}:
            task.config = task_validate_runner(runner=task.runner, config=task.config)
        dropped: list[str] = []
        if changed & {"runner", "config", "secret_fields", "artifact"}:
            # A stored secret is never shown again, and never follows a run pointed elsewhere.
            moved = destination_moved(before, (task.runner, task.config), artifact="artifact" in changed)
            task.config, dropped = config_carry_secrets(
                before, (task.runner, task.config, list(task.secret_fields or [])), kept=kept, moved=moved
            )
            if dropped:
                changed.add("config")
                task.config = task_validate_runner(runner=task.runner, config=task.config)
                # A path of secret_fields whose value was dropped names nothing now: it goes too.
                fields = [path for path in task.secret_fields or [] if not check_secret_fields(task.config, [path])]
                if fields != list(task.secret_fields or []):
                    task.secret_fields = fields
                    changed.add("secret_fields")
        if changed & {"config", "secret_fields"}:
            task_check_secret_fields(config=task.config, secret_fields=task.secret_fields)
        after = (task.runner, task.config, list(task.secret_fields or []))
        if changed & {"runner", "config", "secret_fields"}:
            task.config = config_seal(*after)
        else:
            task.config = sealed
        try:
            schedule = task_schedule(task)
        except ScheduleError as exc:
            raise InvalidInput.on("schedule", str(exc)) from None
        if changed & (SCHEDULE_FIELDS | {"runner"}):
            task_check_min_interval(runner=task.runner, schedule=schedule, jitter=task.jitter)
        _clean(task)
        replace = bool(changed & (SCHEDULE_FIELDS | RUN_FIELDS))
        if replace:
            what = "schedule" if changed & SCHEDULE_FIELDS else ", ".join(sorted(changed & RUN_FIELDS))
            superseded = _supersede(
                task,
                only_from=frozenset({ExecutionStatus.SCHEDULED, ExecutionStatus.PENDING}),
                actor=actor,
                reason=f"replaced: the task's {what} changed",
            )
            since = min([db_now(), *superseded])
            if not schedule.recurring and "start_at" in changed:
                since = task.start_at
            _forget_calendar_skips(task, since)
            _set_cursor(task, next(schedule.fire_times(since=since), None), schedule)
        if task.status == TaskStatus.COMPLETED and task.has_after:
            # A task that follows others is not completed by its own schedule's end
            # (status_for_cursor); one left COMPLETED (before that rule, or by the end of its
            # schedule while it followed nothing) comes back with any change, after included.
            task.status = TaskStatus.ACTIVE
        if changed & {"overlap_policy", "max_concurrency"}:
            # Claims read the policy and the cap from the task; the flag only routes them to the check.
            Execution.objects.filter(task=task, status__in=(ExecutionStatus.SCHEDULED, ExecutionStatus.PENDING)).update(
                exclusive=claims_exclusive(
                    overlap_policy=task.overlap_policy, max_concurrency=task.max_concurrency, has_limits=task.has_limits
                )
            )
        task.save()
        if task.status != snapshot_before["status"]:
            changed.add("status")  # audited with the rest (not versioned)
        if changed or limits_changed or after_changed:
            masked_before, masked_after = config_masked_pair(before, after)
            snapshot_after = {**_snapshot(task, None), "config": masked_after}
            if limits_changed:
                snapshot_after["limits"] = task_limit_names(task)
            if after_changed:
                snapshot_after["after"] = task_after_entries(task)
            diff = audit_diff({**snapshot_before, "config": masked_before}, snapshot_after)
            # Every value of an environment is masked: the names say what a change set (PYTHONWARNINGS ...).
            env_names = environment_changes(before[1], after[1]) if "config" in changed else {}
            dropped_words = f"secrets dropped (the run goes elsewhere): {', '.join(dropped)}" if dropped else ""
            _audit_task(
                task,
                AuditAction.UPDATE,
                changes=diff | ({ENV_NAMES: env_names} if env_names else {}),
                detail="; ".join(part for part in (detail, dropped_words) if part),
            )
            # The version's config masks every secret alike (a diff names a changed one: ``changed``).
            snapshot_version = {**snapshot_after, "config": config_masked(*after)}
            versioned = [name for name in diff if name not in NOT_VERSIONED]
            if versioned:  # a change of status alone is no new version
                _new_version(
                    task,
                    before={**snapshot_before, "config": masked_before},
                    after=snapshot_version,
                    changed=[*versioned, *environment_changed_names(env_names)],
                )
        if replace and task.status == TaskStatus.ACTIVE:
            materialise_task(task_id=task.pk)
    task.refresh_from_db()
    return task


def _new_version(task: Task, *, before: dict[str, Any], after: dict[str, Any], changed: list[str]) -> None:
    """Record a change of ``task`` (saved, locked) as its next version, before anything creates
    executions from it (they copy ``Task.version`` as they are inserted). A task older than
    versions gets its settings before the change recorded first, as the version it was at.
    ``changed``: the settings that differ, and each environment variable a config change added,
    removed or gave another value (``config.env.NAME``: its value reads masked on both sides)."""
    # Limits as a create records them: their names when there are any, else no key (the audit's
    # snapshots name them only when they changed).
    names = task_limit_names(task) if task.has_limits else []
    after = {key: value for key, value in after.items() if key != "limits"} | ({"limits": names} if names else {})
    if "limits" not in before:
        before = {**before, "limits": names}  # unchanged by this update
    if not before["limits"]:
        before = {key: value for key, value in before.items() if key != "limits"}
    # The tasks it follows, the same way (a create names them when there are any).
    follows = task_after_entries(task) if task.has_after else []
    after = {key: value for key, value in after.items() if key != "after"} | ({"after": follows} if follows else {})
    if "after" not in before:
        before = {**before, "after": follows}
    if not before["after"]:
        before = {key: value for key, value in before.items() if key != "after"}
    if not TaskVersion.objects.filter(task_id=task.pk).exists():
        version_record(task_id=task.pk, number=task.version, snapshot=version_snapshot(before), changed=[])
    task.version += 1
    Task.objects.filter(pk=task.pk).update(version=task.version)
    version_record(task_id=task.pk, number=task.version, snapshot=version_snapshot(after), changed=changed)


def _move_refusals(task: Task, team: Team, replacing: Collection[str]) -> dict[str, list[str]]:
    """What keeps ``task`` in its team: a calendar or named limits of its team (a task uses its
    own team's only; global limits go anywhere) that the same request does not replace
    (``replacing``: the fields it changes too), an artifact of its team (never replaced: a task's
    artifact is fixed at creation), notification rules of its team made for this task (they
    would speak through the old team's channel about another team's task), and ``after`` links
    to or from tasks of its team (a workflow runs within one team: links never cross teams)."""
    errors: dict[str, list[str]] = {}
    if "calendar" not in replacing and task.calendar_id is not None:
        calendar = Calendar.objects.filter(pk=task.calendar_id).values_list("name", "team_id").first()
        if calendar is not None and calendar[1] != team.pk:
            errors["calendar"] = [
                f"The task uses calendar {calendar[0]!r} of its current team: give a calendar of the new team "
                "(or null) in the same request."
            ]
    if "limits" not in replacing and task.has_limits:
        names = sorted(task.limits.exclude(team__isnull=True).exclude(team_id=team.pk).values_list("name", flat=True))
        if names:
            errors["limits"] = [
                f"The task uses limits of its current team ({', '.join(map(repr, names))}): give limits of the new "
                "team (or global ones, or []) in the same request."
            ]
    if task.artifact_id is not None and not Artifact.objects.filter(pk=task.artifact_id, team_id=team.pk).exists():
        # A task's artifact is set when it is created and never changed.
        errors["artifact"] = [
            "The task runs an artifact of its current team, and a task's artifact does not change: upload the "
            "artifact to the new team and create the task there."
        ]
    # A workflow runs within one team: the tasks it follows and the tasks that follow it move
    # with it or not at all (its own ``after`` may be replaced in the same request).
    if "after" not in replacing and task.has_after:
        upstreams = TaskDependency.objects.filter(task_id=task.pk).exclude(upstream__team_id=team.pk)
        if upstreams.exists():
            errors["after"] = [
                "The task follows tasks of its current team: give an after of the new team's tasks (or []) "
                "in the same request."
            ]
    followers = sorted(
        str(pk)
        for pk in TaskDependency.objects.filter(upstream_id=task.pk)
        .exclude(task__status=TaskStatus.DELETED)
        .exclude(task__team_id=team.pk)
        .values_list("task_id", flat=True)[:10]
    )
    if followers:
        errors.setdefault("team", []).append(
            f"Tasks of the current team follow this task ({', '.join(followers)}): change their after first."
        )
    # The rules' app sits above this one: read through the relation it declares on tasks.
    rules = list(task.notification_rules.exclude(team_id=team.pk).values_list("pk", flat=True)[:10])
    if rules:
        errors.setdefault("team", []).append(
            f"Notification rules of the current team are set for this task (ids {', '.join(map(str, rules))}): "
            "delete them first (and make new ones in the new team)."
        )
    return errors


def task_move(*, task: Task, team: Team, user: User, replacing: Collection[str] = ()) -> Task:
    """Move ``task`` (its executions, past and future, and its hours of the dashboard's tasks
    failing most) to ``team``: ``user`` needs the editor role in both teams (PermissionDenied
    otherwise). Audited as an update of ``team``. A task not deleted counts against ``team``'s
    task quota from then on: :class:`InvalidInput` when the team holds as many as its quota
    allows.

    A task uses only its own team's calendars, limits and artifacts: a move is refused (400 on the
    field) while the task uses ones of its old team that ``replacing`` (the fields the same
    request changes, applied after the move) does not replace, runs an artifact of its old team,
    or has notification rules of the old team set for it (:func:`_move_refusals`).

    The task's row is locked FOR UPDATE, which waits for (and then blocks) every insert of one of
    its executions (they lock it FOR KEY SHARE and copy its team): no run is left in the old team.
    """
    require(user, task.team_id, TeamRole.EDITOR, "tasks_app.change_task")
    require(user, team.pk, TeamRole.EDITOR, "tasks_app.change_task", what="that team's tasks")
    with transaction.atomic():
        task = _lock(task.pk)
        if task.team_id == team.pk:
            return task
        refusals = _move_refusals(task, team, replacing)
        if refusals:
            raise InvalidInput(refusals)
        if task.status != TaskStatus.DELETED:
            quota_check_tasks(team_id=team.pk, adding=1)
        before = Team.objects.filter(pk=task.team_id).values_list("slug", flat=True).first()
        Task.objects.filter(pk=task.pk).update(team=team, updated_at=timezone.now())
        Execution.objects.filter(task_id=task.pk).update(team_id=team.pk)
        # Its hours of the dashboard's "failing most" go with it, as its runs do; the per-minute
        # figures (by team and runner, not by task) keep counting its past runs in the old team.
        TaskRollup.objects.filter(task_id=task.pk).update(team_id=team.pk)
        task.team = team
        _audit_task(task, AuditAction.UPDATE, changes={"team": {"from": before, "to": team.slug}}, detail="moved")
    return task


def task_pause(*, task: Task, actor: str) -> Task:
    """Pause a task: no new executions are materialised, and its SCHEDULED executions (not yet
    published) are cancelled. Never-started occurrences are superseded and the cursor moves back
    to the earliest of them, so :func:`task_resume` materialises them again (or, if their time has
    passed by then, applies the misfire policy). Executions already published or running go on.
    Pausing a paused task changes nothing.
    """
    with transaction.atomic():
        task = _lock(task.pk)
        if task.status == TaskStatus.PAUSED:
            return task
        previous = task.status
        scheduled = frozenset({ExecutionStatus.SCHEDULED})
        superseded = _supersede(task, only_from=scheduled, actor=actor, reason="paused")
        # Retries and triggered runs waiting in SCHEDULED are cancelled too (not superseded).
        for pk in Execution.objects.filter(task=task, status=ExecutionStatus.SCHEDULED).values_list("pk", flat=True):
            transitions.execution_cancel(execution_id=pk, actor=actor, reason="paused", only_from=scheduled)
        if superseded:
            cursor = min([*superseded, *([task.next_run_at] if task.next_run_at else [])])
            _set_cursor(task, cursor, task_schedule(task))
        task.status = TaskStatus.PAUSED
        # Occurrences missed from now until the resume are recorded as "paused".
        task.paused_at = db_now()
        task.save()
        _audit_task(task, AuditAction.PAUSE, changes={"status": {"from": previous, "to": TaskStatus.PAUSED}})
    task.refresh_from_db()
    return task


def task_resume(*, task: Task, actor: str) -> Task:
    """Resume a paused task: it becomes ACTIVE and is materialised at once from its cursor; the
    materialiser applies the task's misfire policy to occurrences whose time passed while it was
    paused (skip them, run the latest once, or run them all). A COMPLETED task that follows
    others (left so before :func:`~tasks_app.models.status_for_cursor` kept such tasks active)
    becomes ACTIVE too. Resuming any other task changes nothing.
    """
    with transaction.atomic():
        task = _lock(task.pk)
        previous = task.status
        if previous != TaskStatus.PAUSED and not (previous == TaskStatus.COMPLETED and task.has_after):
            return task
        task.status = TaskStatus.ACTIVE
        task.save(update_fields=["status", "updated_at"])
        _audit_task(task, AuditAction.RESUME, changes={"status": {"from": previous, "to": TaskStatus.ACTIVE}})
        materialise_task(task_id=task.pk)
    task.refresh_from_db()
    return task


@dataclass(frozen=True)
class Trigger:
    """What a trigger (run now) did: the run it created, or the debounced run it joined."""

    execution: Execution
    #: True when the task's ``trigger_debounce`` folded this trigger into a run not started yet.
    joined: bool = False
    #: The run waits for the task's ``trigger_debounce`` before it is due (created or joined).
    debounced: bool = False


def task_check_input(*, task: Task, run_input: dict[str, Any] | None) -> None:
    """Raise :class:`InvalidInput` on ``input`` unless ``run_input`` may be given to a run of
    ``task`` (:func:`tasks_app.run_config.input_check`)."""
    input_check(task=task, run_input=run_input)


def task_trigger(*, task: Task, actor: str, run_input: dict[str, Any] | None = None) -> Trigger:
    """Run a task now, once, outside its schedule (whatever its status, unless deleted): a new
    execution due now, given ``run_input`` (checked by :func:`task_check_input`: 400 on
    ``input``). It counts against the hourly execution quota of the task's team
    (:class:`~tms_core.errors.QuotaExceeded` when used up).

    With ``trigger_debounce`` the run is due that long from now instead, and a trigger while a
    run of an earlier trigger is still waiting for its time joins that run: no new execution,
    nothing counted, the join audited. The run keeps its due time (the first trigger's) and takes
    the joining trigger's input: **the last input wins** (a burst of events runs once, on the
    latest). The task's row is locked for the decision, so concurrent triggers join one run.
    """
    task_check_input(task=task, run_input=run_input)
    for _ in range(3):  # a clash with an occurrence at the very same microsecond is retried
        with transaction.atomic():
            if task.trigger_debounce is not None:
                # FOR NO KEY UPDATE: debounced triggers of the task take turns, while the inserts
                # of executions (FOR KEY SHARE of the task, after the team's quota lock, as a
                # backfill takes them) are not blocked: a full lock here, before the quota's,
                # could deadlock with them.
                task = _lock(task.pk, no_key=True)
                waiting = _debounced_run(task)
                if waiting is not None and transitions.execution_join_trigger(
                    execution_id=waiting.pk, run_input=run_input
                ):
                    waiting.input = run_input
                    _audit_task(
                        task, AuditAction.TRIGGER, changes={"execution": waiting.pk}, detail=f"joined {waiting.pk}"
                    )
                    return Trigger(waiting, joined=True, debounced=True)
                # None waiting, or it was taken since it was read: this trigger's run is a new one.
            # Counted (under the team's quota lock) in the transaction that creates it.
            quota_charge_executions(team_id=task.team_id, count=1)
            new_id = transitions.execution_trigger(
                task_id=task.pk,
                actor=actor,
                detail=_trigger_detail(task, actor),
                delay=task.trigger_debounce,
                run_input=run_input,
            )
            if new_id is None:
                transaction.set_rollback(True)  # nothing created: nothing counted
            else:
                _audit_task(task, AuditAction.TRIGGER, changes={"execution": new_id}, detail=f"execution {new_id}")
        if new_id is not None:
            notify_due()
            return Trigger(Execution.objects.get(pk=new_id), debounced=task.trigger_debounce is not None)
        if not Task.objects.filter(pk=task.pk).exclude(status=TaskStatus.DELETED).exists():
            raise GoneError("The task no longer exists.")
    raise ConflictError("Could not trigger the task; try again.")  # pragma: no cover


def trigger_words(trigger: Trigger) -> str:
    """What a trigger did, in words, for the pages, the admin and the commands."""
    execution = trigger.execution
    if trigger.joined:
        return f"joined execution {execution.pk}, the debounced run due {execution.due_at:%Y-%m-%d %H:%M:%S} UTC"
    if trigger.debounced:
        return f"execution {execution.pk} created, due {execution.due_at:%Y-%m-%d %H:%M:%S} UTC (debounced)"
    return f"execution {execution.pk} created, due now"


def _trigger_detail(task: Task, actor: str) -> str:
    if task.trigger_debounce is None:
        return f"triggered by {actor}"
    return f"triggered by {actor}; debounced: due in {format_duration(task.trigger_debounce)}, later triggers join it"


def _debounced_run(task: Task) -> Execution | None:
    """The task's triggered run still waiting for its debounce time to pass (due in the future),
    if any: the run a trigger now joins."""
    waiting = Execution.objects.filter(
        task=task, origin=ExecutionOrigin.TRIGGER, status=ExecutionStatus.SCHEDULED, due_at__gt=db_now()
    )
    return waiting.order_by("due_at", "id").first()


@dataclass(frozen=True)
class TaskDeleteReport:
    task_id: uuid.UUID
    executions: list[CancelReport]

    @property
    def may_still_run(self) -> bool:
        """Whether an external run may still be going (its runner could not stop it)."""
        return any(report.may_still_run for report in self.executions)


def task_delete(*, task: Task, actor: str) -> TaskDeleteReport:
    """Delete a task (softly: its history stays): no further runs; its SCHEDULED and PENDING
    executions are cancelled, and RUNNING ones are cancelled and their external runs stopped
    through the runner where it supports it. The report says what happened to each.
    """
    with transaction.atomic():
        task = _lock(task.pk)
        previous = task.status
        task.status = TaskStatus.DELETED
        task.next_run_at = None
        task.save(update_fields=["status", "next_run_at", "updated_at"])
        cancelled = executions_cancel_active(task=task, actor=actor, reason="task deleted")
        _audit_task(
            task,
            AuditAction.DELETE,
            changes={"status": {"from": previous, "to": TaskStatus.DELETED}},
            detail=f"{sum(1 for _, outcome in cancelled if outcome.won)} active execution(s) cancelled",
        )
    # External runs are stopped after the commit: a slow runner never holds row locks.
    return TaskDeleteReport(task.pk, stop_external_runs(task=task, cancelled=cancelled))


@dataclass(frozen=True)
class BackfillReport:
    task_id: uuid.UUID
    start: datetime
    end: datetime
    execution_ids: list[int]
    #: Fire times in the range that already had an execution (run, running or waiting).
    existing: int
    #: Fire times the range holds (created + existing): 0 says the schedule has none there.
    fire_times: int = 0
    #: What the backfill did, in words (the range in the task's time zone, to the second).
    detail: str = ""


def task_backfill(*, task: Task, start: datetime, end: datetime, actor: str) -> BackfillReport:
    """Run a task's past fire times in ``[start, end]`` that have no execution yet: one new
    execution each, all due now. They are claimed under the task's overlap policy like any other
    run. At most ``TMS_BACKFILL_MAX`` fire times per call (a wider range is :class:`InvalidInput`);
    ``end`` must not be in the future. Fire times already run, running or waiting are counted in
    ``existing`` and not created again; ``detail`` says what was done, and a range that holds
    no fire time of the task says so ("No fire times between ... and ..."). The executions
    created count against the team's hourly execution quota: all of them fit, or none is
    created (:class:`~tms_core.errors.QuotaExceeded`).
    """
    backfill_max = tms_settings().BACKFILL_MAX
    now = db_now()
    errors: dict[str, list[str]] = {}
    if end < start:
        errors["end"] = ["Must not be before start."]
    if end > now:
        errors["end"] = ["Must not be in the future: backfill covers past fire times."]
    if errors:
        raise InvalidInput(errors)
    if task.status == TaskStatus.DELETED:
        raise GoneError("The task no longer exists.")
    times: list[datetime] = []
    with walk_limit("end", "Fire times up to this time"):
        for when in task_schedule(task).fire_times(since=start):
            if when > end:
                break
            if len(times) == backfill_max:
                raise InvalidInput.on(
                    "end",
                    f"The range holds more than {backfill_max} fire times (TMS_BACKFILL_MAX); "
                    "backfill a shorter range.",
                )
            times.append(when)
    existing = set(
        Execution.objects.filter(task=task, scheduled_for__in=times, superseded=False).values_list(
            "scheduled_for", flat=True
        )
    )
    exclusive = claims_exclusive(
        overlap_policy=task.overlap_policy, max_concurrency=task.max_concurrency, has_limits=task.has_limits
    )
    rows = [
        transitions.NewExecution(task.pk, when, task.priority, due_at=now, exclusive=exclusive)
        for when in times
        if when not in existing
    ]
    with transaction.atomic():
        quota_charge_executions(team_id=task.team_id, count=len(rows), field="end")
        ids = executions_create(
            rows=rows,
            actor=actor,
            detail=f"backfill of {start.isoformat()} to {end.isoformat()}",
            origin=ExecutionOrigin.BACKFILL,
        )
        _audit_task(
            task,
            AuditAction.BACKFILL,
            changes={
                "start": start.isoformat(),
                "end": end.isoformat(),
                "created": len(ids),
                "existing": len(times) - len(ids),
            },
        )
    if ids:
        notify_due()
    between = f"between {local_words(start, task.timezone)} and {local_words(end, task.timezone)}"
    if not times:
        detail = f"No fire times {between}: nothing to backfill."
    else:
        detail = (
            f"{len(times)} fire time(s) {between}: {len(ids)} execution(s) created, due now; "
            f"{len(times) - len(ids)} already had one."
        )
    return BackfillReport(task.pk, start, end, ids, len(times) - len(ids), len(times), detail)
