"""Channels and rules always have a team; a team's default rules are found by team, and the
outbox's triggers match rules by team: the status trigger (executions/triggers.py with
notifications/triggers.py) and the skipped-occurrence function are installed again. Going back
installs the triggers that match by owner, frozen here (notifications/triggers.py builds the
current ones only)."""

import importlib

import django.db.models.deletion
from django.db import migrations, models

from executions import triggers
from executions.models import ExecutionStatus as S
from executions.triggers import NOW, exceeds, literal
from notifications import triggers as notify
from notifications.models import OutboxKind

OUTBOX, RULE, EXECUTION, TASK = "notifications_outbox", "notifications_rule", "executions_execution", "tasks_app_task"

_rollup_forms = importlib.import_module("executions.migrations.0029_rollup_team")
_before = importlib.import_module("notifications.migrations.0007_one_status_trigger")


def _applies_by_owner(task, owner):
    # A task's rules or its owner's defaults (rules belonged to users).
    return f"r.enabled AND (r.task_id = {task} OR (r.task_id IS NULL AND r.owner_id = {owner}))"


def _outbox_by_owner():
    """The outbox part as it was before this migration (see notifications.triggers._outbox)."""
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
    return [
        f"INSERT INTO {OUTBOX} (kind, task_id, execution_id, attempt, detail, at)"
        f" SELECT e.kind, e.task_id, e.id,"
        f" CASE WHEN e.kind = {k[OutboxKind.RETRY]} THEN e.old_attempt ELSE e.attempt END,"
        f" left(coalesce(e.error, ''), 1000), {NOW}"
        f" FROM (SELECT c.*, {kind} AS kind FROM {{changed}} c WHERE {concerns}) e"
        f" WHERE EXISTS (SELECT 1 FROM {RULE} r WHERE {_applies_by_owner('e.task_id', 'e.owner_id')} AND {wants})"
        " ORDER BY e.id",
        f"INSERT INTO {OUTBOX} (kind, task_id, execution_id, attempt, detail, at)"
        f" SELECT {literal(OutboxKind.WORKFLOW)}, w.task_id, c.id, c.attempt, c.status, {NOW}"
        f" FROM {{changed}} c JOIN {EXECUTION} w ON w.id = c.workflow_run"
        f" WHERE c.status IN ({literal(S.SUCCEEDED)}, {literal(S.FAILED)}) AND c.workflow_run <> c.id"
        f" AND EXISTS (SELECT 1 FROM {RULE} r WHERE {_applies_by_owner('w.task_id', 'c.owner_id')}"
        " AND (r.on_failure OR r.on_recovery))"
        " ORDER BY c.id",
    ]


#: What going back past this migration installs (going back past it goes back past executions
#: 0029 first): the rollup and the outbox by owner.
STATUS_PARTS_BY_OWNER = (
    _rollup_forms.ROLLUP_BY_OWNER,
    triggers.StatusPart("outbox", notify.OUTBOX_PART.targets, _outbox_by_owner),
)

SKIPPED_BY_OWNER = f"""
CREATE OR REPLACE FUNCTION tms_notify_skipped() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    holder integer;
BEGIN
    SELECT t.owner_id INTO holder FROM {TASK} t WHERE t.id = NEW.task_id;
    IF EXISTS (SELECT 1 FROM {RULE} r WHERE {_applies_by_owner("NEW.task_id", "holder")} AND r.on_skip) THEN
        INSERT INTO {OUTBOX} (kind, task_id, execution_id, scheduled_for, detail, at)
        VALUES ({literal(OutboxKind.SKIPPED)}, NEW.task_id, NEW.execution_id, NEW.scheduled_for,
                NEW.reason || CASE WHEN NEW.detail <> '' THEN ': ' || left(NEW.detail, 900) ELSE '' END,
                statement_timestamp());
    END IF;
    RETURN NULL;
END
$fn$;
"""


def install(apps, schema_editor):
    schema_editor.execute(triggers.install(_before.MIGRATIONS_STATUS_PARTS), params=None)
    schema_editor.execute(notify.skipped_function(), params=None)


def uninstall(apps, schema_editor):
    schema_editor.execute(triggers.install(STATUS_PARTS_BY_OWNER), params=None)
    schema_editor.execute(SKIPPED_BY_OWNER, params=None)


class Migration(migrations.Migration):
    dependencies = [("notifications", "0011_channel_rule_team_data")]

    operations = [
        migrations.AlterField(
            model_name="channel",
            name="team",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="notification_channels", to="tasks_app.team"
            ),
        ),
        migrations.AlterField(
            model_name="rule",
            name="team",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="notification_rules",
                to="tasks_app.team",
            ),
        ),
        migrations.RemoveIndex(model_name="rule", name="rule_owner_default_idx"),
        migrations.AddIndex(
            model_name="rule",
            index=models.Index(
                condition=models.Q(("enabled", True), ("task__isnull", True)),
                fields=["team"],
                name="rule_team_default_idx",
            ),
        ),
        migrations.RunPython(install, uninstall, elidable=False),
    ]
