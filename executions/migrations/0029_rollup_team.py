"""The dashboard's rollups are kept by team (``RunRollup.team_id``, ``TaskRollup.team_id``) instead
of by the tasks' owner, so a team's members see the figures of the team's runs.

The rows already there go, set-based:

* a minute's row to its owner's personal team (every user has one: tasks_app 0027), which is
  where that owner's tasks were; a row of a user deleted since goes to no team (0: staff only,
  as executions 0025 did for their runs), rows that then share a key added into one;
* a task's hour to the team the task is in now (where its executions are since executions
  0025, and where its hours go when it moves: tasks_api.services.task_move), else its owner's
  personal team, else 0.

The status trigger writes the execution's ``team_id`` where it wrote its ``owner_id``: installed
again here (PostgreSQL; SQLite's is installed after each migrate, notifications/apps.py) with the
parts of the apps above this one as they registered them (executions.triggers.status_parts).
Going back gives each row its team's personal owner (0 for a shared team's rows, added up) and
installs the trigger that keeps the rollups by owner.
"""

from django.db import migrations, models

from executions import triggers


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
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(triggers.postgresql_install(triggers.status_parts()), params=None)


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(triggers.postgresql_install(triggers.status_parts(triggers.ROLLUP_BY_OWNER)), params=None)


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
