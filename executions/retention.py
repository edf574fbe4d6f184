"""Retention: pruning finished executions per their task's rules, archiving them first.

A task keeps its finished runs by two rules, its own or the ``TMS_RETENTION_*`` defaults:
``keep_last`` (the most recent N finished runs) and ``keep_for`` (runs that ended within that
age). A run goes when either rule lets it go (whichever keeps fewer), except a FAILED run of a
task with ``keep_failed_longer``, which goes only when both do (whichever keeps more). Never
pruned: an execution that is not final (SCHEDULED, PENDING, RUNNING), and the latest finished
run of each task, whatever the rules say.

Each batch (``TMS_RETENTION_BATCH`` executions, 1,000 by default) is one short transaction:

1. lock the batch's rows ``FOR UPDATE SKIP LOCKED`` (terminal rows are written by nobody but a
   user's retry, which this skips rather than waits for);
2. write them, each with its events and the skipped-occurrence rows tied to it, as gzipped JSON
   Lines to the ``tms_archive`` storage (Django's storage API: a directory, or S3);
3. delete them and insert their :class:`~executions.models.ArchiveIndex` rows, then commit.

So the rows are never gone without their file. A crash after the file is written and before the
commit leaves a file no index row names: the next run deletes such files before it starts (and
a batch retried with the same rows writes the same name again, replacing it).

The dashboard's rollup is not touched: its trigger counts status changes, not deletes, so the
counts of runs that were pruned stay as they were.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg2
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.db import connection, transaction

from executions.models import (
    Approval,
    ArchiveIndex,
    Execution,
    ExecutionEvent,
    ExecutionStatus,
    ReceivedEvent,
    SkippedOccurrence,
    WorkflowMap,
    WorkflowRunControl,
    WorkflowSkip,
)
from tasks_app.models import Task
from tms_core.clock import db_now
from tms_core.conf import tms_settings

#: The storage alias archive files go to (settings.STORAGES).
ARCHIVE_STORAGE = "tms_archive"
#: The folder of the archive files inside that storage (one subfolder per UTC day).
ARCHIVE_FOLDER = "executions"
#: Tasks whose candidates are ranked in one query.
TASK_CHUNK = 500
#: Advisory lock a pruning run holds (:func:`_pruning_lock`), so two runs never race over one batch.
ADVISORY_KEY = 0x746D735F7072756E  # "tms_prun"
FINAL_STATUSES = (ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED)


@dataclass
class PruneReport:
    """What a pruning run removed (or, in a dry run, would remove)."""

    dry_run: bool
    #: Executions per task id.
    per_task: dict[uuid.UUID, int] = field(default_factory=dict)
    executions: int = 0
    events: int = 0
    skipped: int = 0
    files: int = 0
    orphans_removed: int = 0
    #: Named events received longer ago than ``TMS_RETENTION_KEEP_FOR`` (with the runs they record).
    received_events: int = 0
    seconds: float = 0.0
    #: Another pruning run held the lock: this one did nothing.
    busy: bool = False
    #: Stopped at ``max_seconds`` with candidates left (the next run goes on).
    stopped_early: bool = False


def archive_storage() -> Storage:
    return storages[ARCHIVE_STORAGE]


def _candidates_sql() -> str:
    execution, task = Execution._meta.db_table, Task._meta.db_table
    final = ", ".join(f"'{s}'" for s in FINAL_STATUSES)
    keep_last = "COALESCE(t.keep_last, %(keep_last)s)"
    too_old = "r.ended < %(now)s - COALESCE(t.keep_for, %(keep_for)s)"
    return f"""
        SELECT r.id, r.task_id FROM (
            SELECT e.id, e.task_id, e.status, COALESCE(e.finished_at, e.scheduled_for) AS ended,
                   row_number() OVER (PARTITION BY e.task_id ORDER BY e.scheduled_for DESC, e.id DESC) AS rank
            FROM {execution} e
            WHERE e.task_id = ANY(%(tasks)s::uuid[]) AND e.status IN ({final})
        ) r JOIN {task} t ON t.id = r.task_id
        WHERE r.rank > 1
          AND (%(before)s::timestamptz IS NULL OR r.ended < %(before)s::timestamptz)
          AND CASE WHEN r.status = 'FAILED' AND t.keep_failed_longer
                   THEN r.rank > {keep_last} AND {too_old}
                   ELSE r.rank > {keep_last} OR {too_old} END
        ORDER BY r.task_id, r.id
    """  # noqa: S608 - names and statuses are ours


def _task_chunks(task_id: uuid.UUID | None) -> Iterator[list[uuid.UUID]]:
    """Every task (deleted ones too: their history is pruned like any other), by id, in chunks."""
    if task_id is not None:
        yield [task_id]
        return
    last: uuid.UUID | None = None
    while True:
        tasks = Task.objects.order_by("id")
        if last is not None:
            tasks = tasks.filter(id__gt=last)
        chunk = list(tasks.values_list("id", flat=True)[:TASK_CHUNK])
        if not chunk:
            return
        yield chunk
        last = chunk[-1]


def prune_candidates(
    *, now: datetime, before: datetime | None = None, task_id: uuid.UUID | None = None
) -> Iterator[list[tuple[int, uuid.UUID]]]:
    """The executions the rules let go, as ``(id, task id)`` lists, a chunk of tasks at a time.

    Reads only (no lock): each chunk is ranked per task through execution_occurrence (task, scheduled_for, ...).
    """
    conf = tms_settings()
    params: dict[str, Any] = {
        "now": now,
        "before": before,
        "keep_last": conf.RETENTION_KEEP_LAST,
        "keep_for": timedelta(seconds=conf.RETENTION_KEEP_FOR),
    }
    sql = _candidates_sql()
    for chunk in _task_chunks(task_id):
        with connection.cursor() as cursor:
            cursor.execute(sql, {**params, "tasks": [str(t) for t in chunk]})
            rows = [(int(r[0]), r[1] if isinstance(r[1], uuid.UUID) else uuid.UUID(str(r[1]))) for r in cursor]
        if rows:
            yield rows


def _ids_sha256(ids: list[int]) -> str:
    return hashlib.sha256("".join(f"{i}\n" for i in sorted(ids)).encode()).hexdigest()


def _rows(sql: str, params: list[Any]) -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        names = [c.name for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


#: Decisions on approval steps (archived with their runs, as their events are).
APPROVALS = Approval._meta.db_table


def _by_execution(table: str, locked: list[int]) -> dict[int, list[dict[str, Any]]]:
    """The rows of ``table`` (an ``execution_id`` column) of the executions ``locked``, by execution, in id order."""
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in _rows(f"SELECT * FROM {table} WHERE execution_id = ANY(%s) ORDER BY id", [locked]):  # noqa: S608
        grouped[row["execution_id"]].append(row)
    return grouped


def _delete_workflow_records(cursor: Any, locked: list[int]) -> None:
    """What records the workflow runs rooted in ``locked`` and the decisions on them (no foreign
    keys: tables written beside the execution rows): the steps they skipped, their map steps,
    their holds; and the approvals of the runs. Nothing shows a pruned workflow run any more."""
    for table in (WorkflowSkip, WorkflowMap, WorkflowRunControl):
        cursor.execute(f"DELETE FROM {table._meta.db_table} WHERE workflow_run = ANY(%s)", [locked])  # noqa: S608
    cursor.execute(f"DELETE FROM {APPROVALS} WHERE execution_id = ANY(%s)", [locked])  # noqa: S608


def _archive_batch(ids: list[int], owners: dict[uuid.UUID, int], report: PruneReport) -> None:
    """Archive and delete one batch in one transaction (see the module's docstring)."""
    execution, event = Execution._meta.db_table, ExecutionEvent._meta.db_table
    skipped_table = SkippedOccurrence._meta.db_table
    storage = archive_storage()
    with transaction.atomic(), connection.cursor() as cursor:
        # Never wait long on anything: pruning can always come back later.
        cursor.execute("SET LOCAL lock_timeout = '2s'")
        cursor.execute("SET LOCAL statement_timeout = '60s'")
        final = [str(s) for s in FINAL_STATUSES]
        executions = _rows(
            f"SELECT * FROM {execution} WHERE id = ANY(%s) AND status = ANY(%s) "  # noqa: S608
            "ORDER BY id FOR UPDATE SKIP LOCKED",
            [ids, final],
        )
        if not executions:
            return
        locked = [row["id"] for row in executions]
        events, skipped, approvals = (_by_execution(table, locked) for table in (event, skipped_table, APPROVALS))

        lines = []
        by_task: dict[uuid.UUID, list[dict[str, Any]]] = defaultdict(list)
        for row in executions:
            record = {
                **row,
                "events": events.get(row["id"], []),
                "skipped_occurrences": skipped.get(row["id"], []),
                "approvals": approvals.get(row["id"], []),
            }
            lines.append(json.dumps(record, default=_json_default, sort_keys=True))
            by_task[row["task_id"]].append(row)
        # mtime=0: the same rows make the same bytes, so a retried batch's file is identical.
        payload = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
        day = db_now().strftime("%Y-%m-%d")
        name = f"{ARCHIVE_FOLDER}/{day}/{locked[0]}-{locked[-1]}-{_ids_sha256(locked)[:16]}.jsonl.gz"
        if storage.exists(name):  # a batch written before a crash, not indexed: replace it
            storage.delete(name)
        saved = storage.save(name, ContentFile(payload))
        if saved != name:  # pragma: no cover - only if another process raced us to the name
            raise RuntimeError(f"archive file {name} was stored as {saved}")
        file_sha = hashlib.sha256(payload).hexdigest()

        # Retries and replays of pruned runs that stay lose their link, as on_delete=SET_NULL says.
        for link in ("retry_of_id", "replay_of_id"):
            cursor.execute(
                f"UPDATE {execution} SET {link} = NULL WHERE {link} = ANY(%s) AND NOT (id = ANY(%s))",  # noqa: S608
                [locked, locked],
            )
        cursor.execute(f"DELETE FROM {skipped_table} WHERE execution_id = ANY(%s)", [locked])  # noqa: S608
        skipped_count = cursor.rowcount
        _delete_workflow_records(cursor, locked)
        cursor.execute(f"DELETE FROM {event} WHERE execution_id = ANY(%s)", [locked])  # noqa: S608
        event_count = cursor.rowcount
        cursor.execute(f"DELETE FROM {execution} WHERE id = ANY(%s)", [locked])  # noqa: S608
        ArchiveIndex.objects.bulk_create(
            ArchiveIndex(
                task_id=task_id,
                owner_id=owners[task_id],
                file_name=name,
                period_from=min(r["scheduled_for"] for r in rows),
                period_to=max(r["scheduled_for"] for r in rows),
                executions=len(rows),
                events=sum(len(events.get(r["id"], [])) for r in rows),
                skipped=sum(len(skipped.get(r["id"], [])) for r in rows),
                file_sha256=file_sha,
                ids_sha256=_ids_sha256([r["id"] for r in rows]),
            )
            for task_id, rows in by_task.items()
        )
    # Counted once committed.
    report.executions += len(locked)
    report.events += event_count
    report.skipped += skipped_count
    report.files += 1
    for task_id, rows in by_task.items():
        report.per_task[task_id] = report.per_task.get(task_id, 0) + len(rows)


def archive_remove_orphans() -> int:
    """Delete archive files that no index row names: written by a batch that did not commit.

    Only called while holding the pruning lock, so no batch is between its write and its commit.
    """
    storage = archive_storage()
    removed = 0
    try:
        days, _ = storage.listdir(ARCHIVE_FOLDER)
    except FileNotFoundError:
        return 0
    for day in days:
        folder = f"{ARCHIVE_FOLDER}/{day}"
        _, files = storage.listdir(folder)
        names = {f"{folder}/{f}" for f in files}
        known = set(ArchiveIndex.objects.filter(file_name__in=names).values_list("file_name", flat=True))
        for name in sorted(names - known):
            storage.delete(name)
            removed += 1
    return removed


@contextlib.contextmanager
def _pruning_lock() -> Iterator[bool]:
    """Try to take the pruning lock for the whole run; yield whether it was taken.

    The lock spans many transactions (each batch commits), yet it is a transaction-level lock,
    held by a transaction of a connection of its own that stays open until the run ends: behind
    PgBouncer in transaction pooling mode a session-level lock would be taken on one server
    connection and released (or not) on another, and stay behind on the first for whoever gets
    it next. An open transaction keeps its server connection, and its end (commit, rollback,
    the client gone) always releases the lock. It is idle in a READ COMMITTED transaction with
    no statement running, so it holds no snapshot back from VACUUM.
    """
    holder = psycopg2.connect(**connection.get_connection_params())
    try:
        with holder.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_KEY])
            taken = bool(cursor.fetchone()[0])
        yield taken
    finally:
        with contextlib.suppress(psycopg2.Error):
            holder.rollback()
        holder.close()


def retention_prune(
    *,
    before: datetime | None = None,
    task_id: uuid.UUID | None = None,
    batch: int | None = None,
    dry_run: bool = False,
    max_seconds: float | None = None,
    now: datetime | None = None,
    progress: Callable[[PruneReport], None] | None = None,
) -> PruneReport:
    """Prune (archive, then delete) the finished executions the retention rules let go.

    ``before`` narrows the run to executions that ended before it; ``task_id`` to one task;
    ``batch`` overrides ``TMS_RETENTION_BATCH``; ``dry_run`` only counts what would go.
    ``max_seconds`` stops between batches once that long has passed (beat's runs stay short;
    the next run goes on where this one stopped).
    """
    size = batch or tms_settings().RETENTION_BATCH
    now = now or db_now()
    report = PruneReport(dry_run=dry_run)
    started = time.monotonic()
    if dry_run:
        try:
            return _prune(report, size=size, now=now, before=before, task_id=task_id, dry_run=True)
        finally:
            report.seconds = time.monotonic() - started
    with _pruning_lock() as taken:
        if not taken:
            report.busy = True
            return report
        try:
            report.orphans_removed = archive_remove_orphans()
            report.received_events = received_events_prune(now=now, size=size)
            return _prune(
                report,
                size=size,
                now=now,
                before=before,
                task_id=task_id,
                max_seconds=max_seconds,
                started=started,
                progress=progress,
            )
        finally:
            report.seconds = time.monotonic() - started


def received_events_prune(*, now: datetime, size: int) -> int:
    """Delete the named events received longer than ``TMS_RETENTION_KEEP_FOR`` before ``now``
    (and the records of the runs they started), ``size`` at a time; returns how many went. A
    wait-for-event step only matches events received since it started, and a debounce only joins
    a run still waiting, so an event that old serves neither."""
    cutoff = now - timedelta(seconds=tms_settings().RETENTION_KEEP_FOR)
    removed = 0
    while True:
        ids = list(ReceivedEvent.objects.filter(received_at__lt=cutoff).values_list("id", flat=True)[:size])
        if not ids:
            return removed
        ReceivedEvent.objects.filter(id__in=ids).delete()
        removed += len(ids)


def _prune(
    report: PruneReport,
    *,
    size: int,
    now: datetime,
    before: datetime | None,
    task_id: uuid.UUID | None,
    dry_run: bool = False,
    max_seconds: float | None = None,
    started: float = 0.0,
    progress: Callable[[PruneReport], None] | None = None,
) -> PruneReport:
    """:func:`retention_prune`'s batches, under its lock unless ``dry_run``."""
    pending: list[tuple[int, uuid.UUID]] = []
    owners: dict[uuid.UUID, int] = {}
    for rows in prune_candidates(now=now, before=before, task_id=task_id):
        if dry_run:
            for _, task in rows:
                report.per_task[task] = report.per_task.get(task, 0) + 1
            report.executions += len(rows)
            continue
        tasks = {task for _, task in rows} - owners.keys()
        owners.update(Task.objects.filter(id__in=tasks).values_list("id", "owner_id"))
        pending += rows
        while len(pending) >= size:
            _archive_batch([i for i, _ in pending[:size]], owners, report)
            pending = pending[size:]
            if progress is not None:
                progress(report)
            if max_seconds is not None and time.monotonic() - started > max_seconds:
                report.stopped_early = True
                return report
    if pending:
        _archive_batch([i for i, _ in pending], owners, report)
    return report


def archive_read(entry: ArchiveIndex) -> Iterator[bytes]:
    """The JSON Lines of ``entry``'s task from its archive file, one execution per line.

    The file may hold other tasks' executions (one pruning batch); only this task's lines come
    out, so an owner never sees another's rows.
    """
    storage = archive_storage()
    with storage.open(entry.file_name, "rb") as raw, gzip.open(raw, "rb") as lines:
        wanted = str(entry.task_id)
        for line in lines:
            if json.loads(line)["task_id"] == wanted:
                yield line
