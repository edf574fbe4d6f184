"""A task create on the embedded SQLite default (issue 33's write path: the JSON written as text
goes through bulk_create there): the audit entry and the first version hold JSON objects."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.embedded import run_on_embedded_sqlite

SCRIPT = textwrap.dedent(
    """
    from django.contrib.auth import get_user_model
    from tasks_api.services import task_bulk_create
    from tasks_app.models import AuditEntry, TaskVersion

    user = get_user_model().objects.create_user("solo")
    tasks = task_bulk_create(owner=user, specs=[{"runner": "noop", "name": f"t{i}"} for i in range(3)])
    for task in tasks:
        entry = AuditEntry.objects.get(task_id=task.pk)
        version = TaskVersion.objects.get(task_id=task.pk)
        assert entry.changes["name"] == {"from": None, "to": task.name}, entry.changes
        assert version.snapshot["name"] == task.name and "status" not in version.snapshot, version.snapshot
    print("ok", len(tasks), task.first_execution is not None)
    """
)


def test_a_create_on_sqlite_stores_its_audit_changes_and_version_as_json(tmp_path: Path):
    assert run_on_embedded_sqlite(tmp_path, SCRIPT).split() == ["ok", "3", "True"]
