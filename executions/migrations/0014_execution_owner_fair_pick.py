from django.db import migrations, models

# Every execution's owner, copied from its task (executions.fairness reads it). The backfill
# rewrites every row once: on a large history, run it in a maintenance window.
BACKFILL = """
UPDATE executions_execution SET owner_id = (
    SELECT t.owner_id FROM tasks_app_task t WHERE t.id = executions_execution.task_id
)
"""


class Migration(migrations.Migration):
    dependencies = [
        ("executions", "0013_named_limit_buckets_slots_starts"),
    ]

    operations = [
        migrations.AddField(model_name="execution", name="owner_id", field=models.IntegerField(null=True)),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
