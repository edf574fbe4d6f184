"""Staff's task list, newest first, and its count (see ``Task.Meta.indexes``)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0013_named_limits"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                fields=["-created_at"],
                condition=models.Q(("status", "DELETED"), _negated=True),
                name="task_created_idx",
            ),
        ),
    ]
