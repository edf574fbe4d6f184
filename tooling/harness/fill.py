"""Set-based inserts of many tasks, for the benchmark's idle rows and the materialiser scale check.

One statement per call, so that a column added to :class:`~tasks_app.models.Task` is given its
filler value here once rather than in every raw INSERT.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import connection
from django.db.backends.utils import CursorWrapper

from tasks_app.models import Task, Team

#: The SQL value of each column of a filler task unless the caller gives its own (an expression
#: over ``g``, the row's number from 1 to the count).
_DEFAULTS: Mapping[str, str] = {
    "id": "gen_random_uuid()",
    "name": "'filler ' || g",
    "status": "'ACTIVE'",
    "runner": "'noop'",
    "config": "'{}'",
    "interval": "NULL",
    "cron": "''",
    "timezone": "'UTC'",
    "jitter": "interval '0'",
    "misfire_policy": "'run_once'",
    "misfire_grace": "interval '60 seconds'",
    "catch_up_limit": "100",
    "overlap_policy": "'allow'",
    "max_attempts": "3",
    "retry_backoff": "interval '5 seconds'",
    "retry_backoff_max": "interval '10 minutes'",
    "retry_jitter": "true",
    "expose_metrics": "false",
    "keep_failed_longer": "false",
    "secret_fields": "'[]'",
    "input_fills": "'{}'",
    "on_events": "'[]'",
    "timeout": "interval '20 minutes'",
    "priority": "5",
    "tracing_id": "''",
    "runs_materialised": "0",
    "created_at": "now()",
    "updated_at": "now()",
}


#: The owner's personal team (tasks_app.teams): the tasks' team.
_PERSONAL_TEAM = f"SELECT id FROM {Team._meta.db_table} WHERE personal_of_id = %(owner)s"  # noqa: S608 - names are ours


def insert_tasks(
    *,
    owner_id: int,
    count: int,
    columns: Mapping[str, str],
    params: Mapping[str, Any] | None = None,
    lateral: str = "",
    cursor: CursorWrapper | None = None,
) -> None:
    """Insert ``count`` tasks of ``owner_id`` in one ``INSERT … SELECT … generate_series``.

    ``columns`` gives SQL expressions for the columns that differ from :data:`_DEFAULTS`
    (``start_at`` and ``next_run_at`` have none); ``params`` fills their ``%(name)s``
    placeholders (a literal ``%`` is ``%%``); ``lateral`` joins more per-row expressions. On
    ``cursor`` when given (a caller that goes on with it), else on a cursor of its own.
    """
    values = {**_DEFAULTS, **columns}
    sql = (
        f"INSERT INTO {Task._meta.db_table} (owner_id, team_id, {', '.join(values)}) "  # noqa: S608 - names are ours
        f"SELECT %(owner)s, ({_PERSONAL_TEAM}), {', '.join(values.values())}"
        f" FROM generate_series(1, %(count)s) AS g{lateral}"
    )
    arguments = {**(params or {}), "owner": owner_id, "count": count}
    if cursor is not None:
        cursor.execute(sql, arguments)
        return
    with connection.cursor() as own:
        own.execute(sql, arguments)
