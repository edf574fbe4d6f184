"""The outbox's triggers: an event is in the outbox exactly when its cause committed.

Execution events (a final failure, a success, a failed attempt going back for its retry, a start
for late rules) are this app's part of the execution table's one status trigger
(executions.triggers), which executions runs without knowing this app: the dependency points
down, from here to executions. Since this app is the highest that contributes a part, its
migration 0007 installs the trigger from its parts, and registers its own part for executions'
later migrations (notifications/apps.py). Skipped occurrences have a row-level ``AFTER INSERT``
trigger of their own on the skipped-occurrence table (migration 0001; its function:
:func:`skipped_function`).

A row is written only when some enabled rule of the task (or a default of the task's team) asks
for that kind of event: a task without rules costs an index probe per counted transition, nothing
more. Rules belong to teams (notifications 0010-0012): a rule speaks for its team's tasks only.
Before that they belonged to users, and a default rule spoke for its owner's tasks: that form,
which going back past 0012 installs again, is frozen in that migration.
"""

from __future__ import annotations

from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.triggers import NOW, ROLLUP, StatusPart, exceeds, literal
from notifications.models import Outbox, OutboxKind, Rule
from tasks_app.models import Task

OUTBOX, RULE, EXECUTION = Outbox._meta.db_table, Rule._meta.db_table, Execution._meta.db_table


def _applies(task: str, team: str) -> str:
    # The task's rules or its team's defaults: the dispatcher applies the precedence (a task
    # with rules of its own does not use the defaults); this is the cheap superset. Each branch
    # is one index (rule_task_idx, rule_team_default_idx). A task's own rule is of the task's
    # team (the services see to it); the team test keeps a rule left over from a move quiet.
    return f"r.enabled AND ((r.task_id = {task} AND r.team_id = {team}) OR (r.task_id IS NULL AND r.team_id = {team}))"


def _outbox() -> list[str]:
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
        f" ELSE r.late_after IS NOT NULL AND {exceeds('e.started_at', 'e.due_at', 'r.late_after')} END"
    )
    error = "coalesce(e.error, '')"
    # The team is the execution's (its task's, copied when it was made or moved): no task lookup.
    return [
        f"INSERT INTO {OUTBOX} (kind, task_id, execution_id, attempt, detail, at)"  # noqa: S608 - our names
        f" SELECT e.kind, e.task_id, e.id,"
        f" CASE WHEN e.kind = {k[OutboxKind.RETRY]} THEN e.old_attempt ELSE e.attempt END,"
        f" left({error}, 1000), {NOW}"
        f" FROM (SELECT c.*, {kind} AS kind FROM {{changed}} c WHERE {concerns}) e"
        f" WHERE EXISTS (SELECT 1 FROM {RULE} r WHERE {_applies('e.task_id', 'e.team_id')} AND {wants})"
        " ORDER BY e.id",
        _workflow(),
    ]


def _workflow() -> str:
    """A step of a workflow run ended: a row for the rules of the run's root task (the root's own
    end is its task's, above). Its ``detail`` is the step's status; the dispatcher reads the run
    as it stands (executions.workflow_runs) and tells "workflow_failed" / "workflow_recovered".
    The rules are those of the root's team (the step's own team may be another)."""
    return (
        f"INSERT INTO {OUTBOX} (kind, task_id, execution_id, attempt, detail, at)"  # noqa: S608 - our names
        f" SELECT {literal(OutboxKind.WORKFLOW)}, w.task_id, c.id, c.attempt, c.status, {NOW}"
        f" FROM {{changed}} c JOIN {EXECUTION} w ON w.id = c.workflow_run"
        f" WHERE c.status IN ({literal(S.SUCCEEDED)}, {literal(S.FAILED)}) AND c.workflow_run <> c.id"
        f" AND EXISTS (SELECT 1 FROM {RULE} r WHERE {_applies('w.task_id', 'w.team_id')}"
        " AND (r.on_failure OR r.on_recovery))"
        " ORDER BY c.id"
    )


#: This app's part of the status trigger.
OUTBOX_PART = StatusPart("outbox", frozenset({S.SUCCEEDED, S.FAILED, S.SCHEDULED, S.RUNNING}), _outbox)

#: Every part of the execution table's status trigger, in the order they write: what executions'
#: migrations install since it is kept by team (executions.triggers.status_parts).
STATUS_PARTS = (ROLLUP, OUTBOX_PART)


def skipped_function() -> str:
    """The skipped-occurrence trigger's function (the trigger itself is migration 0001's): a row
    when a rule of the task, or a default of its team, wants skips."""
    return f"""
CREATE OR REPLACE FUNCTION tms_notify_skipped() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    holder integer;
BEGIN
    SELECT t.team_id INTO holder FROM {Task._meta.db_table} t WHERE t.id = NEW.task_id;
    IF EXISTS (SELECT 1 FROM {RULE} r WHERE {_applies("NEW.task_id", "holder")} AND r.on_skip) THEN
        INSERT INTO {OUTBOX} (kind, task_id, execution_id, scheduled_for, detail, at)
        VALUES ({literal(OutboxKind.SKIPPED)}, NEW.task_id, NEW.execution_id, NEW.scheduled_for,
                NEW.reason || CASE WHEN NEW.detail <> '' THEN ': ' || left(NEW.detail, 900) ELSE '' END,
                statement_timestamp());
    END IF;
    RETURN NULL;
END
$fn$;
"""  # noqa: S608 - our names
