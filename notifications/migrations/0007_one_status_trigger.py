"""One statement-level status trigger (executions.triggers) in place of two row-level ones: the
rollup's (executions 0006) and the outbox's (0001).

It lives in this app because the trigger writes this app's outbox as well as executions' rollup,
and this app sits above executions (see notifications/triggers.py). Going back reinstalls the two row-level triggers from the
migrations that defined them (their frozen SQL).
"""

import importlib

from django.db import migrations

from executions import triggers
from notifications.triggers import OUTBOX_PART

_rollup = importlib.import_module("executions.migrations.0006_rollup")
_outbox = importlib.import_module("notifications.migrations.0001_initial")
_rollup_forms = importlib.import_module("executions.migrations.0029_rollup_team")

#: What this app's migrations (0007-0012) install: the rollup by owner, as it was until
#: executions 0029 kept it by team (frozen there). 0029 depends on them and installs the trigger
#: again, by team, so no state between writes to rollup columns that are not there yet
#: (executions 0025 updates every execution, which fires the trigger).
MIGRATIONS_STATUS_PARTS = (_rollup_forms.ROLLUP_BY_OWNER, OUTBOX_PART)


def install(apps, schema_editor):
    schema_editor.execute(_rollup.POSTGRESQL_UNINSTALL, params=None)
    schema_editor.execute(
        "DROP TRIGGER IF EXISTS tms_notify_execution ON executions_execution;"
        " DROP FUNCTION IF EXISTS tms_notify_execution();",
        params=None,
    )
    schema_editor.execute(triggers.install(MIGRATIONS_STATUS_PARTS), params=None)


def uninstall(apps, schema_editor):
    schema_editor.execute(triggers.UNINSTALL, params=None)
    schema_editor.execute(_rollup.postgresql_install(), params=None)
    # 0001's install also creates the skipped-occurrence trigger, still there: drop it first.
    schema_editor.execute(_outbox.POSTGRESQL_UNINSTALL, params=None)
    schema_editor.execute(_outbox.POSTGRESQL_INSTALL, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0006_channel_failing_rule"),
        ("executions", "0019_worker_node_name"),
    ]

    operations = [migrations.RunPython(install, uninstall, elidable=False)]
