"""The status trigger (executions/triggers.py) returns at once from a statement that moves no row
into a status any of its parts writes for (the monitor's take): installed again."""

import importlib

from django.db import migrations

from executions import triggers

# The parts this app's migrations install (0007).
MIGRATIONS_STATUS_PARTS = importlib.import_module("notifications.migrations.0007_one_status_trigger").MIGRATIONS_STATUS_PARTS


def install(apps, schema_editor):
    schema_editor.execute(triggers.install(MIGRATIONS_STATUS_PARTS), params=None)


class Migration(migrations.Migration):
    dependencies = [("notifications", "0007_one_status_trigger")]

    # Going back keeps the function as it is: without the guard it wrote the same rows.
    operations = [migrations.RunPython(install, migrations.RunPython.noop, elidable=False)]
