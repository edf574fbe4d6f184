"""Executions copy their task's team (``Execution.team_id``), filled here for the history of an
existing install: the task's team (each user's personal team, tasks_app 0027); for a run whose
task row is gone, its owner's personal team; 0 (no team: staff only) if that is gone too."""

from django.db import migrations, models


def fill(apps, schema_editor):
    Execution = apps.get_model("executions", "Execution")
    Task = apps.get_model("tasks_app", "Task")
    Team = apps.get_model("tasks_app", "Team")
    e, t, tm = Execution._meta.db_table, Task._meta.db_table, Team._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {e} SET team_id = COALESCE("
            f"(SELECT t.team_id FROM {t} t WHERE t.id = {e}.task_id),"
            f" (SELECT tm.id FROM {tm} tm WHERE tm.personal_of_id = {e}.owner_id), 0)"
            " WHERE team_id IS NULL"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("executions", "0024_execution_replay"),
        ("tasks_app", "0028_task_team_not_null"),
    ]

    operations = [
        migrations.AddField(model_name="execution", name="team_id", field=models.IntegerField(null=True)),
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
