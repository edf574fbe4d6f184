"""The execution table's one status trigger (executions/triggers.py): what a statement of several
status changes writes (the rollup and the outbox, as one change at a time would), and concurrent
several-row successes that share rollup rows wait for each other instead of deadlocking."""

from __future__ import annotations

import importlib
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.models import F
from django.utils import timezone

from executions import transitions, triggers
from executions.models import Execution, RunRollup, TaskRollup
from executions.models import ExecutionStatus as S
from executions.rollup import rollup_compact
from executions.triggers import NAME
from notifications import services
from notifications import triggers as notify
from notifications.models import Outbox
from tests.factories import ExecutionFactory, TaskFactory, UserFactory


def _rule(task, **wants: bool) -> None:
    channel = services.channel_create(
        owner=task.owner, data={"name": "ops", "kind": "webhook", "target": "http://127.0.0.1:9/"}
    )
    services.rule_create(owner=task.owner, data={"task": task, "channel": channel, **wants})


def _running(task, count: int, worker_id: str) -> list[int]:
    now = timezone.now()
    return [
        ExecutionFactory(
            task=task,
            scheduled_for=now - timedelta(seconds=60 + i),
            status=S.RUNNING,
            lease_owner=worker_id,
            started_at=now,
            due_at=now - timedelta(seconds=0.3),
        ).pk
        for i in range(count)
    ]


def _succeed(ids: list[int], worker_id: str) -> set[int]:
    successes = [transitions.Success(pk, 1, "ok") for pk in ids]
    return transitions.executions_succeed(successes=successes, worker_id=worker_id, max_chars=100)


@pytest.mark.django_db
def test_one_statement_of_several_changes_counts_and_notifies_each_as_one_change_at_a_time_would():
    owner = UserFactory()
    quiet, watched = TaskFactory(owner=owner, runner="noop"), TaskFactory(owner=owner, runner="noop")
    _rule(watched, on_failure=True)  # successes concern it (a recovery)
    ids = _running(quiet, 3, "w:1") + _running(watched, 2, "w:1")
    one = _running(watched, 1, "w:1")

    assert _succeed(ids, "w:1") == set(ids)
    assert transitions.execution_succeed(execution_id=one[0], attempt=1, worker_id="w:1", output="", max_chars=10)

    rollup = RunRollup.objects.filter(team_id=quiet.team_id)
    assert sum(row.succeeded for row in rollup) == 6
    assert sum(row.failed + row.cancelled + row.retried for row in rollup) == 0
    # Each ran 0.3 s late (bucket [0.25, 0.5)) and took under 10 ms... or a little more: counted once.
    assert sum(row.lateness_05 for row in rollup) == 6
    assert sum(sum(getattr(row, f"duration_{i:02d}") for i in range(21)) for row in rollup) == 6
    # One transaction (the test's) wrote them all: one row, in the transaction's shard.
    assert [(row.runner, row.succeeded) for row in rollup] == [("noop", 6)]
    hours = {row.task_id: (row.attempts, row.failures) for row in TaskRollup.objects.filter(team_id=quiet.team_id)}
    assert hours == {quiet.pk: (3, 0), watched.pk: (3, 0)}
    # The watched task's three successes, in execution order; nothing for the task without rules.
    assert [(o.kind, o.execution_id, o.attempt) for o in Outbox.objects.order_by("id")] == [
        ("succeeded", pk, 1) for pk in sorted([*ids[3:], *one])
    ]


@pytest.mark.django_db
def test_statements_that_change_no_status_write_nothing():
    task = TaskFactory(runner="noop")
    _rule(task, on_failure=True, on_retry=True)
    ids = _running(task, 3, "w:1")
    Execution.objects.filter(pk__in=ids).update(lease_owner="w:2")  # a write that keeps the status
    Execution.objects.filter(pk__in=ids).update(status=S.RUNNING)  # set, unchanged
    assert not RunRollup.objects.exists()
    assert not TaskRollup.objects.exists()
    assert not Outbox.objects.exists()


@pytest.mark.django_db
def test_the_execution_table_has_one_status_trigger_at_statement_level():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname, (tgtype & 1) = 0 FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
            [Execution._meta.db_table],
        )
        triggers = dict(cursor.fetchall())
    # Besides it, only the insert trigger that copies the task's version into a new row
    # (executions/task_version.py): row level, as it sets a column of the row inserted.
    assert triggers == {NAME: True, "tms_execution_task_version": False}


@pytest.mark.django_db(transaction=True)
def test_concurrent_several_row_successes_sharing_rollup_rows_do_not_deadlock():
    """Two workers end eight runs each, one task, one minute: their statements share the minute's
    eight rollup rows (one per shard) and the task's hour, their runs in opposite shard orders. A
    third transaction holds the rollup rows until both statements wait for it, so both then race
    over every shared row: a trigger that wrote the rows in the statements' order
    deadlocked here (PostgreSQL ended one statement after deadlock_timeout); in key order the
    second waits for the first."""
    owner = UserFactory()
    task = TaskFactory(owner=owner, runner="noop")
    # Shards (id % 8) rise with the id in the first's runs and fall in the second's (every 7th
    # id, from the shard four on from the first's), whichever order a statement's plan takes its rows in.
    first, second = _running(task, 8, "w:a"), _running(task, 60, "w:b")[4::7]
    minute = timezone.now().replace(second=0, microsecond=0)
    for at in (minute, minute + timedelta(minutes=1)):  # whichever minute the successes land in
        for shard in range(8):
            RunRollup.objects.create(minute=at, team_id=task.team_id, runner="noop", shard=shard)

    results: dict[str, object] = {}

    def succeed(worker_id: str, ids: list[int]) -> None:
        try:
            results[worker_id] = _succeed(ids, worker_id)
        except Exception as exc:  # noqa: BLE001 - the test reports it
            results[worker_id] = exc
        finally:
            connections.close_all()

    holder = connections.create_connection("default")
    try:
        with holder.cursor() as cursor:
            cursor.execute("BEGIN")
            table = RunRollup._meta.db_table
            cursor.execute(f"SELECT id FROM {table} WHERE team_id = %s FOR UPDATE", [task.team_id])  # noqa: S608
            threads = [
                threading.Thread(target=succeed, args=("w:a", first)),
                threading.Thread(target=succeed, args=("w:b", second)),
            ]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                cursor.execute("SELECT pg_stat_clear_snapshot()")  # else a transaction sees one snapshot
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                )
                if cursor.fetchone()[0] >= 2:
                    break
                time.sleep(0.02)
            else:
                pytest.fail(f"the two successes never both waited for the rollup rows: {results}")
            cursor.execute("COMMIT")
    finally:
        holder.close()
    for thread in threads:
        thread.join(30)
    assert results == {"w:a": set(first), "w:b": set(second)}
    assert sum(row.succeeded for row in RunRollup.objects.filter(team_id=task.team_id)) == 16
    assert sum(TaskRollup.objects.filter(task=task).values_list("attempts", flat=True)) == 16


@pytest.mark.django_db(transaction=True)
def test_a_transaction_that_ends_runs_holds_one_rollup_row_and_others_do_not_wait_for_it():
    """A worker's end of a chunk of workflow steps is a transaction of several statements (the
    ends, then the steps that follow them, then the commit). With a shard per run, its ends took
    every shard row of the minute (sixteen runs' ids cover the eight) and held them to its
    commit, so each other worker's end, whatever its run, waited for it: in the workflows
    benchmark the pool processes' ends took turns (pg_stat_activity: waits on a transaction id,
    inside the trigger). The shard is now the transaction's: its ends write one row, and an end
    in a transaction of another shard goes through at once, even of the same task (its hour's
    row is sharded too: a map step's items are runs of one task, and they took turns on it)."""
    task = TaskFactory(runner="noop")
    held, other = _running(task, 16, "w:a"), _running(task, 17, "w:b")[16:]
    table, execution = RunRollup._meta.db_table, Execution._meta.db_table
    holder = connections.create_connection("default")
    try:
        with holder.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                f"UPDATE {execution} SET status = %s, finished_at = now() WHERE id = ANY(%s)",  # noqa: S608
                [S.SUCCEEDED, held],
            )
            cursor.execute("SELECT txid_current() %% %s", [triggers.ROLLUP_SHARDS])
            (shard,) = cursor.fetchone()
            cursor.execute(f"SELECT shard, succeeded FROM {table} WHERE team_id = %s", [task.team_id])  # noqa: S608
            assert cursor.fetchall() == [(shard, 16)]
            # The other worker's end, in a transaction of another shard (one in eight has the
            # holder's: then a later one is taken); it would wait up to lock_timeout for the holder.
            for _ in range(3 * triggers.ROLLUP_SHARDS):
                with transaction.atomic(), connection.cursor() as mine:
                    mine.execute("SET LOCAL lock_timeout = '3s'")
                    mine.execute("SELECT txid_current() %% %s", [triggers.ROLLUP_SHARDS])
                    if mine.fetchone()[0] == shard:
                        continue
                    assert _succeed(other, "w:b") == set(other)
                    break
            else:
                pytest.fail("no transaction of another shard than the holder's")
            cursor.execute("COMMIT")
    finally:
        holder.close()
    assert sum(row.succeeded for row in RunRollup.objects.filter(team_id=task.team_id)) == 17
    assert RunRollup.objects.filter(team_id=task.team_id).count() == 2
    hours = TaskRollup.objects.filter(task=task)
    assert sorted(hours.values_list("attempts", flat=True)) == [1, 16]
    # Once the hour is past, its shards are folded into one row (and counted once).
    TaskRollup.objects.filter(task=task).update(hour=F("hour") - timedelta(hours=2))
    sharded = hours.filter(shard__gt=0).count()  # shard 0 is where the fold adds up (one of them may be it)
    assert sharded >= 1 and rollup_compact() >= sharded
    assert list(hours.values_list("shard", "attempts")) == [(0, 17)]


def test_executions_own_migrations_install_the_parts_notifications_installs():
    """A migration of executions that changes its rollup part (0029) installs the trigger with the
    parts the apps above registered when Django started, without importing them: the same parts,
    in the same order, as notifications' migrations install; going back, the same with the
    rollup by owner."""
    forms = importlib.import_module("executions.migrations.0029_rollup_team")
    assert triggers.status_parts() == notify.STATUS_PARTS
    assert triggers.status_parts(forms.ROLLUP_BY_OWNER) == (forms.ROLLUP_BY_OWNER, notify.OUTBOX_PART)
    # notifications' migrations all run before executions 0029: they install the rollup by owner.
    before = importlib.import_module("notifications.migrations.0007_one_status_trigger")
    by_owner = importlib.import_module("notifications.migrations.0012_channel_rule_team_not_null")
    assert by_owner.STATUS_PARTS_BY_OWNER[0] is before.MIGRATIONS_STATUS_PARTS[0] is forms.ROLLUP_BY_OWNER
    assert "owner_id" not in " ".join(triggers.ROLLUP.statements())
    assert "r.team_id" in triggers.install(triggers.status_parts())
