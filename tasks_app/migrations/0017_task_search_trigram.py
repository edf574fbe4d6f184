"""The task list's search (``?q=``, ``name ILIKE '%q%'``) served by a trigram index on PostgreSQL.

A leading wildcard rules out a B-tree: without this index every search read all the task names
(18 ms of PostgreSQL CPU at 100,000 tasks). ``pg_trgm`` is a trusted extension (the database's
owner may create it). The index is on ``UPPER(name)`` because that is what Django's
``icontains`` compares on PostgreSQL.

Both operations do nothing on SQLite (the embedded default), either way: ``TrigramExtension``
checks the vendor going forwards but not backwards (it asks SQLite for ``pg_extension``), hence
:class:`_Trigram`; the index is added by :func:`_add_index` only on PostgreSQL. The index is kept
out of the model's state on purpose, so SQLite's table rebuilds in later migrations never try to
create a GIN index.
"""

from django.contrib.postgres.indexes import GinIndex, OpClass
from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations
from django.db.models.functions import Upper

#: Name of the index (also referred to by tasks_app.models.Task.Meta's comment).
INDEX_NAME = "task_name_trgm_idx"


class _Trigram(TrigramExtension):
    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


def _index() -> GinIndex:
    return GinIndex(OpClass(Upper("name"), name="gin_trgm_ops"), name=INDEX_NAME)


def _add_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.add_index(apps.get_model("tasks_app", "Task"), _index())


def _remove_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.remove_index(apps.get_model("tasks_app", "Task"), _index())


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0016_task_owner_live_idx"),
    ]

    operations = [
        _Trigram(),
        migrations.RunPython(_add_index, _remove_index),
    ]
