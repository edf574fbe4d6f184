"""One index for a task's executions by time and for the occurrence's uniqueness (see
``Execution.Meta.constraints``): the new unique index is built before the two it replaces go."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("executions", "0016_execution_task_without_fk_constraint"),
        ("tasks_app", "0013_named_limits"),
    ]

    operations = [
        migrations.AddConstraint(
            model_name="execution",
            constraint=models.UniqueConstraint(
                models.F("task"),
                models.F("scheduled_for"),
                models.Case(models.When(superseded=True, then=models.F("id")), default=models.Value(0)),
                name="execution_occurrence",
            ),
        ),
        migrations.RemoveConstraint(model_name="execution", name="execution_unique_occurrence"),
        migrations.RemoveIndex(model_name="execution", name="execution_task_idx"),
    ]
