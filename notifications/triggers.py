"""The outbox's triggers: an event is in the outbox exactly when its cause committed.

Execution events (a final failure, a success, a failed attempt going back for its retry, a start
for late rules) are this app's part of the execution table's one status trigger
(executions.triggers), which executions runs without knowing this app: the dependency points
down, from here to executions. Since this app is the highest that contributes a part, its
migration 0007 installs the trigger from its parts (:data:`MIGRATIONS_STATUS_PARTS`), and
registers its own part for executions' later migrations (notifications/apps.py). Skipped occurrences have a
row-level ``AFTER INSERT`` trigger of their own on the skipped-occurrence table (PostgreSQL:
migration 0001; SQLite: :data:`SQLITE_SKIPPED`).

A row is written only when some enabled rule of the task (or a default of the task's team) asks
for that kind of event: a task without rules costs an index probe per counted transition, nothing
more. Rules belong to teams (notifications 0010-0012): a rule speaks for its team's tasks only.
Before that they belonged to users, and a default rule spoke for its owner's tasks; the functions
below still build that form (``holder="owner"``), which going back past 0012 installs again.
"""

from __future__ import annotations

from executions.models import Execution, SkippedOccurrence
from executions.models import ExecutionStatus as S
from executions.triggers import ROLLUP, ROLLUP_BY_OWNER, SQLITE, Dialect, StatusPart, literal
from notifications.models import Outbox, OutboxKind, Rule
from tasks_app.models import Task

OUTBOX, RULE, EXECUTION = Outbox._meta.db_table, Rule._meta.db_table, Execution._meta.db_table


def _applies(task: str, holder: str, column: str = "team_id") -> str:
    # The task's rules or its team's defaults: the dispatcher applies the precedence (a task
    # with rules of its own does not use the defaults); this is the cheap superset. Each branch
    # is one index (rule_task_idx, rule_team_default_idx). A task's own rule is of the task's
    # team (the services see to it); the team test keeps a rule left over from a move quiet.
    if column == "owner_id":  # the form from before teams (holder: the task's owner)
        return f"r.enabled AND (r.task_id = {task} OR (r.task_id IS NULL AND r.owner_id = {holder}))"
    return (
        f"r.enabled AND ((r.task_id = {task} AND r.team_id = {holder}) OR (r.task_id IS NULL AND r.team_id = {holder}))"
    )


def _outbox(d: Dialect, column: str = "team_id") -> list[str]:
    k = {kind: literal(kind) for kind in OutboxKind}
    concerns = (
        f"c.status IN ({literal(S.SUCCEEDED)}, {literal(S.FAILED)})"
        f" OR (c.old_status = {literal(S.RUNNING)} AND c.status = {literal(S.SCHEDULED)})"
        f" OR (c.status = {literal(S.RUNNING)} AND c.started_at IS NOT NULL)"
    )
    kind = (
        f"CASE WHEN c.status = {literal(S.FAILED)} THEN {k[OutboxKind.FAILED]}"
        f" WHEN c.status = {literal(S.SUCCEEDED)} THEN {k[OutboxKind.SUCCEEDED]}"
        f" WHEN c.status = {literal(S.SCHEDULED)} THEN {k[OutboxKind.RETRY]} ELSE {k[OutboxKind.LATE]} END"
    )
    wants = (
        f"CASE e.kind WHEN {k[OutboxKind.FAILED]} THEN r.on_failure OR r.on_recovery"
        f" WHEN {k[OutboxKind.SUCCEEDED]} THEN r.on_failure OR r.on_recovery OR r.no_success_within IS NOT NULL"
        f" WHEN {k[OutboxKind.RETRY]} THEN r.on_retry"
        f" ELSE r.late_after IS NOT NULL AND {d.exceeds('e.started_at', 'e.due_at', 'r.late_after')} END"
    )
    error = "coalesce(e.error, '')"
    # The team is the execution's (its task's, copied when it was made or moved): no task lookup.
    return [
        f"INSERT INTO {OUTBOX} (kind, task_id, execution_id, attempt, detail, at)"  # noqa: S608 - our names
        f" SELECT e.kind, e.task_id, e.id,"
        f" CASE WHEN e.kind = {k[OutboxKind.RETRY]} THEN e.old_attempt ELSE e.attempt END,"
        f" {d.left(error, 1000)}, {d.now}"
        f" FROM (SELECT c.*, {kind} AS kind FROM {{changed}} c WHERE {concerns}) e"
        f" WHERE EXISTS (SELECT 1 FROM {RULE} r WHERE {_applies('e.task_id', f'e.{column}', column)} AND {wants})"
        " ORDER BY e.id",
        _workflow(d, column),
    ]


def _workflow(d: Dialect, column: str = "team_id") -> str:
    """A step of a workflow run ended: a row for the rules of the run's root task (the root's own
    end is its task's, above). Its ``detail`` is the step's status; the dispatcher reads the run
    as it stands (executions.workflow_runs) and tells "workflow_failed" / "workflow_recovered".
    The rules are those of the root's team (the step's own team may be another)."""
    holder = "w.team_id" if column == "team_id" else "c.owner_id"
    return (
        f"INSERT INTO {OUTBOX} (kind, task_id, execution_id, attempt, detail, at)"  # noqa: S608 - our names
        f" SELECT {literal(OutboxKind.WORKFLOW)}, w.task_id, c.id, c.attempt, c.status, {d.now}"
        f" FROM {{changed}} c JOIN {EXECUTION} w ON w.id = c.workflow_run"
        f" WHERE c.status IN ({literal(S.SUCCEEDED)}, {literal(S.FAILED)}) AND c.workflow_run <> c.id"
        f" AND EXISTS (SELECT 1 FROM {RULE} r WHERE {_applies('w.task_id', holder, column)}"
        " AND (r.on_failure OR r.on_recovery))"
        " ORDER BY c.id"
    )


_OUTBOX_TARGETS = frozenset({S.SUCCEEDED, S.FAILED, S.SCHEDULED, S.RUNNING})

#: This app's part of the status trigger.
OUTBOX_PART = StatusPart("outbox", _OUTBOX_TARGETS, _outbox)

#: Every part of the execution table's status trigger, in the order they write (what SQLite
#: installs after each migrate: notifications/apps.py).
STATUS_PARTS = (ROLLUP, OUTBOX_PART)

#: What this app's migrations (0007-0012) install on PostgreSQL: the rollup by owner, as it was
#: until executions 0029 kept it by team. 0029 depends on them and installs the trigger again,
#: by team, so no state between writes to rollup columns that are not there yet (executions 0025
#: updates every execution, which fires the trigger).
MIGRATIONS_STATUS_PARTS = (ROLLUP_BY_OWNER, OUTBOX_PART)

#: The same when rules belonged to users (notifications 0007-0011): what going back past 0012
#: installs (going back past 0012 goes back past executions 0029 first).
STATUS_PARTS_BY_OWNER = (ROLLUP_BY_OWNER, StatusPart("outbox", _OUTBOX_TARGETS, lambda d: _outbox(d, "owner_id")))


def postgresql_skipped(column: str = "team_id") -> str:
    """The skipped-occurrence trigger's function on PostgreSQL (the trigger itself is migration
    0001's): a row when a rule of the task, or a default of its team, wants skips. ``column``
    ``owner_id`` gives the form from before teams."""
    return f"""
CREATE OR REPLACE FUNCTION tms_notify_skipped() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    holder integer;
BEGIN
    SELECT t.{column} INTO holder FROM {Task._meta.db_table} t WHERE t.id = NEW.task_id;
    IF EXISTS (SELECT 1 FROM {RULE} r WHERE {_applies("NEW.task_id", "holder", column)} AND r.on_skip) THEN
        INSERT INTO {OUTBOX} (kind, task_id, execution_id, scheduled_for, detail, at)
        VALUES ({literal(OutboxKind.SKIPPED)}, NEW.task_id, NEW.execution_id, NEW.scheduled_for,
                NEW.reason || CASE WHEN NEW.detail <> '' THEN ': ' || left(NEW.detail, 900) ELSE '' END,
                statement_timestamp());
    END IF;
    RETURN NULL;
END
$fn$;
"""  # noqa: S608 - our names


#: The skipped-occurrence trigger on SQLite (PostgreSQL's: :func:`postgresql_skipped`).
SQLITE_SKIPPED = f"""
CREATE TRIGGER tms_notify_skipped AFTER INSERT ON {SkippedOccurrence._meta.db_table}
FOR EACH ROW
BEGIN
    INSERT INTO {OUTBOX} (kind, task_id, execution_id, scheduled_for, detail, at)
    SELECT {literal(OutboxKind.SKIPPED)}, NEW.task_id, NEW.execution_id, NEW.scheduled_for,
           NEW.reason || CASE WHEN NEW.detail <> '' THEN ': ' || substr(NEW.detail, 1, 900) ELSE '' END, {SQLITE.now}
    FROM {Task._meta.db_table} t WHERE t.id = NEW.task_id
    AND EXISTS (SELECT 1 FROM {RULE} r WHERE {_applies("NEW.task_id", "t.team_id")} AND r.on_skip);
END;
"""  # noqa: S608 - our names
SQLITE_SKIPPED_UNINSTALL = "DROP TRIGGER IF EXISTS tms_notify_skipped;"
