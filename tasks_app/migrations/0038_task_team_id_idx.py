"""An index of (team, id) on tasks: a team's task ids read from the index alone (see the model)."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY: an install with many tasks keeps taking writes while it builds
    # (it cannot run inside a transaction).
    atomic = False

    dependencies = [("tasks_app", "0037_credentials_created_by_token")]

    operations = [
        AddIndexConcurrently(model_name="task", index=models.Index(fields=["team", "id"], name="task_team_id_idx")),
    ]
