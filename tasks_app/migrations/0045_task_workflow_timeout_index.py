"""A partial index of the tasks with a ``workflow_timeout``: what beat's ``tms.workflow_timeouts``
job reads every minute, without a scan of every task (a million tasks: a few hundred MB a minute)."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY: an install with many tasks keeps taking writes while it builds
    # (it cannot run inside a transaction).
    atomic = False

    dependencies = [("tasks_app", "0044_task_on_events_index")]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(workflow_timeout__isnull=False), fields=["id"], name="task_workflow_timeout_idx"
            ),
        ),
    ]
