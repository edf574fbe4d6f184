"""Changing a task's settings (:func:`task_update`): the API's PATCH, the admin, the back office's
form and a restore of a version. A change of the schedule or of what runs replaces the task's
future (:mod:`tasks_api.replan`); every change is audited and, unless only the status changed,
recorded as a new version."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction

from executions.materialiser import materialise_task, task_schedule
from executions.models import Execution, ExecutionStatus
from tasks_api.checks import RULE_FIELDS, _calendar_settings, task_check_min_interval, task_check_rules
from tasks_api.limits import limits_resolve, task_limit_names, task_set_limits
from tasks_api.replan import _forget_calendar_skips, _set_cursor, _supersede
from tasks_api.task_config import task_check_secret_fields, task_config
from tasks_api.task_writes import _audit_task, _lock, _snapshot
from tasks_api.workflows import (
    after_resolve,
    join_check_links,
    join_parse,
    map_check,
    task_after_entries,
    task_links,
    task_set_after,
)
from tasks_app.audit import audit_diff
from tasks_app.fields import UPDATABLE_FIELDS
from tasks_app.masking import ENV_NAMES, environment_changed_names, environment_changes
from tasks_app.models import AuditAction, CalendarPolicy, JoinRule, Task, TaskStatus, TaskVersion, claims_exclusive
from tasks_app.run_config import destination_moved, task_validate_runner
from tasks_app.schedules import Schedule, ScheduleError
from tasks_app.secrets import Path as SecretPath
from tasks_app.secrets import (
    check_secret_fields,
    config_carry_secrets,
    config_masked,
    config_masked_pair,
    config_seal,
    config_unmask_kept,
)
from tasks_app.versions import NOT_VERSIONED, version_first_ensure, version_record, version_snapshot
from tms_core.clock import db_now
from tms_core.errors import InvalidInput

#: Fields whose change replaces the task's future executions: the schedule ...
SCHEDULE_FIELDS = frozenset(
    {"start_at", "interval", "cron", "timezone", "dst_gap", "dst_fold", "end_at", "max_runs", "jitter"}
    | {"calendar", "calendar_policy"}
)
#: ... and what each execution runs (executions copy the priority when they are created).
RUN_FIELDS = frozenset({"runner", "config", "priority"})


def _clean(task: Task) -> None:
    try:
        task.full_clean(exclude=["owner", "team"], validate_constraints=True)
    except DjangoValidationError as exc:
        raise InvalidInput(exc.message_dict) from None


def _check_rules(task: Task) -> None:
    task_check_rules({name: getattr(task, name) for name in RULE_FIELDS})


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
        _merge_calendar(task, changes)
        sealed, plain = task.config, task_config(task)
        before = (task.runner, plain, list(task.secret_fields or []))
        snapshot_before = _snapshot(task, None)
        limits_changed = _update_limits(task, new_limits, snapshot_before)
        after_changed = _update_after(task, new_after, snapshot_before)
        if "join" in changes:
            changes["join"] = join_parse(changes["join"] or JoinRule.ALL_SUCCESS)
        if "join" in changes or new_after is not None:
            join_check_links(
                join=changes.get("join", task.join),
                after=task_links(task),
                field="after" if new_after is not None else "join",
            )
        if "map_over" in changes or new_after is not None:
            map_check(
                map_over=changes.get("map_over", task.map_over) or "",
                after=task_links(task),
                field="after" if new_after is not None else "map_over",
            )
        changed, dropped = _apply_changes(task, changes, before=before)
        after = (task.runner, task.config, list(task.secret_fields or []))
        # Checked in the clear; stored sealed (as it was when nothing of it changed).
        task.config = config_seal(*after) if changed & {"runner", "config", "secret_fields"} else sealed
        schedule = _checked_schedule(task, changed)
        _clean(task)
        replace = bool(changed & (SCHEDULE_FIELDS | RUN_FIELDS))
        if replace:
            _replace_future(task, changed, schedule, actor=actor)
        if task.status == TaskStatus.COMPLETED and task.has_after:
            # A task that follows others is not completed by its own schedule's end
            # (status_for_cursor); one left COMPLETED (before that rule, or by the end of its
            # schedule while it followed nothing) comes back with any change, after included.
            task.status = TaskStatus.ACTIVE
        if changed & {"overlap_policy", "max_concurrency"}:
            _reroute_claims(task)
        task.save()
        if task.status != snapshot_before["status"]:
            changed.add("status")  # audited with the rest (not versioned)
        if changed or limits_changed or after_changed:
            _record_update(
                task,
                detail=detail,
                changed=changed,
                dropped=dropped,
                before=before,
                after=after,
                snapshot_before=snapshot_before,
                limits_changed=limits_changed,
                after_changed=after_changed,
            )
        if replace and task.status == TaskStatus.ACTIVE:
            materialise_task(task_id=task.pk)
    task.refresh_from_db()
    return task


def _merge_calendar(task: Task, changes: dict[str, Any]) -> None:
    """Put in ``changes`` the calendar and policy the task ends with: each one is checked against the other."""
    if "calendar" not in changes and "calendar_policy" not in changes:
        return
    merged = {"calendar": task.calendar, "calendar_policy": task.calendar_policy, **changes}
    if "calendar" in changes and changes["calendar"] in (None, "") and "calendar_policy" not in changes:
        merged["calendar_policy"] = CalendarPolicy.NONE  # no calendar: no policy
    if "calendar" in changes and "calendar_policy" not in changes and task.calendar_id is None:
        merged["calendar_policy"] = ""  # a first calendar takes the default policy
    _calendar_settings(task.team_id, merged)
    changes["calendar"], changes["calendar_policy"] = merged["calendar"], merged["calendar_policy"] or ""


def _update_limits(task: Task, names: Sequence[str] | None, snapshot_before: dict[str, Any]) -> bool:
    """Link the limits ``names`` (None: as they are), rows of their own; whether they changed (old names noted)."""
    if names is None:
        return False
    chosen = limits_resolve(team_id=task.team_id, names=names)
    old_names = task_limit_names(task)
    if sorted(limit.name for limit in chosen) == old_names:
        return False
    task_set_limits(task=task, limits=chosen)
    snapshot_before["limits"] = old_names
    return True


def _update_after(task: Task, entries: Any, snapshot_before: dict[str, Any]) -> bool:
    """Link the tasks to follow (None: as they are), rows of their own; whether they changed (old ones noted)."""
    if entries is None:
        return False
    old_after = task_after_entries(task)
    if not task_set_after(task=task, after=after_resolve(team_id=task.team_id, entries=entries, task_id=task.pk)):
        return False
    snapshot_before["after"] = old_after
    return True


def _apply_changes(
    task: Task, changes: dict[str, Any], *, before: tuple[str, Any, list[str]]
) -> tuple[set[str], list[str]]:
    """Set ``changes`` on the task in the clear and check them all before any write; fields changed, secrets dropped."""
    _, plain, _ = before
    kept = None  # no config sent: every stored secret is kept
    if "config" in changes:
        # A secret sent back as its mask keeps its stored value.
        changes["config"], kept = config_unmask_kept(changes["config"], plain)
    task.config = plain  # compared and validated in the clear; sealed again by the caller
    changed = {name for name, value in changes.items() if getattr(task, name) != value}
    for name in changed:
        setattr(task, name, changes[name])
    if changed & set(RULE_FIELDS):
        _check_rules(task)
    if changed & {"runner", "config"}:
        task.config = task_validate_runner(runner=task.runner, config=task.config)
    dropped: list[str] = []
    if changed & {"runner", "config", "secret_fields", "artifact"}:
        dropped = _carry_secrets(task, changed, before=before, kept=kept)
    if changed & {"config", "secret_fields"}:
        task_check_secret_fields(config=task.config, secret_fields=task.secret_fields)
    return changed, dropped


def _carry_secrets(
    task: Task, changed: set[str], *, before: tuple[str, Any, list[str]], kept: set[SecretPath] | None
) -> list[str]:
    """Keep or drop the stored secrets (a run sent elsewhere loses them), updating ``changed``; the paths dropped."""
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
    return dropped


def _checked_schedule(task: Task, changed: set[str]) -> Schedule:
    """The task's new schedule, checked (valid, not too frequent for its runner) before the replan walks it."""
    try:
        schedule = task_schedule(task)
    except ScheduleError as exc:
        raise InvalidInput.on("schedule", str(exc)) from None
    if changed & (SCHEDULE_FIELDS | {"runner"}):
        task_check_min_interval(runner=task.runner, schedule=schedule, jitter=task.jitter)
    return schedule


def _replace_future(task: Task, changed: set[str], schedule: Schedule, *, actor: str) -> None:
    """Supersede the runs not started and move the cursor to the new ``schedule``: the future follows the change."""
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


def _reroute_claims(task: Task) -> None:
    """Give the executions not started the ``exclusive`` flag of the new overlap policy and cap: they carry a copy."""
    # Claims read the policy and the cap from the task; the flag only routes them to the check.
    Execution.objects.filter(task=task, status__in=(ExecutionStatus.SCHEDULED, ExecutionStatus.PENDING)).update(
        exclusive=claims_exclusive(
            overlap_policy=task.overlap_policy, max_concurrency=task.max_concurrency, has_limits=task.has_limits
        )
    )


def _record_update(
    task: Task,
    *,
    detail: str,
    changed: set[str],
    dropped: list[str],
    before: tuple[str, Any, list[str]],
    after: tuple[str, Any, list[str]],
    snapshot_before: dict[str, Any],
    limits_changed: bool,
    after_changed: bool,
) -> None:
    """Audit the saved change and version it (unless only the status changed): both from the same snapshots."""
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
    if task.version == 1:
        version_first_ensure(task.pk)  # a task created since versions are lazy: from its create entry
    if not TaskVersion.objects.filter(task_id=task.pk).exists():  # a task older than versions
        version_record(task_id=task.pk, number=task.version, snapshot=version_snapshot(before), changed=[])
    task.version += 1
    Task.objects.filter(pk=task.pk).update(version=task.version)
    version_record(task_id=task.pk, number=task.version, snapshot=version_snapshot(after), changed=changed)
