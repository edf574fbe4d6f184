"""Task.expose_metrics: opt in to a per-task series at /metrics (ops/metrics.py)."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0004_misfire_settings_and_lean_indexes"),
        ("executions", "0006_rollup"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
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
    ]
