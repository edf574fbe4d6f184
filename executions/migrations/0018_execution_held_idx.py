"""Runs held back although due (``waiting`` set by a task's max_concurrency or a named limit), by
owner and fire time: the dashboard's due backlog counts them (see ``Execution.Meta.indexes``)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("executions", "0017_execution_occurrence_one_index"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="execution",
            index=models.Index(
                condition=models.Q(("status", "SCHEDULED"), models.Q(("waiting", ""), _negated=True)),
                fields=["owner_id", "scheduled_for"],
                name="execution_held_idx",
            ),
        ),
    ]
