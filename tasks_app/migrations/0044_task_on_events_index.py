"""A partial GIN index of the tasks that subscribe to named events (``on_events``): what
``POST /api/v1/events/{name}`` reads (``on_events @> [{"name": ...}]``), without a scan of a
team's every task. Tasks that subscribe to nothing are not in it."""

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY: an install with many tasks keeps taking writes while it builds
    # (it cannot run inside a transaction).
    atomic = False

    dependencies = [("tasks_app", "0043_event_urls")]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=GinIndex(
                condition=~models.Q(on_events=[]),
                fields=["on_events"],
                name="task_on_events_idx",
                opclasses=["jsonb_path_ops"],
            ),
        ),
    ]
