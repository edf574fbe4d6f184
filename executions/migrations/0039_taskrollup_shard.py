"""A task's hour in the rollup (``TaskRollup``) is sharded by the writing transaction, as a
minute's rows are since 0030: the items of a workflow's map step are runs of one task, and the
workers' transactions that ended them (each also starting what follows) took turns on that task's
hour row until they committed. The rows already written are shard 0. The status trigger is
installed again with the parts of the apps above this one; going back first adds each hour's
shards up into shard 0, then installs the trigger that writes one row per task and hour (its
statement frozen here, from the current one)."""

from django.db import migrations, models

from executions import triggers

TASK_ROLLUP = "executions_taskrollup"

# The current task-hour statement, back to one row per task and hour: each piece must be there once.
_UNSHARDED = (
    ("(hour, task_id, team_id, shard, attempts, failures)", "(hour, task_id, team_id, attempts, failures)"),
    (", r.team_id, (txid_current() % 8)::smallint, count(*)", ", r.team_id, count(*)"),
    (" GROUP BY 1, 2, 3, 4 ORDER BY 2, 1, 4", " GROUP BY 1, 2, 3 ORDER BY 2, 1"),
    ("ON CONFLICT (task_id, hour, shard)", "ON CONFLICT (task_id, hour)"),
)


def _rollup_unsharded_tasks() -> list[str]:
    runs, tasks = triggers.ROLLUP.statements()
    for sharded, plain in _UNSHARDED:
        assert tasks.count(sharded) == 1, sharded
        tasks = tasks.replace(sharded, plain)
    return [runs, tasks]


ROLLUP_TASKS_UNSHARDED = triggers.StatusPart("rollup", triggers.ROLLUP.targets, _rollup_unsharded_tasks)


def install(apps, schema_editor):
    schema_editor.execute(triggers.install(triggers.status_parts()), params=None)


def uninstall(apps, schema_editor):
    schema_editor.execute(triggers.install(triggers.status_parts(ROLLUP_TASKS_UNSHARDED)), params=None)


def merge_shards(apps, schema_editor):
    schema_editor.execute(
        f"WITH folded AS (DELETE FROM {TASK_ROLLUP} WHERE shard > 0 RETURNING *)"  # noqa: S608 - our names
        f" , merged AS (INSERT INTO {TASK_ROLLUP} (hour, task_id, team_id, shard, attempts, failures)"
        " SELECT hour, task_id, max(team_id), 0, sum(attempts), sum(failures) FROM folded GROUP BY hour, task_id"
        f" ON CONFLICT (task_id, hour, shard) DO UPDATE SET attempts = {TASK_ROLLUP}.attempts + EXCLUDED.attempts,"
        f" failures = {TASK_ROLLUP}.failures + EXCLUDED.failures) SELECT count(*) FROM folded",
        params=None,
    )


class Migration(migrations.Migration):
    dependencies = [("executions", "0038_received_events")]

    operations = [
        migrations.AddField("taskrollup", "shard", models.SmallIntegerField(db_default=0, default=0)),
        migrations.RemoveConstraint("taskrollup", "taskrollup_unique_key"),
        migrations.AddConstraint(
            "taskrollup",
            models.UniqueConstraint(fields=["task", "hour", "shard"], name="taskrollup_unique_shard"),
        ),
        # Going back: the shards added up before the key without them returns.
        migrations.RunPython(migrations.RunPython.noop, merge_shards, elidable=False),
        migrations.RunPython(install, uninstall, elidable=False),
    ]
