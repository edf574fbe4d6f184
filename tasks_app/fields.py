"""Every field of a task, declared once with its place: which group of settings it belongs to,
whether an update may change it, whether the audit log records it, whether the API shows it.

The API's serializers, the update service, the audit snapshot and the admin's field groups are
derived from :data:`TASK_FIELDS` (they were four hand-kept lists, which is how a field could be
left out of the audit). ``tests/tasks_api/test_task_fields.py`` fails when the model gains a
field that is not declared here, so a new field's place is decided when it is added.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The groups of settings, in the order the admin shows them (and the API lists them).
WHAT = "what"
WHEN = "when"
POLICIES = "policies"
RETENTION = "retention"
OTHER = "other"
#: Kept by the scheduler, never set by a user: read-only facts.
STATE = "state"
GROUPS = (WHAT, WHEN, POLICIES, RETENTION, OTHER, STATE)


@dataclass(frozen=True)
class TaskField:
    """One field of :class:`~tasks_app.models.Task` and where it belongs."""

    name: str
    group: str
    #: A partial update (API, admin, pages) may change it; settings are set when created either way.
    updatable: bool = True
    #: Its value is in the audit log's snapshot of the task (create and update diffs).
    audited: bool = True
    #: The API shows it in a task's representation.
    shown: bool = True
    #: A many-to-many relation (its value is a list of names, not a column).
    many: bool = False


def _settings(group: str, *names: str) -> tuple[TaskField, ...]:
    return tuple(TaskField(name, group) for name in names)


def _state(name: str, *, audited: bool = False, shown: bool = True) -> TaskField:
    return TaskField(name, STATE, updatable=False, audited=audited, shown=shown)


#: Every field of a task, in the order the API lists them.
TASK_FIELDS: tuple[TaskField, ...] = (
    _state("id"),
    TaskField("name", WHAT),
    # The lifecycle: audited (pause, resume, delete and a one-shot's completion change it).
    _state("status", audited=True),
    *_settings(WHAT, "runner", "config", "secret_fields"),
    # What a run's input must be, and which config values it fills (tasks_app.run_input).
    *_settings(WHAT, "input_schema", "input_fills"),
    # An artifact is chosen when the task is created; another one is another task.
    TaskField("artifact", WHAT, updatable=False),
    *_settings(WHEN, "start_at", "interval", "cron", "timezone", "dst_gap", "dst_fold", "end_at", "max_runs", "jitter"),
    # The tasks it follows (tasks_app.models.TaskDependency): a list of {task, on}, not a column.
    TaskField("after", WHEN, many=True),
    # How the links of ``after`` combine (tasks_app.models.JoinRule).
    TaskField("join", WHEN),
    # A calendar is named in the API (its owner's); a change of either re-plans the future.
    *_settings(WHEN, "calendar", "calendar_policy"),
    *_settings(
        POLICIES, "misfire_policy", "misfire_grace", "catch_up_limit", "overlap_policy", "max_age", "max_concurrency"
    ),
    TaskField("limits", POLICIES, many=True),
    TaskField("trigger_debounce", POLICIES),
    # The named events that start a run of it, with their debounce (tasks_app.event_subscriptions).
    TaskField("on_events", WHEN),
    *_settings(POLICIES, "max_attempts", "retry_backoff", "retry_backoff_max", "retry_jitter", "timeout", "priority"),
    # The workflow runs it roots: cancelled past this long, retried when failed (executions.workflow_control).
    *_settings(POLICIES, "workflow_timeout", "workflow_retries"),
    # A map step: once per item of a list in its upstream's output (executions.transitions.follow).
    *_settings(POLICIES, "map_over", "map_concurrency"),
    *_settings(OTHER, "tracing_id", "expose_metrics"),
    *_settings(RETENTION, "keep_last", "keep_for", "keep_failed_longer"),
    # The team it belongs to (its members see and run it by their role): set when it is created
    # (audited as its id) and changed only by tasks_api.moving.task_move (editor in both teams,
    # its own audit entry), never by a partial update's setattr.
    TaskField("team", OTHER, updatable=False),
    _state("owner", shown=False),  # who created it (its quotas are its team's)
    _state("has_limits", shown=False),  # whether ``limits`` names any: routes claims to the check
    _state("has_after", shown=False),  # whether ``after`` names any: read only then
    _state("next_run_at"),  # the materialisation cursor (the API's ``next_occurrence_at``)
    _state("runs_materialised"),
    _state("paused_at", shown=False),
    _state("version"),  # the number of its current TaskVersion
    _state("created_at"),
    _state("updated_at"),
)

BY_NAME = {field.name: field for field in TASK_FIELDS}


def names(group: str | None = None, **flags: bool) -> list[str]:
    """The names of the fields in ``group`` (all groups: None) whose flags have the values given,
    in declaration order: ``names(WHEN)``, ``names(updatable=True)``, ``names(audited=True, many=False)``."""
    return [
        field.name
        for field in TASK_FIELDS
        if (group is None or field.group == group)
        and all(getattr(field, flag) == value for flag, value in flags.items())
    ]


#: What a user sets: every field outside :data:`STATE`, in the groups' order.
SETTINGS = [name for group in GROUPS[:-1] for name in names(group)]
#: Fields a partial update may change.
UPDATABLE_FIELDS = frozenset(names(updatable=True))
#: The columns an audit entry's snapshot of a task holds (config masked); ``limits`` is
#: recorded beside them as its names.
AUDITED_COLUMNS = tuple(names(audited=True, many=False))
