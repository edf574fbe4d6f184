"""A big history of one owner, inserted set-based, for the API list benchmark (``tms_bench --scenario lists``).

``executions`` executions of ``tasks`` recurring tasks, all of one owner, the way the platform
leaves them: 99 % finished (90 % succeeded, 7 % failed, 3 % cancelled; a tenth of the failures on a
second attempt; nine in ten from the schedule, the rest triggered, retried or backfilled), one
execution every quarter of a second per owner going back in time (10,000,000 span about 29 days),
lateness 0.05-20 s and duration 0.01-600 s, with a short output or error; the last 1 % running,
pending or waiting (some due in the past, most upcoming). Each execution has the events its
transitions would have written (SCHEDULED to PENDING to RUNNING to the end: three for a finished
run). Each task also has a year of monthly archive index entries.

Everything is ``INSERT … SELECT generate_series`` in chunks of a million executions, one
transaction each, with the foreign-key triggers off for the chunk (the ids come from the tasks
just inserted; it needs a superuser, as the bench's own database gives). Into an empty
executions table (a fresh bench database) the secondary indexes of executions and events are
dropped first and built again from the models' definitions at the end, sorted in one pass:
keeping eight B-trees up row by row made 10,000,000 rows take hours on a shared 2-core machine.
Into a table that already holds executions, rows go in with every index in place. A fill killed
before its end leaves the indexes of an empty table dropped: ``manage.py migrate`` does not bring
them back, so use a fresh database for the benchmark (the bench's own, as always).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import Index, UniqueConstraint

from executions.models import Execution, ExecutionEvent
from tooling.harness.fill import insert_tasks

CHUNK = 1_000_000
#: Seconds of history per execution of the owner (10,000,000 executions span about 29 days).
SPACING = 0.25
#: The live 1 % of a history, one row a ``k`` of ``generate_series(0, %(live)s - 1)``: a fifth running,
#: a fifth pending, a fifth overdue (due in the last minutes), the rest upcoming. Its columns:
#: scheduled_for, status, attempt, due_at, priority, lease_owner, lease_expires_at, external_run_id,
#: run_handle, message_id, output, error (the bench's history and this one's both insert it).
LIVE_ROWS = """now() + (k - %(live)s * 0.6) * interval '100 milliseconds',
                CASE WHEN 5 * k < %(live)s THEN 'RUNNING' WHEN 5 * k < 2 * %(live)s THEN 'PENDING'
                     ELSE 'SCHEDULED' END,
                1, now() + (k - %(live)s * 0.6) * interval '100 milliseconds', 5,
                CASE WHEN 5 * k < %(live)s THEN 'bench:1:1' ELSE '' END,
                CASE WHEN 5 * k < %(live)s THEN now() + interval '1 minute' END, '', '{}', '', '', '',"""


@dataclass
class HistoryFill:
    tasks: int
    executions: int
    events: int
    archive_entries: int
    seconds: float
    #: Seconds spent building the indexes at the end (0 when they were kept up row by row).
    index_seconds: float = 0.0
    #: Size in bytes of each index of executions and events after the fill.
    index_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def rows_per_second(self) -> float:
        rows = self.tasks + self.executions + self.events + self.archive_entries
        return rows / self.seconds if self.seconds else 0.0


def _superuser(cursor: Any) -> bool:
    cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    return bool(cursor.fetchone()[0])


@contextlib.contextmanager
def _indexes_built_after(progress: Callable[[str], None], timing: dict[str, float]) -> Iterator[None]:
    """Drop the secondary indexes of empty executions and events tables, build them again after."""
    if Execution.objects.exists() or ExecutionEvent.objects.exists():
        yield
        return
    parts: list[tuple[type, list[Index], list[UniqueConstraint]]] = [
        (Execution, list(Execution._meta.indexes), [c for c in Execution._meta.constraints
                                                    if isinstance(c, UniqueConstraint)]),
        (ExecutionEvent, list(ExecutionEvent._meta.indexes), []),
    ]  # fmt: skip
    with connection.schema_editor() as editor:
        for model, indexes, uniques in parts:
            for index in indexes:
                editor.remove_index(model, index)
            for constraint in uniques:
                editor.remove_constraint(model, constraint)
    try:
        yield
    finally:
        progress("history: building the indexes")
        started = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute("SET maintenance_work_mem = '512MB'")
        with connection.schema_editor(atomic=False) as editor:
            for model, indexes, uniques in parts:
                for index in indexes:
                    editor.add_index(model, index)
                for constraint in uniques:
                    editor.add_constraint(model, constraint)
        with connection.cursor() as cursor:
            cursor.execute("RESET maintenance_work_mem")
        timing["index_seconds"] = time.monotonic() - started


def index_sizes() -> dict[str, int]:
    """Bytes of every index of executions and events (the pkeys included)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes
               WHERE relname IN ('executions_execution', 'executions_executionevent') ORDER BY 2 DESC"""
        )
        return dict(cursor.fetchall())


def fill_history(
    *, owner_id: int, executions: int, tasks: int, progress: Callable[[str], None] = lambda line: None
) -> HistoryFill:
    """Insert the history described in the module docstring; ``executions`` >= ``tasks`` >= 1."""
    started = time.monotonic()
    live = max(1, executions // 100)
    finished = executions - live
    with connection.cursor() as cursor:
        insert_tasks(
            cursor=cursor,
            owner_id=owner_id,
            count=tasks,
            columns={
                "name": "'history ' || g",
                "runner": "(ARRAY['noop', 'sleep', 'http', 'shell'])[1 + g %% 4]",
                "start_at": "now() - interval '400 days'",
                "interval": "(ARRAY[interval '1 minute', interval '5 minutes', interval '1 hour'])[1 + g %% 3]",
                "next_run_at": "now() + (g %% 3600) * interval '1 second'",
                "created_at": "now() - interval '400 days'",
            },
        )
        cursor.execute("ANALYZE tasks_app_task")
        superuser = _superuser(cursor)
    timing: dict[str, float] = {}
    with _indexes_built_after(progress, timing):
        events, archived = _insert(owner_id, tasks, finished, live, superuser, started, progress)
    progress("history: analysing the tables")
    with connection.cursor() as cursor:
        for table in ("executions_execution", "executions_executionevent", "executions_archiveindex"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    seconds = time.monotonic() - started
    return HistoryFill(
        tasks, executions, events, archived, seconds, round(timing.get("index_seconds", 0.0), 1), index_sizes()
    )


def _insert(
    owner_id: int, tasks: int, finished: int, live: int, superuser: bool, started: float,
    progress: Callable[[str], None],
) -> tuple[int, int]:  # fmt: skip
    """The executions, their events and the archive entries: (events, archive entries)."""
    events = 0
    # k = 0 is the newest finished execution; k grows back in time. Execution k is task k mod tasks's.
    for low in range(0, finished, CHUNK):
        high = min(finished, low + CHUNK)
        with transaction.atomic(), connection.cursor() as cursor:
            if superuser:
                # Skips the deferred foreign-key check of every row at commit: the task ids are ours.
                cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute("SET LOCAL jit = off")
            events += _insert_finished(cursor, owner_id, tasks, low, high)
        elapsed = time.monotonic() - started
        progress(f"history: {high:,} finished executions in {elapsed:.0f}s ({high / elapsed:,.0f}/s, with events)")
    with transaction.atomic(), connection.cursor() as cursor:
        if superuser:
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute("SET LOCAL jit = off")
        events += _insert_live(cursor, owner_id, tasks, live)
        archived = _insert_archive_entries(cursor, owner_id)
    return events, archived


def _insert_finished(cursor: Any, owner_id: int, tasks: int, low: int, high: int) -> int:
    """Finished executions ``low`` to ``high - 1`` with three events each: the events inserted."""
    cursor.execute(
        """
        WITH t AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM tasks_app_task
                   WHERE owner_id = %(owner)s),
        k AS (SELECT k, now() - (k * %(spacing)s) * interval '1 second' AS ended,
                     0.05 * power(400.0::float8, (k %% 97) / 96.0::float8) AS late,
                     0.01 * power(60000.0::float8, (k %% 89) / 88.0::float8) AS took,
                     k %% 100 AS pct FROM generate_series(%(low)s, %(high)s - 1) AS k),
        ins AS (
            INSERT INTO executions_execution (task_id, scheduled_for, status, attempt, due_at, priority,
                lease_owner, external_run_id, run_handle, message_id, output, error, origin,
                created_at, enqueued_at, started_at, finished_at, owner_id, team_id)
            SELECT t.id, k.ended - (k.took + k.late) * interval '1 second',
                CASE WHEN k.pct < 90 THEN 'SUCCEEDED' WHEN k.pct < 97 THEN 'FAILED' ELSE 'CANCELLED' END,
                CASE WHEN k.pct = 96 THEN 2 ELSE 1 END,
                k.ended - (k.took + k.late) * interval '1 second', 5, '',
                CASE WHEN k.k %% 4 = 2 THEN 'run-' || k.k ELSE '' END, '{}', md5(k.k::text),
                CASE WHEN k.pct < 90 THEN 'done: ' || (k.k %% 1000) || ' items' ELSE '' END,
                CASE WHEN k.pct >= 90 AND k.pct < 97
                     THEN 'exit status 1: connection refused by upstream ' || (k.k %% 50) ELSE '' END,
                CASE WHEN k.pct %% 10 < 9 THEN 'schedule'
                     ELSE (ARRAY['trigger', 'retry', 'backfill'])[1 + k.k %% 3] END,
                k.ended - (k.took + k.late + 60) * interval '1 second',
                k.ended - k.took * interval '1 second', k.ended - k.took * interval '1 second', k.ended,
                %(owner)s, (SELECT id FROM tasks_app_team WHERE personal_of_id = %(owner)s)
            FROM k JOIN t ON t.n = k.k %% %(tasks)s
            RETURNING id, status, attempt, enqueued_at, started_at, finished_at
        )
        INSERT INTO executions_executionevent (execution_id, from_status, to_status, attempt, at, actor, detail)
        SELECT ins.id, s.from_status, COALESCE(s.to_status, ins.status), ins.attempt,
            CASE s.n WHEN 1 THEN ins.enqueued_at WHEN 2 THEN ins.started_at ELSE ins.finished_at END,
            CASE s.n WHEN 1 THEN 'monitor' ELSE 'worker-1:' || (ins.id %% 4096) END,
            CASE WHEN s.n = 3 AND ins.status = 'FAILED' THEN 'exit status 1' ELSE '' END
        FROM ins, (VALUES (1, 'SCHEDULED', 'PENDING'), (2, 'PENDING', 'RUNNING'), (3, 'RUNNING', NULL))
            AS s (n, from_status, to_status)
        """,
        {"owner": owner_id, "tasks": tasks, "low": low, "high": high, "spacing": SPACING},
    )
    return cursor.rowcount


def _insert_live(cursor: Any, owner_id: int, tasks: int, live: int) -> int:
    """The live executions with the events that brought them where they are: the events inserted."""
    # The live 1 %: a fifth running, a fifth pending, a fifth overdue (due in the last minutes), the rest upcoming.
    cursor.execute(
        f"""
        WITH t AS (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM tasks_app_task
                       WHERE owner_id = %(owner)s),
        ins AS (
            INSERT INTO executions_execution (task_id, scheduled_for, status, attempt, due_at, priority,
                lease_owner, lease_expires_at, external_run_id, run_handle, message_id, output, error,
                origin, enqueued_at, started_at, owner_id, team_id)
            SELECT t.id, {LIVE_ROWS}
                'schedule', CASE WHEN 5 * k < 2 * %(live)s THEN now() END,
                CASE WHEN 5 * k < %(live)s THEN now() END, %(owner)s,
                (SELECT id FROM tasks_app_team WHERE personal_of_id = %(owner)s)
            FROM generate_series(0, %(live)s - 1) AS k JOIN t ON t.n = (k * 7919) %% %(tasks)s
            RETURNING id, status, enqueued_at, started_at
        )
        INSERT INTO executions_executionevent (execution_id, from_status, to_status, attempt, at, actor, detail)
        SELECT ins.id, s.from_status, s.to_status, 1, COALESCE(ins.started_at, ins.enqueued_at), 'monitor', ''
        FROM ins JOIN (VALUES ('PENDING', 'SCHEDULED', 'PENDING'), ('RUNNING', 'SCHEDULED', 'PENDING'),
                           ('RUNNING', 'PENDING', 'RUNNING')) AS s (status, from_status, to_status)
            ON s.status = ins.status
        """,  # noqa: S608 - LIVE_ROWS is a constant of this harness
        {"owner": owner_id, "tasks": tasks, "live": live},
    )
    return cursor.rowcount


def _insert_archive_entries(cursor: Any, owner_id: int) -> int:
    """A year of monthly archive entries per task (what retention would have indexed): the entries inserted."""
    cursor.execute(
        """
        INSERT INTO executions_archiveindex (task_id, owner_id, file_name, period_from, period_to, executions,
            events, skipped, file_sha256, ids_sha256, created_at)
        SELECT t.id, %(owner)s, 'archive/' || to_char(p.month, 'YYYY-MM') || '/' || t.id || '.jsonl.gz',
            p.month, p.month + interval '1 month' - interval '1 second', 500, 1500, 0,
            md5(t.id::text || p.month), md5(p.month || t.id::text), p.month + interval '1 month'
        FROM tasks_app_task t,
            LATERAL (SELECT date_trunc('month', now()) - m * interval '1 month' AS month
                     FROM generate_series(2, 13) AS m) AS p
        WHERE t.owner_id = %(owner)s
        """,
        {"owner": owner_id},
    )
    return cursor.rowcount
