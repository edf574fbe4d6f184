"""Migration executions 0029: the dashboard's rollups of an install from before go to teams (a
minute's row to its owner's personal team, a task's hour to its task's team), the status trigger
writes the execution's team from then on, and going back restores the rollups by owner."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from executions import transitions
from executions.dashboard import dashboard_snapshot
from executions.models import RunRollup, TaskRollup
from tasks_api.moving import task_move
from tasks_app.teams.services import member_set, team_create
from tests.factories import TaskFactory, UserFactory

BEFORE = [("executions", "0028_execution_team_fair_idx")]
MINUTE = datetime(2026, 11, 26, 10, 5, tzinfo=UTC)
HOUR = MINUTE.replace(minute=0)
GONE = 987_654  # users deleted since: their rows had no personal team left


def _insert_runs(owner_id: int, runner: str, succeeded: int, failed: int = 0) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO executions_runrollup (minute, owner_id, runner, shard, succeeded, failed)"
            " VALUES (%s, %s, %s, 0, %s, %s)",
            [MINUTE, owner_id, runner, succeeded, failed],
        )


def _insert_hour(task_id, owner_id: int, attempts: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO executions_taskrollup (hour, task_id, owner_id, attempts, failures)"
            " VALUES (%s, %s, %s, %s, 1)",
            [HOUR, task_id, owner_id, attempts],
        )


def _start_one(task) -> int:
    (pk,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, timezone.now() - timedelta(seconds=1), 5)], actor="test"
    )
    transitions.executions_take_due(limit=100, actor="monitor:test")
    assert transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id="w:1", lease_seconds=60)
    return pk


def _succeed(pk: int) -> None:
    assert transitions.execution_succeed(execution_id=pk, attempt=1, worker_id="w:1", output="", max_chars=10)


def _finish_one(task) -> None:
    _succeed(_start_one(task))


@pytest.mark.django_db(transaction=True)
def test_existing_rollup_rows_land_in_the_owners_personal_team_and_the_trigger_writes_teams():
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    ops = team_create(creator=alice, name="Ops")
    member_set(team=ops, username="bob", role="viewer")
    stays = TaskFactory(owner=alice, runner="noop", name="stays")
    moved = TaskFactory(owner=alice, runner="noop", name="moved")
    task_move(task=moved, team=ops, user=alice)  # moved before the rollups were kept by team
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(BEFORE)
        _insert_runs(alice.pk, "noop", 5, 2)
        _insert_runs(bob.pk, "noop", 3)
        # Two users deleted since, same minute, runner and shard: one row of no team, added up.
        _insert_runs(GONE, "noop", 7)
        _insert_runs(GONE + 1, "noop", 1, 1)
        _insert_hour(stays.pk, alice.pk, 4)
        _insert_hour(moved.pk, alice.pk, 6)
        # A task's row deleted since, its owner's personal team left.
        _insert_hour("00000000-0000-0000-0000-000000000001", bob.pk, 2)

        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

        runs = {(r.team_id, r.runner): (r.succeeded, r.failed) for r in RunRollup.objects.all()}
        assert runs == {
            (alice.personal_team.pk, "noop"): (5, 2),
            (bob.personal_team.pk, "noop"): (3, 0),
            (0, "noop"): (8, 1),
        }
        hours = {str(r.task_id): r.team_id for r in TaskRollup.objects.all()}
        assert hours == {
            str(stays.pk): alice.personal_team.pk,
            str(moved.pk): ops.pk,  # where the task (and its executions) are now
            "00000000-0000-0000-0000-000000000001": bob.personal_team.pk,
        }

        # From now on the trigger writes the execution's team: Bob's dashboard counts a run of
        # Alice's task in ops, which the rollup by owner kept from him.
        shared = TaskFactory(owner=alice, team=ops, runner="sleep", name="shared")
        _finish_one(shared)
        fresh = RunRollup.objects.filter(runner="sleep")
        assert {r.team_id for r in fresh} == {ops.pk} and sum(r.succeeded for r in fresh) == 1
        assert TaskRollup.objects.get(task=shared).team_id == ops.pk
        assert dashboard_snapshot(user=bob).runs_last_hour["SUCCEEDED"] == 1

        # Back: each row to its team's user (a shared team's to 0), and the trigger by owner. The
        # run is started before, and ended by a plain UPDATE of its status (what the trigger
        # sees): the transitions' statements name columns of today's model (traceparent,
        # map_index) that the table of 0028 does not have.
        started = _start_one(stays)
        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE)
        with connection.cursor() as cursor:
            cursor.execute("SELECT owner_id, runner, succeeded FROM executions_runrollup ORDER BY owner_id, runner")
            back = cursor.fetchall()
            assert back == [(0, "noop", 8), (0, "sleep", 1), (alice.pk, "noop", 5), (bob.pk, "noop", 3)]
            cursor.execute(
                "UPDATE executions_execution SET status = 'SUCCEEDED', finished_at = now() WHERE id = %s", [started]
            )  # counted by owner again
            cursor.execute("SELECT sum(succeeded) FROM executions_runrollup WHERE owner_id = %s", [alice.pk])
            assert cursor.fetchone()[0] == 6
            cursor.execute("SELECT task_id::text, owner_id FROM executions_taskrollup WHERE hour = %s", [HOUR])
            assert dict(cursor.fetchall()) == {
                str(stays.pk): alice.pk,
                str(moved.pk): alice.pk,
                "00000000-0000-0000-0000-000000000001": bob.pk,
            }
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
