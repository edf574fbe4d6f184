"""Versions of a task: what its settings were after each change, and how two versions differ.

The task services write a :class:`~tasks_app.models.TaskVersion` in the transaction of each
change (``Task.version`` + 1); each execution records the number current when it was created
(``Execution.task_version``), so its page can show the settings it ran with and what has changed
since. A snapshot holds the settings as the audit log shows them: the runner config with its
secrets masked, never a secret, not even encrypted.

Version 1 is written lazily: a create records the task's settings once, in its audit entry
(``create``: every setting from nothing to its value), and :func:`version_first_ensure` writes
version 1 from that entry the first time anything needs it (a read of the task's versions, its
first change). Writing it at every create was a third of the rows' bytes of a bulk create (issue 50).
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection

from tasks_app.audit import audit_values, current_context
from tasks_app.fields import AUDITED_COLUMNS
from tasks_app.models import AuditAction, AuditEntry, TaskVersion
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


#: The keys of a new task's version 1 (tasks_api.task_writes._snapshot's, but the ones not versioned;
#: ``limits`` and ``after`` only when it has any): its create entry leaves out those that were None.
FIRST_VERSION_KEYS = (frozenset(AUDITED_COLUMNS) | {"config", "artifact", "calendar"}) - NOT_VERSIONED
#: Each of them None: a version 1's value of a setting its create entry does not name.
_FIRST_TEMPLATE = json.dumps(dict.fromkeys(sorted(FIRST_VERSION_KEYS)))


@functools.cache
def _first_statement() -> str:
    """Version 1 of each task named, from its first create entry, unless the task has a version: one
    statement."""
    quote = connection.ops.quote_name
    versions, audit = quote(TaskVersion._meta.db_table), quote(AuditEntry._meta.db_table)
    skipped = ", ".join(f"'{name}'" for name in sorted(NOT_VERSIONED))
    return f"""
        INSERT INTO {versions} (task_id, number, snapshot, changed, actor_name, source, created_at)
        SELECT DISTINCT ON (a.task_id) a.task_id, 1, %s::jsonb || COALESCE(
                (SELECT jsonb_object_agg(c.key, c.value -> 'to') FROM jsonb_each(a.changes) AS c
                 WHERE c.key NOT IN ({skipped})), '{{}}'::jsonb),
            '[]'::jsonb, a.actor_name, a.source, a.at
        FROM {audit} AS a
        WHERE a.task_id = ANY(%s::uuid[]) AND a.object_type = 'task' AND a.action = %s
            AND NOT EXISTS (SELECT FROM {versions} AS v WHERE v.task_id = a.task_id)
        ORDER BY a.task_id, a.id
        ON CONFLICT DO NOTHING
    """  # noqa: S608 - the models' table names; every value is a parameter


def version_first_ensure(task_id: Any) -> None:
    """Write version 1 of a task that has no version yet from its create entry (see the module):
    the same snapshot, author, source and time a create wrote before versions were lazy. Nothing
    when the task has a version, or no create entry (a task older than versions: its first change
    records the settings it had, ``tasks_api.editing``). Idempotent, and safe from two places at
    once (the unique number: the second insert does nothing). One statement."""
    version_first_ensure_many([task_id])


def version_first_ensure_many(task_ids: Iterable[Any]) -> None:
    """:func:`version_first_ensure` for each of ``task_ids``, in one statement (a list that names
    many tasks, such as the admin's search over every task's versions)."""
    ids = [str(task_id) for task_id in task_ids]
    if ids:
        with connection.cursor() as cursor:
            cursor.execute(_first_statement(), [_FIRST_TEMPLATE, ids, AuditAction.CREATE])


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
    if 1 in (ran, current):
        version_first_ensure(task_id)
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
