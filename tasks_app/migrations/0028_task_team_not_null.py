import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tasks_app", "0027_personal_teams")]

    operations = [
        migrations.AlterField(
            model_name="task",
            name="team",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="tasks", to="tasks_app.team"
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("status", "DELETED"), _negated=True),
                fields=["team", "-created_at", "-id"],
                name="task_team_live_idx",
            ),
        ),
    ]
