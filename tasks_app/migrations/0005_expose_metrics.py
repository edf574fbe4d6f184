"""Task.expose_metrics: opt in to a per-task series at /metrics (ops/metrics.py).

On SQLite (the embedded default) adding a NOT NULL column rebuilds the task table, which the
execution table's rollup trigger (executions 0006) refers to: SQLite refuses the rename while
the trigger exists, so it is dropped around the rebuild and installed again.
"""

import importlib

from django.conf import settings
from django.db import migrations, models

_rollup = importlib.import_module("executions.migrations.0006_rollup")


def _drop_sqlite_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(_rollup.SQLITE_UNINSTALL, params=None)


def _install_sqlite_trigger(apps, schema_editor):
    # Installed after each migrate since (tms_core/sqlite_triggers.py): nothing to put back here.
    pass


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0004_misfire_settings_and_lean_indexes"),
        ("executions", "0006_rollup"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(_drop_sqlite_trigger, _install_sqlite_trigger, elidable=False),
        migrations.AddField(
            model_name="task",
            name="expose_metrics",
            field=models.BooleanField(
                default=False, help_text="Publish this task's last success time at /metrics (Prometheus)."
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("expose_metrics", True)), fields=["id"], name="task_expose_metrics_idx"
            ),
        ),
        migrations.RunPython(_install_sqlite_trigger, _drop_sqlite_trigger, elidable=False),
    ]
