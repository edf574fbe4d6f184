"""Bulk replay: run a selection of finished executions again, each as a new run due now.

``POST /api/v1/executions/replay`` and the admin's "Replay selected executions" both come here.
The new runs are created by :func:`executions.transitions.executions_replay` (the one module
that writes executions), in one transaction with their quota charge and one audit entry: all of
them or none.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from executions import transitions
from executions.models import TERMINAL_STATUSES, Execution
from executions.notify import notify_due
from tasks_app.audit import audit_record
from tasks_app.masking import ENV_NAMES, environment_changes, masks_left, unmask_config
from tasks_app.models import AuditAction, Task, TaskStatus, TaskVersion, TeamRole
from tasks_app.quotas import quota_charge_executions_of
from tasks_app.run_config import config_override, input_check, task_validate_runner
from tasks_app.run_input import check_input
from tasks_app.secrets import config_masked, config_open, config_seal, config_unmask
from tasks_app.teams import require, require_config_change, scope_to_teams
from tasks_app.versions import version_first_ensure
from tms_core.errors import ConflictError, GoneError, InvalidInput

#: The most executions one replay request may run again.
MAX_REPLAY = 1000
#: The most tasks one selection may name.
MAX_REPLAY_TASKS = 100


@dataclass(frozen=True)
class ReplayReport:
    """What a replay did (or, for a dry run, would do)."""

    dry_run: bool
    #: The executions replayed (selected), in the order of their new runs.
    replayed: list[int]
    #: The new executions, one per replayed one (none for a dry run).
    created: list[int] = field(default_factory=list)
    #: Secrets of a task's config left out of the new runs' config, per task: the override points
    #: the runs elsewhere (another URL, host, command ...), and a task's secrets never follow them.
    dropped_secrets: dict[str, list[str]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.replayed)


def replay_select(
    *,
    user: Any,
    task_ids: Sequence[uuid.UUID],
    statuses: Sequence[str],
    since: datetime | None,
    until: datetime | None,
    changes_config: bool = False,
) -> list[int]:
    """The ids of the finished executions of ``task_ids`` with one of ``statuses``, that
    finished at or after ``since`` and before ``until``, oldest end first. Raises
    :class:`GoneError` (404) for a task ``user`` does not see (not one of their teams'),
    PermissionDenied (403) for one of a team where they are less than an operator, :class:`InvalidInput` on
    ``status`` for a status that is not a finished one, on ``until`` when it is not after
    ``since``, and when more than :data:`MAX_REPLAY` match (nothing is replayed then).
    ``changes_config``: the replay gives the runs a ``config``, which needs the editor role in
    each task's team (:func:`tasks_app.teams.require_config_change`; 403 naming it), whether or
    not the selection matches anything."""
    if not task_ids:
        raise InvalidInput.on("task", "Name the task (or tasks) whose executions to replay.")
    if len(set(task_ids)) > MAX_REPLAY_TASKS:
        raise InvalidInput.on("tasks", f"At most {MAX_REPLAY_TASKS} tasks a request.")
    teams = dict(scope_to_teams(Task.objects.filter(pk__in=set(task_ids)), user).values_list("pk", "team_id"))
    found = set(teams)
    missing = [str(task_id) for task_id in task_ids if task_id not in found]
    if missing:
        raise GoneError(f"No task {missing[0]} (of yours).")
    for team_id in sorted(set(teams.values())):
        require(user, team_id, TeamRole.OPERATOR, "executions.change_execution", what="these executions")
        if changes_config:
            require_config_change(user, team_id, what="these runs")
    unfinished = sorted(set(statuses) - TERMINAL_STATUSES)
    if unfinished:
        raise InvalidInput.on(
            "status", f"Only finished executions are replayed (SUCCEEDED, FAILED, CANCELLED), not {unfinished[0]}."
        )
    if since is not None and until is not None and until <= since:
        raise InvalidInput.on("until", "Must be after since.")
    selected = Execution.objects.filter(
        task_id__in=found, status__in=list(statuses or TERMINAL_STATUSES), superseded=False
    )
    if since is not None:
        selected = selected.filter(finished_at__gte=since)
    if until is not None:
        selected = selected.filter(finished_at__lt=until)
    ids = list(selected.order_by("finished_at", "id").values_list("pk", flat=True)[: MAX_REPLAY + 1])
    if len(ids) > MAX_REPLAY:
        raise InvalidInput.on(
            "non_field_errors",
            f"The selection matches more than {MAX_REPLAY} executions, the most one replay runs again: narrow it "
            "(since, until, status) and replay it in parts.",
        )
    return ids


def executions_replay_by_user(
    *,
    user: Any,
    owner_id: int,
    execution_ids: Sequence[int],
    actor: str,
    run_input: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    dry_run: bool = False,
    selection: Mapping[str, Any] | None = None,
    visible: QuerySet[Execution] | None = None,
) -> ReplayReport:
    """Run the owner's finished executions ``execution_ids`` again: each a new execution of its
    task, due now, ``origin`` replay, ``replay_of`` the old one (see
    :func:`executions.transitions.executions_replay`).

    ``run_input`` replaces each new run's input (checked against each task's ``input_schema``
    and ``input_fills``: :class:`InvalidInput` on ``input``); ``config`` is a partial config laid
    over each task's for the new runs only, validated as a change of the task's config would be
    (:func:`tasks_app.run_config.config_override`: :class:`InvalidInput` on ``config``).
    ``dry_run`` checks all of it, the quota included (the same refusals), and creates and counts
    nothing.

    All or nothing: the new runs count against the hourly quota of executions created on request
    of their tasks' teams, each team its own runs (:class:`QuotaExceeded`, or
    :class:`InvalidInput` when they never fit, before anything is created), and one audit entry
    names the count and the selection.

    ``visible`` is where the executions are looked for (the caller's teams', from
    :func:`replay_select`'s checks); by default the owner's own.

    Running them again is an operator's act (the caller's checks, :func:`replay_select`); a
    ``config`` changes what they do, an editor's act: PermissionDenied (403) naming the role unless
    ``user`` is an editor in every team of the selection (:func:`tasks_app.teams.require_config_change`),
    checked before the config is, and nothing is replayed."""
    ids = _checked_request(execution_ids, run_input=run_input, config=config)
    rows = _finished_rows(ids, owner_id=owner_id, visible=visible)
    tasks = Task.objects.in_bulk({row.task_id for row in rows})
    _check_tasks(user, tasks, run_input=run_input, config=config)
    overrides, dropped = _config_overrides(tasks, config)
    order = [row.pk for row in rows]
    per_team = Counter(row.team_id for row in rows)  # each run counts against the team of its task
    if dry_run and rows:
        _check_quota(per_team)
    if dry_run or not rows:
        return ReplayReport(dry_run=dry_run, replayed=order, dropped_secrets=dropped)
    replays = [
        transitions.Replay(row.pk, run_input=run_input, config_override=overrides.get(row.task_id)) for row in rows
    ]
    with transaction.atomic():
        quota_charge_executions_of(per_team)
        created = transitions.executions_replay(replays=replays, actor=actor)
        if not all(created):  # the transaction, quota charge included, is rolled back
            raise ConflictError("A task of the selection was deleted meanwhile: nothing was replayed.")
        new_ids = [int(new_id) for new_id in created if new_id is not None]
        changes = _audit_changes(
            order, new_ids, selection=selection, run_input=run_input, config=config, overrides=overrides, tasks=tasks
        )
        only_task = next(iter(tasks)) if len(tasks) == 1 else None
        audit_record(
            action=AuditAction.REPLAY,
            object_type="execution",
            object_id=new_ids[0],
            owner=owner_id,
            task_id=only_task,
            changes=changes,
            detail=f"{len(new_ids)} execution(s) replayed",
        )
    notify_due()
    return ReplayReport(dry_run=False, replayed=order, created=new_ids, dropped_secrets=dropped)


def _checked_request(
    execution_ids: Sequence[int], *, run_input: dict[str, Any] | None, config: dict[str, Any] | None
) -> list[int]:
    """Check the request's own shape (input, config, size): the ids, each once, in their order."""
    if run_input is not None:
        check_input(run_input, None)  # its shape and size, whatever the selection holds
    if config is not None and not isinstance(config, dict):
        raise InvalidInput.on("config", "A JSON object: the config values to change for these runs.")
    ids = list(dict.fromkeys(execution_ids))
    if len(ids) > MAX_REPLAY:
        raise InvalidInput.on("non_field_errors", f"At most {MAX_REPLAY} executions a replay; {len(ids)} selected.")
    return ids


def _finished_rows(ids: list[int], *, owner_id: int, visible: QuerySet[Execution] | None) -> list[Execution]:
    """Load the executions ``ids`` among those visible, oldest end first, all of them finished."""
    rows = list(
        (visible if visible is not None else Execution.objects.filter(owner_id=owner_id))
        .filter(pk__in=ids)
        .only("pk", "status", "task_id", "team_id", "finished_at")
        .order_by("finished_at", "id")
    )
    by_id = {row.pk: row for row in rows}
    if len(by_id) < len(ids):
        missing = next(pk for pk in ids if pk not in by_id)
        raise GoneError(f"No execution {missing} (of yours).")
    for row in rows:
        if row.status not in TERMINAL_STATUSES:
            raise InvalidInput.on(
                "non_field_errors", f"Execution {row.pk} is {row.status}: only finished executions are replayed."
            )
    return rows


def _check_tasks(
    user: Any, tasks: Mapping[uuid.UUID, Task], *, run_input: dict[str, Any] | None, config: dict[str, Any] | None
) -> None:
    """Check the tasks: the editor role for a config, none deleted, each accepts the run input."""
    if config is not None:
        for team_id in sorted({task.team_id for task in tasks.values()}):
            require_config_change(user, team_id, what="these runs")
    for task in tasks.values():
        if task.status == TaskStatus.DELETED:
            raise InvalidInput.on("task", f"Task {task.pk} is deleted: its executions are not run again.")
        if run_input is not None:
            input_check(task=task, run_input=run_input)


def _config_overrides(
    tasks: Mapping[uuid.UUID, Task], config: dict[str, Any] | None
) -> tuple[dict[uuid.UUID, Any], dict[str, list[str]]]:
    """Lay ``config`` over each task's: the sealed override per task, and the secrets it drops."""
    overrides: dict[uuid.UUID, Any] = {}
    dropped: dict[str, list[str]] = {}
    if config is not None:
        for task in tasks.values():
            overrides[task.pk], lost = config_override(task=task, override=config)
            if lost:
                dropped[str(task.pk)] = lost
    return overrides, dropped


def _check_quota(per_team: Mapping[int, int]) -> None:
    """Check that the runs would fit each team's quota now, charging nothing."""
    # Charged and rolled back: the same refusal (429, or 400 when they never fit) as the replay
    # itself would meet, and nothing counted.
    with transaction.atomic():
        quota_charge_executions_of(per_team)
        transaction.set_rollback(True)


def _audit_changes(
    order: list[int],
    new_ids: list[int],
    *,
    selection: Mapping[str, Any] | None,
    run_input: dict[str, Any] | None,
    config: dict[str, Any] | None,
    overrides: Mapping[uuid.UUID, Any],
    tasks: Mapping[uuid.UUID, Task],
) -> dict[str, Any]:
    """The replay's audit entry's changes: count, selection, runs, and what input or config they got."""
    changes: dict[str, Any] = {
        "count": len(new_ids),
        "selection": dict(selection or {"executions": order}),
        "replayed": order,
        "created": new_ids,
    }
    if run_input is not None:
        changes["input"] = "replaced"
    if config is not None:
        changes["config"] = {str(task_id): config_masked("", sealed) for task_id, sealed in overrides.items()}
        # The override's environment values read masked: name the variables it sets.
        env_names = {
            str(task_id): names
            for task_id, sealed in overrides.items()
            if (names := environment_changes(config_open(tasks[task_id].config), config_open(sealed)))
        }
        if env_names:
            changes[ENV_NAMES] = env_names
    return changes


def executions_replay_picked(
    *, user: Any, execution_ids: Sequence[int], actor: str, run_input: dict[str, Any] | None = None
) -> ReplayReport:
    """Replay the executions ``user`` picked by id (the back office's execution page and list):
    the operator role in each of their tasks' teams, as :func:`replay_select` asks of a
    selection (PermissionDenied naming it, nothing replayed), then
    :func:`executions_replay_by_user` among the executions ``user`` sees (another team's id is
    "no execution"). ``run_input`` only: a config is an editor's change and is never given here."""
    ids = list(dict.fromkeys(execution_ids))
    if not ids:
        raise InvalidInput.on("executions", "Select the executions to replay.")
    if len(ids) > MAX_REPLAY:
        raise InvalidInput.on("executions", f"At most {MAX_REPLAY} executions a replay; {len(ids)} selected.")
    visible = scope_to_teams(Execution.objects.all(), user)
    for team_id in sorted(set(visible.filter(pk__in=ids).values_list("team_id", flat=True))):
        require(user, team_id, TeamRole.OPERATOR, "executions.change_execution", what="these executions")
    return executions_replay_by_user(
        user=user,
        owner_id=user.pk,
        execution_ids=ids,
        actor=actor,
        run_input=run_input,
        selection={"executions": ids},
        visible=visible,
    )


#: ``version`` of a single run's replay: the task as it is now, or as it was when the run was made.
VERSION_CURRENT = "current"
VERSION_ORIGINAL = "original"


def _original_config(task: Task, number: int) -> dict[str, Any]:
    """The config (stored form, secrets sealed) of ``task``'s version ``number``, each secret at
    the task's current value (versions never hold secrets). :class:`ConflictError` (409) when that
    version ran another runner (restore the version instead); :class:`InvalidInput` on ``version``
    when it had a secret the task no longer holds, or no longer passes its runner's checks."""
    if number == 1:
        version_first_ensure(task.pk)  # written lazily (tasks_app.versions)
    snapshot = TaskVersion.objects.filter(task_id=task.pk, number=number).values_list("snapshot", flat=True).first()
    if snapshot is None:
        raise InvalidInput.on("version", f"The task no longer has version {number} (the run's).")
    if snapshot.get("runner", task.runner) != task.runner:
        raise ConflictError(
            f"Version {number} ran the {snapshot.get('runner')} runner, the task runs {task.runner} now: "
            "a replay cannot change the runner (restore the version: POST .../versions/{n}/restore)."
        )
    old = config_unmask(snapshot.get("config") or {}, config_open(task.config))
    if masks_left(old):
        raise InvalidInput.on(
            "version",
            f"Version {number}'s config held a secret that the task no longer has (versions never keep secrets).",
        )
    try:
        plain = task_validate_runner(runner=task.runner, config=old)
    except InvalidInput as error:
        raise InvalidInput.on("version", f"Version {number}'s config is no longer valid: {error}") from error
    fields = [path for path in (task.secret_fields or []) if path]
    return dict(config_seal(task.runner, plain, fields))


def execution_replay_one(
    *, user: Any, execution_id: int, actor: str, run_input: dict[str, Any] | None = None, version: str = VERSION_CURRENT
) -> ReplayReport:
    """Replay one finished execution ``user`` sees (``POST /api/v1/executions/{id}/replay``): a
    new run of its task due now (:func:`executions_replay_by_user`), with ``run_input`` when
    given. ``version``: ``current`` runs the task's config as it is now (or the run's own override);
    ``original`` the config of the task's version the run was created from
    (``Execution.task_version``), each secret at its current value. An operator's act, and
    an editor's when ``original`` differs from the task's current version (it changes what runs:
    PermissionDenied naming the role). :class:`GoneError` (404) for another team's execution."""
    if version not in (VERSION_CURRENT, VERSION_ORIGINAL):
        raise InvalidInput.on("version", f"One of: {VERSION_CURRENT}, {VERSION_ORIGINAL}.")
    visible = scope_to_teams(Execution.objects.all(), user)
    execution = visible.filter(pk=execution_id).select_related("task").first()
    if execution is None:
        raise GoneError(f"No execution {execution_id} (of yours).")
    task = execution.task
    require(user, task.team_id, TeamRole.OPERATOR, "executions.change_execution", what="this execution")
    if isinstance(run_input, dict) and execution.input is not None:
        # The API shows the run's input masked: a value sent back still reading the mask is the
        # stored one (as a form keeps a secret left alone), never the mask itself.
        run_input = unmask_config(run_input, execution.input)
    overrides: dict[uuid.UUID, Any] = {}
    number = execution.task_version
    if version == VERSION_ORIGINAL and number is not None and number != task.version:
        require_config_change(user, task.team_id, what="this run")
        if execution.config_override is None:  # its own override (a replay's) is what it ran with: kept
            overrides[task.pk] = _original_config(task, number)
    return _replay_with_overrides(
        user=user, execution=execution, actor=actor, run_input=run_input, overrides=overrides, version=version
    )


def _replay_with_overrides(
    *,
    user: Any,
    execution: Execution,
    actor: str,
    run_input: dict[str, Any] | None,
    overrides: Mapping[uuid.UUID, Any],
    version: str,
) -> ReplayReport:
    """:func:`executions_replay_by_user` for one execution, with an override computed here."""
    if run_input is not None:
        check_input(run_input, None)
    if execution.status not in TERMINAL_STATUSES:
        raise InvalidInput.on(
            "non_field_errors",
            f"Execution {execution.pk} is {execution.status}: only finished executions are replayed.",
        )
    task = execution.task
    _check_tasks(user, {task.pk: task}, run_input=run_input, config=None)
    with transaction.atomic():
        quota_charge_executions_of({execution.team_id: 1})
        (new_id,) = transitions.executions_replay(
            replays=[transitions.Replay(execution.pk, run_input=run_input, config_override=overrides.get(task.pk))],
            actor=actor,
        )
        if new_id is None:
            raise ConflictError("The task was deleted meanwhile: nothing was replayed.")
        changes: dict[str, Any] = {
            "count": 1,
            "selection": {"executions": [execution.pk], "version": version},
            "replayed": [execution.pk],
            "created": [new_id],
        }
        if run_input is not None:
            changes["input"] = "replaced"
        if task.pk in overrides:
            changes["task_version"] = execution.task_version
        audit_record(
            action=AuditAction.REPLAY,
            object_type="execution",
            object_id=new_id,
            owner=task.owner_id,
            task_id=task.pk,
            changes=changes,
            detail=f"execution {execution.pk} replayed ({version} version)",
        )
    notify_due()
    return ReplayReport(dry_run=False, replayed=[execution.pk], created=[int(new_id)])
