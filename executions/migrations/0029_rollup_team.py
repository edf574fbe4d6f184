"""The dashboard's rollups are kept by team (``RunRollup.team_id``, ``TaskRollup.team_id``) instead
of by the tasks' owner, so a team's members see the figures of the team's runs.

The rows already there go, set-based:

* a minute's row to its owner's personal team (every user has one: tasks_app 0027), which is
  where that owner's tasks were; a row of a user deleted since goes to no team (0: staff only,
  as executions 0025 did for their runs), rows that then share a key added into one;
* a task's hour to the team the task is in now (where its executions are since executions
  0025, and where its hours go when it moves: tasks_api.moving.task_move), else its owner's
  personal team, else 0.

The status trigger writes the execution's ``team_id`` where it wrote its ``owner_id``: installed
again here with the parts of the apps above this one as they registered them
(executions.triggers.status_parts).
Going back gives each row its team's personal owner (0 for a shared team's rows, added up) and
installs the trigger that keeps the rollups by owner.

The rollup's earlier forms are frozen here (executions/triggers.py builds the current one only):
by owner (before this migration, what going back past it installs), by team with a shard per run
(this migration's, what going back past 0030 installs), and by team with the transaction's shard
(0030's, what going back past 0031 installs); none keeps the extremes (0031 adds them).
"""

from django.db import migrations, models

from executions import triggers
from executions.models import DURATION_COLUMNS, LATENESS_COLUMNS, OUTCOME_COLUMNS, ROLLUP_SHARDS, TERMINAL_STATUSES
from executions.models import ExecutionStatus as S
from executions.triggers import NOW, among, bucket, flag, literal, seconds, truncate

RUN_ROLLUP, TASK_ROLLUP, TASK = "executions_runrollup", "executions_taskrollup", "tasks_app_task"


def _add_on_conflict(table, columns):
    return ", ".join(f"{c} = {table}.{c} + EXCLUDED.{c}" for c in columns)


def _rollup_before_extremes(key, *, shard_by_row):
    """The rollup part's two upserts as they were before migration 0031 (see
    executions.triggers._rollup for what they count), its rows kept by ``key`` (``owner_id``
    before this migration, ``team_id`` since), a minute's row in the shard of the run
    (``shard_by_row``, until 0030) or of the writing transaction."""
    retried = f"c.old_status = {literal(S.RUNNING)} AND c.status = {literal(S.SCHEDULED)}"
    counted = f"({among('c.status', TERMINAL_STATUSES)} OR ({retried}))"
    ended = f"CASE WHEN c.status = {literal(S.SCHEDULED)} THEN {NOW} ELSE coalesce(c.finished_at, {NOW}) END"
    outcome = f"CASE WHEN c.status = {literal(S.SCHEDULED)} THEN {literal('RETRIED')} ELSE c.status END"
    ran = f"c.old_status = {literal(S.RUNNING)} AND c.old_started_at IS NOT NULL"
    late_s = seconds("c.old_started_at", "c.old_due_at")
    took_s = seconds("c.ended", "c.old_started_at")
    rows = (
        f"(SELECT s.*, CASE WHEN s.late_s IS NULL THEN -1 ELSE {bucket('s.late_s')} END AS late,"
        f" CASE WHEN s.took_s IS NULL THEN -1 ELSE {bucket('s.took_s')} END AS took"
        f" FROM (SELECT c.*, CASE WHEN {ran} THEN {late_s} END AS late_s, CASE WHEN {ran} THEN {took_s} END AS took_s"
        f" FROM (SELECT c.*, {ended} AS ended, {outcome} AS outcome FROM {{changed}} c WHERE {counted}) c) s) r"
    )
    counters = [f"sum({flag(f'r.outcome = {literal(status)}')})" for status in OUTCOME_COLUMNS]
    for variable, columns in (("late", LATENESS_COLUMNS), ("took", DURATION_COLUMNS)):
        counters += [f"sum({flag(f'r.{variable} = {i}')})" for i in range(len(columns))]
    added = [*OUTCOME_COLUMNS.values(), *LATENESS_COLUMNS, *DURATION_COLUMNS]
    shard = f"({'r.id' if shard_by_row else 'txid_current()'} % {ROLLUP_SHARDS})::smallint"
    failed = among("r.outcome", (S.FAILED, "RETRIED"))
    return [
        f"INSERT INTO {RUN_ROLLUP} (minute, {key}, runner, shard, {', '.join(added)})"
        f" SELECT {truncate('minute', 'r.ended')}, r.{key}, t.runner, {shard}, {', '.join(counters)}"
        f" FROM {rows} JOIN {TASK} t ON t.id = r.task_id GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
        f" ON CONFLICT (minute, {key}, runner, shard) DO UPDATE SET {_add_on_conflict(RUN_ROLLUP, added)}",
        f"INSERT INTO {TASK_ROLLUP} (hour, task_id, {key}, attempts, failures)"
        f" SELECT {truncate('hour', 'r.ended')}, r.task_id, r.{key}, count(*), sum({flag(failed)})"
        f" FROM {rows} GROUP BY 1, 2, 3 ORDER BY 2, 1"
        f" ON CONFLICT (task_id, hour) DO UPDATE SET {_add_on_conflict(TASK_ROLLUP, ('attempts', 'failures'))}",
    ]


def _part(key, *, shard_by_row):
    return triggers.StatusPart(
        "rollup", triggers.ROLLUP.targets, lambda: _rollup_before_extremes(key, shard_by_row=shard_by_row)
    )


#: Before this migration: by the tasks' owners (notifications 0007-0012 install it too).
ROLLUP_BY_OWNER = _part("owner_id", shard_by_row=True)
#: This migration's: by team, a shard per run.
ROLLUP_BY_ROW = _part("team_id", shard_by_row=True)
#: Migration 0030's: by team, the writing transaction's shard.
ROLLUP_WITHOUT_EXTREMES = _part("team_id", shard_by_row=False)


def _merge(cursor, model, key: str) -> None:
    """Add up the rows of RunRollup (the historical ``model``) that share (minute, ``key`` = 0,
    runner, shard) into the one with the lowest id, and delete the others: rows of different
    holders that went to 0."""
    table = model._meta.db_table
    counters = [f.column for f in model._meta.fields if isinstance(f, models.PositiveIntegerField)]
    same = f"o.{key} = 0 AND o.minute = {table}.minute AND o.runner = {table}.runner AND o.shard = {table}.shard"
    sums = ", ".join(f"{c} = (SELECT SUM(o.{c}) FROM {table} o WHERE {same})" for c in counters)
    firsts = f"SELECT MIN(id) FROM {table} WHERE {key} = 0 GROUP BY minute, runner, shard"
    cursor.execute(f"UPDATE {table} SET {sums} WHERE {key} = 0 AND id IN ({firsts} HAVING COUNT(*) > 1)")
    cursor.execute(f"DELETE FROM {table} WHERE {key} = 0 AND id NOT IN ({firsts})")


def _tables(apps):
    return (
        apps.get_model("executions", "RunRollup"),
        apps.get_model("executions", "TaskRollup")._meta.db_table,
        apps.get_model("tasks_app", "Task")._meta.db_table,
        apps.get_model("tasks_app", "Team")._meta.db_table,
    )


def to_teams(apps, schema_editor):
    model, hours, task, team = _tables(apps)
    runs = model._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {runs} SET team_id = COALESCE("
            f"(SELECT tm.id FROM {team} tm WHERE tm.personal_of_id = {runs}.owner_id), 0)"
        )
        _merge(cursor, model, "team_id")
        cursor.execute(
            f"UPDATE {hours} SET team_id = COALESCE("
            f"(SELECT t.team_id FROM {task} t WHERE t.id = {hours}.task_id),"
            f" (SELECT tm.id FROM {team} tm WHERE tm.personal_of_id = {hours}.owner_id), 0)"
        )


def to_owners(apps, schema_editor):
    model, hours, task, team = _tables(apps)
    runs = model._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {runs} SET owner_id = COALESCE("
            f"(SELECT tm.personal_of_id FROM {team} tm WHERE tm.id = {runs}.team_id), 0)"
        )
        _merge(cursor, model, "owner_id")
        cursor.execute(
            f"UPDATE {hours} SET owner_id = COALESCE("
            f"(SELECT t.owner_id FROM {task} t WHERE t.id = {hours}.task_id),"
            f" (SELECT tm.personal_of_id FROM {team} tm WHERE tm.id = {hours}.team_id), 0)"
        )


def install(apps, schema_editor):
    # The rollup as it was at this migration (shard per run, no extremes: 0030 and 0031 change it).
    schema_editor.execute(triggers.install(triggers.status_parts(ROLLUP_BY_ROW)), params=None)


def uninstall(apps, schema_editor):
    schema_editor.execute(triggers.install(triggers.status_parts(ROLLUP_BY_OWNER)), params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("executions", "0028_execution_team_fair_idx"),
        # After every migration of notifications that installs the trigger (with the rollup by
        # owner, as it was until this one): the one installed here is the last. Going back past
        # 0012 (the outbox by owner) goes back past this one first.
        ("notifications", "0012_channel_rule_team_not_null"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="runrollup", name="runrollup_unique_key"),
        migrations.RemoveIndex(model_name="taskrollup", name="taskrollup_failing_idx"),
        migrations.AddField(model_name="runrollup", name="team_id", field=models.IntegerField(null=True)),
        migrations.AddField(model_name="taskrollup", name="team_id", field=models.IntegerField(null=True)),
        # Nullable before the data moves, so that going back can add the column again and fill it.
        migrations.AlterField(model_name="runrollup", name="owner_id", field=models.IntegerField(null=True)),
        migrations.AlterField(model_name="taskrollup", name="owner_id", field=models.IntegerField(null=True)),
        migrations.RunPython(to_teams, to_owners, elidable=False),
        migrations.RemoveField(model_name="runrollup", name="owner_id"),
        migrations.RemoveField(model_name="taskrollup", name="owner_id"),
        migrations.AlterField(model_name="runrollup", name="team_id", field=models.IntegerField()),
        migrations.AlterField(model_name="taskrollup", name="team_id", field=models.IntegerField()),
        migrations.AddConstraint(
            model_name="runrollup",
            constraint=models.UniqueConstraint(
                fields=("minute", "team_id", "runner", "shard"), name="runrollup_unique_key"
            ),
        ),
        migrations.AddIndex(
            model_name="taskrollup",
            index=models.Index(
                condition=models.Q(("failures__gt", 0)),
                fields=["hour", "team_id"],
                include=("task", "failures"),
                name="taskrollup_failing_idx",
            ),
        ),
        migrations.RunPython(install, uninstall, elidable=False),
    ]
