"""Creating tasks, one (:func:`task_create`) or a batch (:func:`task_bulk_create`): every spec
validated first, then the tasks, their limits and after links, audit entries (each the task's
version 1 as well, written from it when first needed) and the executions inside the horizon
written in one transaction. A batch of thousands is the bulk API's path, so rows and their JSON
are built once per batch (docs/benchmarks.md)."""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import ForeignKey
from django.db.models.base import ModelState
from django.db.models.expressions import DatabaseDefault
from django.db.models.signals import post_init, pre_init
from django.utils import timezone

from executions import transitions
from executions.materialiser import ACTOR as MATERIALISER
from executions.materialiser import plan_task, skipped_record
from executions.models import ExecutionStatus, SkippedOccurrence
from executions.notify import notify_due
from executions.transitions import executions_create
from tasks_api.checks import (
    RULE_FIELDS,
    _calendar_settings,
    artifact_check_team,
    task_check_min_interval,
    task_check_rules,
)
from tasks_api.limits import limits_resolve
from tasks_api.task_config import task_check_secret_fields, task_config_masked
from tasks_api.task_writes import _snapshot
from tasks_api.workflows import After, after_links, after_resolve, join_check_links, join_parse, map_check
from tasks_app.audit import audit_record_many, audit_value
from tasks_app.models import (
    AuditAction,
    JoinRule,
    Limit,
    Task,
    TaskDependency,
    TaskStatus,
    Team,
    TeamQuota,
    status_for_cursor,
)
from tasks_app.quotas import quota_check_tasks, quota_tasks_unlimited
from tasks_app.run_config import task_validate_runner
from tasks_app.schedules import Schedule, ScheduleError
from tasks_app.secrets import config_seal
from tasks_app.teams.services import team_for_new
from tms_core import bulk, tracing
from tms_core.auth import token_team_id
from tms_core.bulk import JsonText, insert_columns, json_encoder
from tms_core.clock import db_now
from tms_core.conf import tms_settings
from tms_core.errors import InvalidInput
from tms_core.together import sent_together

#: The fields :func:`_build_task` sets itself from its arguments (always checked); the others are
#: checked only when a spec gives them.
_BUILT = frozenset(
    {"name", "runner", "config", "secret_fields", "start_at", "interval", "cron", "timezone", "end_at"}
    | {"dst_gap", "dst_fold"}
)
_UNCHECKED = frozenset(field.name for field in Task._meta.concrete_fields) - _BUILT


#: Values whose field check a batch's tasks share (a check depends on the value only): made once.
#: Not a datetime: two equal instants in two zones are two values.
_CHECKED_ONCE_TYPES = frozenset({str, int, bool, float, timedelta, uuid.UUID})


class _TaskRows:
    """Builds a batch's unsaved tasks positionally from one list of the model's defaults evaluated
    once per batch (by keywords each task looked up 26 defaults and was the largest single item of
    a bulk create's profile), and checks their fields, each distinct value once per batch."""

    def __init__(self) -> None:
        self.fields = Task._meta.concrete_fields
        self.attnames = [field.attname for field in self.fields]
        self.index = {name: i for i, field in enumerate(self.fields) for name in {field.name, field.attname}}
        # Per task below: the primary key, and the two JSON fields (a shared dict would be shared).
        self.defaults = [
            None if field.name in ("id", "config", "secret_fields") else field.get_default() for field in self.fields
        ]
        # Model.__init__ sets each attribute through its descriptor and sends pre_init and
        # post_init: with no receiver of either, a new task's attributes are set at once (a
        # tenth of a bulk create's Python time went to Task(*values)).
        self.direct = not (pre_init.has_listeners(Task) or post_init.has_listeners(Task))
        self.checked: dict[tuple[str, type, Any], Any] = {}  # (field, type, value) -> its cleaned value

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
        if self.direct:
            task = Task.__new__(Task)
            task._state = ModelState()
            task.__dict__.update(zip(self.attnames, row, strict=True))
        else:
            task = Task(*row)  # type: ignore[misc]  # django-stubs types keyword construction only
        for field, value in related:
            field.set_cached_value(task, value)
        return task

    def check(self, task: Task, given: set[str]) -> None:
        """``task.full_clean()`` of the fields :func:`_build_task` sets and those in ``given``
        (no uniqueness or constraint checks), each field's check of a value shared by the batch's
        tasks made once: Django's DjangoValidationError of every field that fails."""
        errors: dict[str, Any] = {}
        for field in Task._meta.fields:
            name = field.name
            if (name in _UNCHECKED and name not in given) or getattr(field, "generated", False):
                continue
            raw = getattr(task, field.attname)
            if field.blank and raw in field.empty_values:
                continue
            kind = type(raw)
            memo = (name, kind, raw.hex() if kind is float else raw) if kind in _CHECKED_ONCE_TYPES else None
            if memo is not None and memo in self.checked:
                value = self.checked[memo]
            else:
                try:
                    value = field.clean(raw, task)
                except DjangoValidationError as exc:
                    errors[name] = exc.error_list
                    continue
                if memo is not None:
                    self.checked[memo] = value
            setattr(task, field.attname, value)
        try:
            task.clean()
        except DjangoValidationError as exc:
            errors = exc.update_error_dict(errors)
        if errors:
            raise DjangoValidationError(errors)


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
        rows.check(task, set(options))
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
    unlimited: bool | None = None  # the team's task quota, when read with the time and the team
    found = _personal_team(owner) if team is None and token_team_id(owner) is None else None
    if found is not None:
        now, team, unlimited = found
    else:
        now = db_now()
    until = now + timedelta(seconds=tms_settings().MATERIALISE_HORIZON)
    team = team_for_new(owner, team, permission="tasks_app.add_task", what="this team's tasks")
    tasks, named, followed = _build_tasks(specs, owner=owner, team=team, now=now)
    rows, skipped, planned = _plan_tasks(tasks, now=now, until=until)
    ids: list[int] = []
    with contextlib.nullcontext() if _one_trip(tasks, named, followed, skipped, unlimited) else transaction.atomic():
        quota_check_tasks(team_id=team.pk, adding=len(tasks), unlimited=unlimited)
        # The writes below go to PostgreSQL in one round trip (the last one carries the others).
        with sent_together():
            _insert_tasks(tasks)
            _insert_links(tasks, named, followed)
            _record_created(tasks, named, followed)
            skipped_record(skipped)
            if rows:
                notify_due()  # delivered at the commit: it can go first, with the executions
                ids = executions_create(rows=rows, actor=MATERIALISER)
    if len(ids) == len(rows):  # always, for new tasks: no occurrence of theirs existed
        _set_created_state(tasks, rows, ids, planned, now=now)
    return tasks


@functools.cache
def _personal_team_statement() -> tuple[str, list[str]]:
    """The database's time, the owner's personal team and its task quota, in one statement."""
    quote = connection.ops.quote_name
    columns = [str(field.attname) for field in Team._meta.concrete_fields]
    quota, team = TeamQuota._meta, Team._meta
    limit = quote(str(quota.get_field("max_tasks").column))
    quota_team = quote(str(getattr(quota.pk, "column", "team_id")))
    team_id, personal = quote(str(getattr(team.pk, "column", "id"))), quote(str(team.get_field("personal_of").column))
    selected = ", ".join(f"t.{quote(str(field.column))}" for field in team.concrete_fields)
    statement = (
        f"SELECT statement_timestamp(), (SELECT {limit} FROM {quote(quota.db_table)} AS q "  # noqa: S608 - the models' names
        f"WHERE q.{quota_team} = t.{team_id}), {selected} FROM {quote(team.db_table)} AS t WHERE t.{personal} = %s"
    )
    return statement, columns


def _personal_team(owner: User) -> tuple[datetime, Team, bool] | None:
    """The time (:func:`~tms_core.clock.db_now`), ``owner``'s personal team (where a create naming
    no team goes, through no team-scoped token) and whether its task quota is unlimited, read in
    one round trip instead of three (a single create's). None when the owner has none yet (a
    service account, or a user made before teams): :func:`team_for_new` finds or makes it."""
    statement, columns = _personal_team_statement()
    with connection.cursor() as cursor:
        cursor.execute(statement, [owner.pk])
        row = cursor.fetchone()
    if row is None:
        return None
    now, max_tasks, *values = row
    return now, Team.from_db(connection.alias, columns, values), quota_tasks_unlimited(max_tasks)


def _one_trip(
    tasks: list[Task],
    named: list[list[Limit]],
    followed: list[list[After]],
    skipped: list[SkippedOccurrence],
    unlimited: bool | None,
) -> bool:
    """Whether the create's writes go as one statement text outside a transaction block, where
    PostgreSQL runs them in one transaction of their own (a simple query of several statements is
    one: all or nothing, committed when they end), saving a single create the round trips of
    BEGIN and COMMIT: a few tasks (their rows go as one INSERT each, not by COPY), no limits, no
    ``after`` links and no skipped occurrence (each of those is an ORM statement of its own), no
    quota to lock, no caller's transaction to join, and executions written by one statement."""
    return (
        unlimited is True
        and not connection.in_atomic_block
        and connection.vendor == "postgresql"
        and len(tasks) < bulk.COPY_FROM_ROWS
        and not any(named)
        and not any(followed)
        and not skipped
        and not tracing.ON
    )


def _build_tasks(
    specs: Sequence[Mapping[str, Any]], *, owner: User, team: Team, now: datetime
) -> tuple[list[Task], list[list[Limit]], list[list[After]]]:
    """Each spec's task, limits and ``after``, all checked first: one bad spec fails the batch, writing nothing."""
    tasks: list[Task] = []
    errors: dict[str, Any] = {}
    named: list[list[Limit]] = []  # each task's limits
    followed: list[list[After]] = []  # each task's ``after``
    resolved: dict[tuple[str, ...], list[Limit]] = {}  # a batch names the same limits again and again
    builder = _TaskRows()
    for index, spec in enumerate(specs):
        try:
            task, chosen, after = _build_spec(spec, rows=builder, owner=owner, team=team, now=now, resolved=resolved)
        except InvalidInput as exc:
            errors[str(index)] = exc.errors
            continue
        tasks.append(task)
        named.append(chosen)
        followed.append(after)
    if errors:
        raise InvalidInput(errors if len(specs) > 1 else next(iter(errors.values())))
    return tasks, named, followed


def _build_spec(
    spec: Mapping[str, Any],
    *,
    rows: _TaskRows,
    owner: User,
    team: Team,
    now: datetime,
    resolved: dict[tuple[str, ...], list[Limit]],
) -> tuple[Task, list[Limit], list[After]]:
    """One spec's unsaved task, limits and ``after`` in ``team``: the checks whose errors are keyed by its position."""
    spec = dict(spec)
    names = tuple(spec.pop("limits", None) or ())
    chosen = resolved.get(names)
    if chosen is None:
        chosen = resolved[names] = limits_resolve(team_id=team.pk, names=names)
    after = after_resolve(team_id=team.pk, entries=spec.pop("after", None))
    if "join" in spec:
        spec["join"] = join_parse(spec["join"] or JoinRule.ALL_SUCCESS)
    join_check_links(join=spec.get("join", JoinRule.ALL_SUCCESS), after=after, field="after")
    map_check(map_over=spec.get("map_over") or "", after=after, field="after" if after else "map_over")
    _calendar_settings(team.pk, spec)
    artifact_check_team(team_id=team.pk, artifact=spec.get("artifact"))
    task = _build_task(rows=rows, owner=owner, team=team, now=now, **spec)
    task.has_limits = bool(chosen)
    if after:
        task.has_after = True
        if not any(spec.get(name) for name in ("start_at", "interval", "cron")):
            # Following others with no schedule of its own: it runs only after them.
            task.next_run_at, task.status = None, TaskStatus.ACTIVE
    return task, chosen, after


def _plan_tasks(
    tasks: list[Task], *, now: datetime, until: datetime
) -> tuple[list[transitions.NewExecution], list[SkippedOccurrence], list[int]]:
    """The new tasks' executions to ``until``, skipped occurrences, count per task: planned before any lock."""
    rows: list[transitions.NewExecution] = []
    skipped: list[SkippedOccurrence] = []
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
    return rows, skipped, planned


def _insert_links(tasks: list[Task], named: list[list[Limit]], followed: list[list[After]]) -> None:
    """Insert the new tasks' limit and ``after`` link rows, one statement each: rows of their own tables."""
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


def _record_created(tasks: list[Task], named: list[list[Limit]], followed: list[list[After]]) -> None:
    """Insert each new task's audit entry (JSON made once per batch). It holds every setting of the
    task, so it is version 1 as well: :func:`tasks_app.versions.version_first_ensure` writes that
    version from it when first needed (a version per task was a third of a bulk create's bytes)."""
    changes = _created_changes(tasks, named, followed)
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


def _created_values(task: Task, limits: list[str], after: list[dict[str, str]]) -> dict[str, Any]:
    """A new task's audited values (config masked, and the names of its limits and the tasks it
    follows if it has any, as an update records them), before :func:`tasks_app.audit.audit_values` converts them."""
    snapshot = _snapshot(task, task_config_masked(task))
    if limits:
        snapshot["limits"] = limits
    if after:
        snapshot["after"] = after
    return snapshot


#: Values a batch's tasks share by the thousand (names, numbers, times, defaults): each one's part of
#: the JSON is made once. (A datetime is keyed by its text: equal instants in two zones read apart.)
_SHARED_TYPES = frozenset({str, int, float, bool, timedelta, uuid.UUID})


def _created_changes(tasks: list[Task], named: list[list[Limit]], followed: list[list[After]]) -> list[JsonText]:
    """Each new task's audit changes (every audited field from nothing to its value, as
    ``audit_diff({}, audit_values(_created_values(...)))`` gives them) as JSON text.

    The tasks of a batch share most of their values, so each field's part is converted and
    encoded once per distinct value: encoding each task's document whole (about 45 fields) was a
    fifth of a bulk create's time, converting each value (:func:`tasks_app.audit.audit_values`) another tenth."""
    encode = json_encoder(DjangoJSONEncoder)
    parts: dict[tuple[str, type, Any], str] = {}
    changes = []
    for task, chosen, after in zip(tasks, named, followed, strict=True):
        snapshot = _created_values(task, sorted(limit.name for limit in chosen), [link.entry() for link in after])
        changed = []
        for name in sorted(snapshot):
            value = snapshot[name]
            if value is None:
                continue  # no change from nothing
            kind = type(value)
            if kind in _SHARED_TYPES:
                # -0.0 == 0.0 and True == 1, yet each has its own text.
                memo = (name, kind, value.hex() if kind is float else value)
            elif kind is datetime:
                memo = (name, kind, value.isoformat())
            elif (kind is dict or kind is list) and not value:
                memo = (name, kind, None)  # an empty config, list of secrets, input schema ...
            else:
                memo = None
            part = parts.get(memo) if memo is not None else None
            if part is None:
                converted = audit_value(value)
                part = "" if converted is None else f'{encode(name)}:{{"from":null,"to":{encode(converted)}}}'
                if memo is not None:
                    parts[memo] = part
            if part:
                changed.append(part)
        changes.append(JsonText("{" + ",".join(changed) + "}"))
    return changes


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
