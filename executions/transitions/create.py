"""Creating executions: the materialiser's occurrences and backfills (``'' → SCHEDULED``)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from executions.models import Execution
from executions.models import ExecutionStatus as S
from executions.transitions.sql import EXECUTIONS, TASKS, Event, key_share, pg_array, with_events
from tms_core import tracing


@dataclass(frozen=True)
class NewExecution:
    task_id: object
    scheduled_for: datetime
    priority: int
    #: When the monitor should publish it; ``scheduled_for`` unless the task has jitter.
    due_at: datetime | None = None
    #: The task's overlap policy is not "allow" (or it has a max_concurrency): claims go through
    #: :func:`~executions.transitions.overlap.execution_claim_exclusive`.
    exclusive: bool = False
    #: The fire time a business calendar moved this occurrence from (``scheduled_for`` is where to).
    moved_from: datetime | None = None


#: Rows per INSERT statement.
_INSERT_CHUNK = 5000

#: The columns an insert sets; the others take their database defaults.
_COLUMNS = (
    "task_id, scheduled_for, due_at, priority, exclusive, origin, status, attempt,"
    " lease_owner, external_run_id, run_handle, message_id, output, error, owner_id, team_id,"
    " moved_from"
)
#: The constant columns' values, after ``origin``.
_CONSTANTS = "%s, 1, '', '', '{}', '', '', ''"
#: A row's owner, read from its task by primary key (a scalar subquery rather than a join, so
#: that rows are inserted, and their ids given, in the order they are listed). A missing task
#: gives no owner, which NOT NULL refuses; the task is locked as a foreign key's check would
#: (``key_share``), so it cannot be deleted before the insert commits.
_OWNER = f"(SELECT t.owner_id FROM {TASKS} t WHERE t.id = {{}}{key_share('t')})"  # noqa: S608 - our table name
#: Its team, the same way. Locked too: a locking read returns the task's latest version, so a
#: task moved to another team while this insert waited gives the new team, never the old one.
_TEAM = f"(SELECT t.team_id FROM {TASKS} t WHERE t.id = {{}}{key_share('t')})"  # noqa: S608 - our table name

_INSERT = f"""
    INSERT INTO {EXECUTIONS} ({_COLUMNS})
    SELECT v.task_id, v.scheduled_for, v.due_at, v.priority, v.exclusive, %s, {_CONSTANTS},
        {_OWNER.format("v.task_id")}, {_TEAM.format("v.task_id")},
        v.moved_from
    FROM unnest(%s::uuid[], %s::timestamptz[], %s::timestamptz[], %s::smallint[], %s::boolean[], %s::timestamptz[])
        AS v (task_id, scheduled_for, due_at, priority, exclusive, moved_from)
    ON CONFLICT DO NOTHING
"""  # noqa: S608 - table names are ours; every value is a parameter
#: A materialiser pass's INSERT: the caller holds the tasks' rows locked (FOR UPDATE) and gives
#: their owners, so no row looks its task up (100,000 index probes in a cold pass over 100,000
#: tasks).
#: It names each row's task version too (the tasks it holds give them), so that the insert
#: trigger that fills it otherwise (executions/task_version.py, about 8 us a row) does not run.
_INSERT_OWNED = f"""
    INSERT INTO {EXECUTIONS} ({_COLUMNS}, task_version)
    SELECT v.task_id, v.scheduled_for, v.due_at, v.priority, v.exclusive, %s, {_CONSTANTS}, v.owner_id, v.team_id,
        NULL, v.version
    FROM unnest(
        %s::uuid[], %s::timestamptz[], %s::timestamptz[], %s::smallint[], %s::boolean[], %s::integer[], %s::integer[],
        %s::integer[]
    ) AS v (task_id, scheduled_for, due_at, priority, exclusive, owner_id, team_id, version)
    ON CONFLICT DO NOTHING
"""  # noqa: S608 - table names are ours; every value is a parameter


def executions_create(
    *, rows: Sequence[NewExecution], actor: str, detail: str = "", origin: str = "schedule"
) -> list[int]:
    """Insert SCHEDULED executions, skipping occurrences that already exist; return the new ids.

    ``INSERT … ON CONFLICT DO NOTHING`` on the unique (task, scheduled_for) of non-superseded
    rows makes materialising the same occurrence twice, or in two processes at once, create it
    exactly once. No conflict target: the occurrence uniqueness is a partial index (superseded
    rows leave it). ``origin`` is ``schedule``, or ``backfill`` for a backfill's runs.
    """
    if not rows:
        return []
    event = Event("", S.SCHEDULED, actor, detail)
    ids: list[int] = []
    # No savepoint inside a caller's transaction (a task create's): a failure fails the caller's
    # write as a whole anyway, and the savepoint cost two round trips per create. One statement
    # and no trace to stamp need no transaction of their own: it is one already (or the caller's,
    # or with the statements sent with it, tms_core.together: a single create's one round trip).
    several = len(rows) > _INSERT_CHUNK or tracing.ON
    with transaction.atomic(savepoint=False) if several else contextlib.nullcontext():
        for start in range(0, len(rows), _INSERT_CHUNK):
            statement, params = _insert(rows[start : start + _INSERT_CHUNK], origin)
            ids += [row[0] for row in with_events(statement, params, event)]
        stamp_trace(ids)
    return ids


def stamp_trace(ids: Sequence[int]) -> None:
    """With tracing on, under a traced API request or trigger: store its traceparent (and its
    tracestate) on the runs it created, so that their traces continue it (tms_core/tracing.py).
    Nothing otherwise."""
    if tracing.ON and ids:
        traceparent, tracestate = tracing.current_trace_context()
        if traceparent:
            Execution.objects.filter(pk__in=list(ids)).update(traceparent=traceparent, tracestate=tracestate)


def executions_create_arrays(
    *,
    task_ids: str,
    scheduled_for: str,
    due_at: str,
    priority: str,
    exclusive: str,
    owner_ids: str,
    team_ids: str,
    versions: str,
    actor: str,
    detail: str = "",
) -> list[int]:
    """:func:`executions_create` for a materialiser pass over many rows, its columns
    given as array literals (:func:`~executions.transitions.sql.pg_array` or the same text built by
    the caller, one element per row; ``due_at`` not NULL), so that no object per row is needed; one
    statement with its events. ``owner_ids``, ``team_ids`` and ``versions`` are the tasks' owners, teams and versions,
    read by the caller with the tasks it holds locked. Returns the new ids."""
    params = [
        "schedule",
        S.SCHEDULED,
        task_ids,
        scheduled_for,
        due_at,
        priority,
        exclusive,
        owner_ids,
        team_ids,
        versions,
    ]
    return [row[0] for row in with_events(_INSERT_OWNED, params, Event("", S.SCHEDULED, actor, detail))]


def _insert(rows: Sequence[NewExecution], origin: str) -> tuple[str, list[Any]]:
    """One chunk's INSERT: its columns as arrays (``unnest``)."""
    return _INSERT, [
        origin,
        S.SCHEDULED,
        pg_array(row.task_id for row in rows),
        pg_array(row.scheduled_for for row in rows),
        pg_array(row.due_at or row.scheduled_for for row in rows),
        pg_array(row.priority for row in rows),
        pg_array(row.exclusive for row in rows),
        pg_array(row.moved_from for row in rows),
    ]
