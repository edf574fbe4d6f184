"""A workflow run's hold: paused or cancelled runs start no further step (issue 48).

The hold is a row of :class:`~executions.models.WorkflowRunControl`, keyed by the workflow run's id
(its root's execution id), written lazily by the first pause or cancel. A step's end reads it in
the transaction that records the end, before it creates the followers
(:func:`~executions.transitions.follow.follow_ended` calls :func:`halted_runs`), and a change of
the hold (:func:`workflow_run_hold_set`) is made in a transaction of its own; both hold the
workflow run's transaction-level advisory lock (the one a fan-in's check takes,
:data:`~executions.transitions.follow.FAN_IN_LOCK_NAMESPACE`) while they read or write it. So
a step that ends while a pause is being set either

* takes the lock first: it reads no pause, creates its followers, commits, and only then does the
  pause take the lock and commit (the followers were created before the pause commits); or
* waits for the pause's commit: its read, a statement that starts after the lock is granted, sees
  the pause, and it creates nothing: the resume does (:mod:`.resume`), once.

Never lost, never twice: the resume creates the steps under the same lock, each insert is
``ON CONFLICT DO NOTHING`` on the unique ``(task, workflow_run)``, and an end that waits behind the
resume sees the run active again and creates what it starts itself.
"""

from __future__ import annotations

from collections.abc import Collection

from django.db import connection

from executions.models import WorkflowRunControl, WorkflowRunHold

#: The fan-in lock's namespace (``follow.FAN_IN_LOCK_NAMESPACE``; a test holds them equal): one
#: lock per workflow run, whoever takes it.
LOCK_NAMESPACE = 0x7A5E
CONTROLS = WorkflowRunControl._meta.db_table


def lock_workflow_runs(workflow_runs: Collection[int]) -> None:
    """Take the advisory locks of ``workflow_runs`` for this transaction, in id order (the order
    every taker uses, so two transactions never deadlock), in one statement."""
    if not workflow_runs:
        return
    ordered = sorted(set(workflow_runs))
    with connection.cursor() as cursor:
        # In the array's order; a lock this transaction holds already is taken again, at no cost.
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, ((%s::bigint[])[i] %% 2147483647)::int) FROM generate_series(1, %s) AS i",
            [LOCK_NAMESPACE, ordered, len(ordered)],
        )


def halted_runs(workflow_runs: Collection[int]) -> set[int]:
    """Of ``workflow_runs``, those paused or cancelled: their ends start nothing. Locks each (see
    the module) and then reads, in a statement of its own so that it sees a hold committed while
    it waited. Call in the transaction that records the ends."""
    if not workflow_runs:
        return set()
    lock_workflow_runs(workflow_runs)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT workflow_run FROM {CONTROLS} WHERE workflow_run = ANY(%s::bigint[]) AND hold <> %s",  # noqa: S608
            [sorted(set(workflow_runs)), WorkflowRunHold.ACTIVE],
        )
        return {int(row[0]) for row in cursor.fetchall()}


def workflow_run_hold_set(
    *, workflow_run: int, hold: str, sources: Collection[str], actor: str, reason: str = ""
) -> bool:
    """Set the hold of ``workflow_run`` to ``hold`` if it is one of ``sources`` now (a run
    without a row is ACTIVE), under the workflow run's lock; returns whether it changed. Call in
    a transaction (a resume creates the held steps in the same one)."""
    lock_workflow_runs([workflow_run])
    values = [hold, actor[:200], reason[:500]]
    with connection.cursor() as cursor:
        # Under the lock, nobody else writes the row meanwhile: an update, else a first row.
        cursor.execute(
            f"UPDATE {CONTROLS} SET hold = %s, changed_by = %s, reason = %s, changed_at = statement_timestamp()"  # noqa: S608
            " WHERE workflow_run = %s AND hold = ANY(%s::text[]) RETURNING workflow_run",
            [*values, workflow_run, list(sources)],
        )
        if cursor.fetchone() is not None:
            return True
        if WorkflowRunHold.ACTIVE not in sources:
            return False
        cursor.execute(
            f"INSERT INTO {CONTROLS} (workflow_run, hold, changed_by, reason, changed_at)"  # noqa: S608
            " VALUES (%s, %s, %s, %s, statement_timestamp())"
            " ON CONFLICT (workflow_run) DO NOTHING RETURNING workflow_run",
            [workflow_run, *values],
        )
        return cursor.fetchone() is not None


def workflow_run_retry_bump(*, workflow_run: int, below: int) -> int | None:
    """Count one more automatic retry of ``workflow_run`` if it has had fewer than ``below`` and
    is neither paused nor cancelled, under its lock; the count now, or None (no retry is due).
    Call in the transaction that creates the retries (a lost retry rolls the count back)."""
    if below < 1:
        return None
    lock_workflow_runs([workflow_run])
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {CONTROLS} AS c (workflow_run, hold, changed_by, reason, changed_at, retries)"  # noqa: S608
            " VALUES (%s, %s, '', '', statement_timestamp(), 1)"
            " ON CONFLICT (workflow_run) DO UPDATE SET retries = c.retries + 1"
            " WHERE c.hold = %s AND c.retries < %s RETURNING retries",
            [workflow_run, WorkflowRunHold.ACTIVE, WorkflowRunHold.ACTIVE, below],
        )
        row = cursor.fetchone()
        return int(row[0]) if row is not None else None
