from django.db import migrations


class Migration(migrations.Migration):
    """The field was stored and never used; notifications are channels and rules now (its values
    became those in notifications 0002)."""

    dependencies = [
        ("tasks_app", "0009_task_retention"),
        ("notifications", "0002_rules_from_notification_target"),
    ]

    operations = [migrations.RemoveField(model_name="task", name="notification_target")]
