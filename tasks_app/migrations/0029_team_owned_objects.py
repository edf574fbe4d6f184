"""Limits, calendars and artifacts belong to teams (issue 30): the column, empty until 0030 fills
it from each row's owner (a limit without an owner is global and keeps no team)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tasks_app", "0028_task_team_not_null")]

    operations = [
        migrations.AddField(
            model_name="artifact",
            name="team",
            field=models.ForeignKey(
                null=True, on_delete=django.db.models.deletion.PROTECT, related_name="artifacts", to="tasks_app.team"
            ),
        ),
        migrations.AddField(
            model_name="calendar",
            name="team",
            field=models.ForeignKey(
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="calendars",
                to="tasks_app.team",
            ),
        ),
        migrations.AddField(
            model_name="limit",
            name="team",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                help_text="Empty: a global limit (staff), any team's task may reference it.",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="limits",
                to="tasks_app.team",
            ),
        ),
    ]
