"""The task lists page by keyset on ``(created_at, id)``, newest first: the staff and owner
indexes of tasks not deleted end with the id, so a page is one index range read from the cursor
(``Paginator`` counted every matching task for "page N of M" and read past the pages before)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0017_task_search_trigram"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="task", name="task_created_idx"),
        migrations.RemoveIndex(model_name="task", name="task_owner_live_idx"),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                fields=["-created_at", "-id"],
                condition=models.Q(("status", "DELETED"), _negated=True),
                name="task_created_idx",
            ),
        ),
        # Staff's list filtered by a status (PAUSED, COMPLETED) read that status's tasks only: in
        # task_created_idx it walked every task for the few paused ones (48 ms at 100,000 tasks).
        migrations.AddIndex(
            model_name="task",
            index=models.Index(fields=["status", "-created_at", "-id"], name="task_status_created_idx"),
        ),
        # The search's other half (runner = q): with the name's trigram index, the two conditions
        # are two index reads joined (a BitmapOr) instead of a scan of every task for a rare name.
        migrations.AddIndex(model_name="task", index=models.Index(fields=["runner"], name="task_runner_idx")),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                fields=["owner", "-created_at", "-id"],
                condition=models.Q(("status", "DELETED"), _negated=True),
                name="task_owner_live_idx",
            ),
        ),
    ]
