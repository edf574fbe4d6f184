"""Each existing channel and rule goes to its owner's personal team (tasks_app 0030 made sure every
user has one), where the owner's tasks are since tasks_app 0027: each owner's default rules keep
speaking for exactly the tasks they spoke for."""

from django.db import migrations


def to_personal_teams(apps, schema_editor):
    teams = apps.get_model("tasks_app", "Team")._meta.db_table
    # One set-based statement per table (a correlated subquery).
    with schema_editor.connection.cursor() as cursor:
        for model in ("Channel", "Rule"):
            table = apps.get_model("notifications", model)._meta.db_table
            cursor.execute(
                f"UPDATE {table} SET team_id = (SELECT tm.id FROM {teams} tm WHERE tm.personal_of_id = {table}.owner_id)"
                " WHERE team_id IS NULL"
            )


class Migration(migrations.Migration):
    dependencies = [("notifications", "0010_channel_rule_team")]

    operations = [migrations.RunPython(to_personal_teams, migrations.RunPython.noop)]
