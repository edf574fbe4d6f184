"""Each rollup row keeps the smallest and largest lateness and duration it counted
(``RunRollup.lateness_min`` ... ``duration_max``): a percentile estimated from the histogram
buckets is clamped to them (executions.histogram.percentile), so the dashboard never shows a p99
above the longest run. The status trigger is installed again with the parts of the apps above
this one; going back installs the rollup without them. Rows written before stay without extremes (NULL): their
percentiles are the buckets' estimates, as before, until a rebuild
(executions.rollup.rollup_rebuild) recounts them.
"""

import importlib

from django.db import migrations, models

from executions import triggers

# The rollup's earlier forms, frozen in 0029.
_forms = importlib.import_module("executions.migrations.0029_rollup_team")


def install(apps, schema_editor):
    schema_editor.execute(triggers.install(triggers.status_parts()), params=None)


def uninstall(apps, schema_editor):
    schema_editor.execute(triggers.install(triggers.status_parts(_forms.ROLLUP_WITHOUT_EXTREMES)), params=None)


class Migration(migrations.Migration):
    dependencies = [("executions", "0030_rollup_shard_per_transaction")]

    operations = [
        *(
            migrations.AddField("runrollup", name, models.FloatField(blank=True, null=True))
            for name in ("lateness_min", "duration_min", "lateness_max", "duration_max")
        ),
        migrations.RunPython(install, uninstall, elidable=False),
    ]
