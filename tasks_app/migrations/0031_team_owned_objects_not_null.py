"""Calendars and artifacts always have a team now; names are unique per team (they were per owner:
after 0030 each owner's rows are alone in the owner's personal team, so no two collide)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0030_team_owned_objects_data"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name="artifact",
            name="team",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="artifacts", to="tasks_app.team"
            ),
        ),
        migrations.AlterField(
            model_name="calendar",
            name="team",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="calendars", to="tasks_app.team"
            ),
        ),
        migrations.AlterField(
            model_name="limit",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                help_text="Who defined it (empty for a global limit).",
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="tms_limits",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RemoveConstraint(model_name="calendar", name="calendar_unique_name_per_owner"),
        migrations.AddConstraint(
            model_name="calendar",
            constraint=models.UniqueConstraint(fields=("team", "name"), name="calendar_unique_name_per_team"),
        ),
        migrations.RemoveConstraint(model_name="limit", name="limit_unique_name_per_owner"),
        migrations.RemoveConstraint(model_name="limit", name="limit_unique_global_name"),
        migrations.AddConstraint(
            model_name="limit",
            constraint=models.UniqueConstraint(
                condition=models.Q(("team__isnull", False)), fields=("team", "name"), name="limit_unique_name_per_team"
            ),
        ),
        migrations.AddConstraint(
            model_name="limit",
            constraint=models.UniqueConstraint(
                condition=models.Q(("team__isnull", True)), fields=("name",), name="limit_unique_global_name"
            ),
        ),
    ]
