"""The task list's search (``?q=``, ``name ILIKE '%q%'``) served by a trigram index.

A leading wildcard rules out a B-tree: without this index every search read all the task names
(18 ms of PostgreSQL CPU at 100,000 tasks). ``pg_trgm`` is a trusted extension (the database's
owner may create it). The index is on ``UPPER(name)`` because that is what Django's
``icontains`` compares on PostgreSQL. The index is added by :func:`_add_index`, outside the
model's state (Task.Meta names it in a comment).
"""

from django.contrib.postgres.indexes import GinIndex, OpClass
from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations
from django.db.models.functions import Upper

#: Name of the index (also referred to by tasks_app.models.Task.Meta's comment).
INDEX_NAME = "task_name_trgm_idx"


def _index() -> GinIndex:
    return GinIndex(OpClass(Upper("name"), name="gin_trgm_ops"), name=INDEX_NAME)


def _add_index(apps, schema_editor):
    schema_editor.add_index(apps.get_model("tasks_app", "Task"), _index())


def _remove_index(apps, schema_editor):
    schema_editor.remove_index(apps.get_model("tasks_app", "Task"), _index())


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0016_task_owner_live_idx"),
    ]

    operations = [
        TrigramExtension(),
        migrations.RunPython(_add_index, _remove_index),
    ]
