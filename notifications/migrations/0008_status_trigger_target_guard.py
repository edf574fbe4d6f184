"""The status trigger (executions/triggers.py) returns at once from a statement that moves no row
into a status any of its parts writes for (the monitor's take): installed again."""

from django.db import migrations

from executions import triggers
from notifications.triggers import MIGRATIONS_STATUS_PARTS


def install(apps, schema_editor):
    # SQLite's is installed after each migrate (notifications/apps.py); it has no such guard
    # (a row-level trigger with a WHEN).
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(triggers.postgresql_install(MIGRATIONS_STATUS_PARTS), params=None)


class Migration(migrations.Migration):
    dependencies = [("notifications", "0007_one_status_trigger")]

    # Going back keeps the function as it is: without the guard it wrote the same rows.
    operations = [migrations.RunPython(install, migrations.RunPython.noop, elidable=False)]
