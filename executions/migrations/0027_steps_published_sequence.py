"""A counter of the workflow steps workers publish themselves (executions.transitions.dispatch,
``executions_take_steps``), which the monitor's pacer reads to tell runs started from runs
published beside it (executions.fairness). A sequence: bumped without a row lock or a
transaction of its own, read without one."""

from django.db import migrations

SEQUENCE = "executions_steps_published"


def create(apps, schema_editor):
    schema_editor.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}")


def drop(apps, schema_editor):
    schema_editor.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")


class Migration(migrations.Migration):
    dependencies = [("executions", "0026_execution_team_not_null")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
