"""The execution -> task foreign key becomes a guard on deletion (see ``Execution.task``).

The constraint's check ran once per inserted execution (a query and a row lock, at commit): a
fifth of PostgreSQL's work in a cold materialiser pass. Its two halves are kept another way:

- inserting: every insert of executions holds a lock on the task's row, as the constraint's check
  did: a materialiser batch inserts for the tasks it holds FOR UPDATE (their rows give the
  owners); every other insert reads the task's row for the owner (NOT NULL) in the same statement,
  FOR KEY SHARE (``executions.transitions.sql.key_share``);
- deleting: the trigger below refuses, at commit as the deferred constraint did, to delete a task
  that still has executions. Django deletes a task's executions before the task (on_delete).
  On PostgreSQL the check's query sees what other transactions committed while the delete waited
  for the task's row lock (READ COMMITTED, the isolation Django runs in), so a materialiser batch
  that held the task locked and commits executions first makes the delete fail, as before.
"""

import django.db.models.deletion
from django.db import migrations, models

# The guard's SQL lives in executions/task_guard.py.
from executions.task_guard import INSTALL, UNINSTALL


def install_guard(apps, schema_editor):
    schema_editor.execute(INSTALL, params=None)


def uninstall_guard(apps, schema_editor):
    schema_editor.execute(UNINSTALL, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("executions", "0015_execution_owner_not_null"),
        ("tasks_app", "0013_named_limits"),
    ]

    operations = [
        migrations.AlterField(
            model_name="execution",
            name="task",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="executions",
                to="tasks_app.task",
            ),
        ),
        migrations.RunPython(install_guard, uninstall_guard),
    ]
