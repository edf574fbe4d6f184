"""Each execution records the version of its task it was created from (see
``executions/task_version.py``): the column, and on PostgreSQL the trigger that fills it."""

from django.db import migrations, models

# The trigger's SQL lives in executions/task_version.py, beside its SQLite twin (which
# executions/apps.py installs after each migrate); this migration installs it on PostgreSQL.
from executions.task_version import POSTGRESQL_INSTALL, POSTGRESQL_UNINSTALL, SQLITE_UNINSTALL


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL_INSTALL, params=None)
    # SQLite: installed after each migrate (tms_core/sqlite_triggers.py, executions/apps.py)


def uninstall(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    schema_editor.execute(POSTGRESQL_UNINSTALL if vendor == "postgresql" else SQLITE_UNINSTALL, params=None)


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
