"""Channels and rules always have a team; a team's default rules are found by team, and the
outbox's triggers match rules by team: the status trigger (executions/triggers.py with
notifications/triggers.py) and the skipped-occurrence function are installed again. Going back
installs the triggers that match by owner."""

import django.db.models.deletion
from django.db import migrations, models

from executions import triggers
from notifications import triggers as notify


def install(apps, schema_editor):
    # SQLite's are installed after each migrate (notifications/apps.py).
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(triggers.postgresql_install(notify.MIGRATIONS_STATUS_PARTS), params=None)
        schema_editor.execute(notify.postgresql_skipped(), params=None)


def uninstall(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(triggers.postgresql_install(notify.STATUS_PARTS_BY_OWNER), params=None)
        schema_editor.execute(notify.postgresql_skipped("owner_id"), params=None)


class Migration(migrations.Migration):
    dependencies = [("notifications", "0011_channel_rule_team_data")]

    operations = [
        migrations.AlterField(
            model_name="channel",
            name="team",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="notification_channels", to="tasks_app.team"
            ),
        ),
        migrations.AlterField(
            model_name="rule",
            name="team",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="notification_rules",
                to="tasks_app.team",
            ),
        ),
        migrations.RemoveIndex(model_name="rule", name="rule_owner_default_idx"),
        migrations.AddIndex(
            model_name="rule",
            index=models.Index(
                condition=models.Q(("enabled", True), ("task__isnull", True)),
                fields=["team"],
                name="rule_team_default_idx",
            ),
        ),
        migrations.RunPython(install, uninstall, elidable=False),
    ]
