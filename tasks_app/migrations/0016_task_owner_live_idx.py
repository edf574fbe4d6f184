"""An owner's task list, newest first, and its count (see ``Task.Meta.indexes``)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0015_cron_day_rule_and_ascii"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                fields=["owner", "-created_at"],
                condition=models.Q(("status", "DELETED"), _negated=True),
                name="task_owner_live_idx",
            ),
        ),
    ]
