"""Notification channels and rules belong to teams (issue 30): the column, empty until 0011 fills it."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0009_rulestate_workflow"),
        ("tasks_app", "0030_team_owned_objects_data"),
    ]

    operations = [
        migrations.AddField(
            model_name="channel",
            name="team",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="notification_channels",
                to="tasks_app.team",
            ),
        ),
        migrations.AddField(
            model_name="rule",
            name="team",
            field=models.ForeignKey(
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="notification_rules",
                to="tasks_app.team",
            ),
        ),
    ]
