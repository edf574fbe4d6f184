"""Versions of a task: what its settings were after each change, and how two versions differ.

The task services write a :class:`~tasks_app.models.TaskVersion` in the transaction of each
create (number 1) and each change (``Task.version`` + 1); each execution records the number
current when it was created (``Execution.task_version``), so its page can show the settings it
ran with and what has changed since. A snapshot holds the settings as the audit log shows them:
the runner config with its secrets masked, never a secret, not even encrypted.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from tasks_app.audit import audit_values, current_context
from tasks_app.models import TaskVersion
from tms_core.bulk import JsonText, insert_columns

#: Kept out of a snapshot: the lifecycle (pause, resume, completion) and the team (who may see
#: and act on it, moved by tasks_api.moving.task_move) are not settings the run uses.
NOT_VERSIONED = frozenset({"status", "team"})


def version_snapshot(values: Mapping[str, Any]) -> dict[str, Any]:
    """A task's audited values (config already masked) as a version stores them."""
    return audit_values({name: value for name, value in values.items() if name not in NOT_VERSIONED})


def _who() -> tuple[str, str]:
    context = current_context()
    if context is None:
        return "system", "system"
    return context.who()[1][:150], context.source[:100]


def version_record(*, task_id: Any, number: int, snapshot: Mapping[str, Any], changed: Iterable[str]) -> None:
    """Write version ``number`` of a task, as the current audit context's actor and source."""
    version_record_many([(task_id, number, snapshot, sorted(set(changed) - NOT_VERSIONED))])


def version_record_many(rows: Sequence[tuple[Any, int, Mapping[str, Any] | JsonText, list[str]]]) -> None:
    """Write many versions (``(task_id, number, snapshot, changed)``) in one INSERT (a bulk create
    makes one per task). A snapshot may come as its JSON text (:class:`~tms_core.bulk.JsonText`)."""
    if not rows:
        return
    actor, source = _who()
    count = len(rows)
    insert_columns(
        TaskVersion,
        {
            "task_id": [row[0] for row in rows],
            "number": [row[1] for row in rows],
            # Encoded once, by the column's encoder (DjangoJSONEncoder, as the snapshot is read back).
            "snapshot": [row[2] for row in rows],
            "changed": [list(row[3]) for row in rows],
            "actor_name": [actor] * count,
            "source": [source] * count,
        },
    )


def _lines(snapshot: Mapping[str, Any]) -> list[str]:
    return json.dumps(snapshot, indent=2, sort_keys=True, cls=DjangoJSONEncoder).splitlines()


def version_diff(old: Mapping[str, Any], new: Mapping[str, Any], *, old_label: str, new_label: str) -> list[str]:
    """A unified diff (lines) of two snapshots, as pretty JSON with sorted keys; empty when equal."""
    return list(difflib.unified_diff(_lines(old), _lines(new), fromfile=old_label, tofile=new_label, lineterm=""))


def version_changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The top-level settings whose values differ between two snapshots."""
    return sorted(name for name in set(old) | set(new) if old.get(name) != new.get(name))


def version_comparison(*, task_id: Any, ran: int | None, current: int) -> dict[str, Any] | None:
    """What an execution's page shows of the settings it ran with: version ``ran`` of the task
    (its snapshot as pretty JSON, secrets masked) and, when the task has changed since, a diff to
    version ``current`` as ``(kind, line)`` pairs (kind: ``add``, ``del``, ``hunk`` or ``""``).
    None when the execution records no version or the version was never written (a task older
    than versions, unchanged since)."""
    if ran is None:
        return None
    versions = {v.number: v for v in TaskVersion.objects.filter(task_id=task_id, number__in={ran, current})}
    mine = versions.get(ran)
    if mine is None:
        return None
    now = versions.get(current)
    diff: list[tuple[str, str]] = []
    changed: list[str] = []
    if now is not None and current != ran:
        changed = version_changed_keys(mine.snapshot, now.snapshot)
        lines = version_diff(mine.snapshot, now.snapshot, old_label=f"version {ran}", new_label=f"version {current}")
        for line in lines:
            if line.startswith(("+++", "---")):
                kind = "file"
            elif line.startswith("@@"):
                kind = "hunk"
            else:
                kind = {"+": "add", "-": "del"}.get(line[:1], "")
            diff.append((kind, line))
    return {
        "number": ran,
        "current": current,
        "settings": "\n".join(_lines(mine.snapshot)),
        "changed": changed,
        "diff": diff,
        "author": mine.actor_name,
        "at": mine.created_at,
    }
