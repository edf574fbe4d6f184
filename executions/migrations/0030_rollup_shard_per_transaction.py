"""The status trigger writes a minute's rollup row in the shard of the transaction that ends the
runs (its id modulo ``ROLLUP_SHARDS``), not one shard per run (executions.triggers): a worker's
transaction that ends a chunk of workflow steps and creates the next ones held every shard row of
the minute until it committed, and every other worker's end waited for it. Installed again with
the parts of the apps above this one (executions.triggers.status_parts); going back installs the
shard per run. The rows already written stay as they are: the dashboard sums a minute's shards,
and the fold (executions.rollup.rollup_compact) takes any shard above 0."""

import importlib

from django.db import migrations

from executions import triggers

# The rollup's earlier forms, frozen in 0029.
_forms = importlib.import_module("executions.migrations.0029_rollup_team")


def install(apps, schema_editor):
    # As it was at this migration (no extremes yet: 0031 adds them).
    schema_editor.execute(triggers.install(triggers.status_parts(_forms.ROLLUP_WITHOUT_EXTREMES)), params=None)


def uninstall(apps, schema_editor):
    schema_editor.execute(triggers.install(triggers.status_parts(_forms.ROLLUP_BY_ROW)), params=None)


class Migration(migrations.Migration):
    dependencies = [("executions", "0029_rollup_team")]

    operations = [migrations.RunPython(install, uninstall, elidable=False)]
