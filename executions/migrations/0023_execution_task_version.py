"""Each execution records the version of its task it was created from (see
``executions/task_version.py``): the column, and the trigger that fills it."""

from django.db import migrations, models

# The trigger's SQL lives in executions/task_version.py.
from executions.task_version import INSTALL, UNINSTALL


def install(apps, schema_editor):
    schema_editor.execute(INSTALL, params=None)


def uninstall(apps, schema_editor):
    schema_editor.execute(UNINSTALL, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("executions", "0022_execution_workflow"),
        ("tasks_app", "0024_task_versions_and_hooks"),
    ]

    operations = [
        migrations.AddField(
            model_name="execution",
            name="task_version",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(install, uninstall),
    ]
