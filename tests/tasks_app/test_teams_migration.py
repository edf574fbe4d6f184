"""Migrations tasks_app 0026-0028 and executions 0025-0026: an install from before teams comes out
with every user alone in a personal team holding their tasks and runs, so each sees and does what
they did."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from executions.models import Execution
from tasks_app.models import Membership, Task, Team
from tasks_app.teams import visible_tasks

BEFORE = [("tasks_app", "0025_task_input"), ("executions", "0024_execution_replay")]


@pytest.mark.django_db(transaction=True)
def test_an_existing_install_puts_each_users_tasks_and_runs_in_their_personal_team(django_user_model):
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(BEFORE)
        old = executor.loader.project_state(BEFORE).apps
        users = old.get_model("auth", "User")
        # "Alice!" and "alice" make the same slug: the second personal team gets a suffix.
        alice = users.objects.create(username="alice", password="!")
        shouty = users.objects.create(username="Alice!", password="!")
        bob = users.objects.create(username="bob", password="!")
        lonely = users.objects.create(username="lonely", password="!")  # no tasks: still a team
        old_task = old.get_model("tasks_app", "Task")
        old_execution = old.get_model("executions", "Execution")
        now = timezone.now()
        tasks = {}
        for owner in (alice, shouty, bob):
            task = old_task.objects.create(owner_id=owner.pk, name=owner.username, runner="noop", start_at=now)
            tasks[owner.username] = task
            for n in range(2):
                when = now + timedelta(minutes=n)
                old_execution.objects.create(
                    task_id=task.pk, scheduled_for=when, due_at=when, priority=5, owner_id=owner.pk
                )
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

        for user in (alice, shouty, bob, lonely):
            team = Team.objects.get(personal_of_id=user.pk)
            assert list(Membership.objects.filter(team=team).values_list("user_id", "role")) == [(user.pk, "admin")]
        assert Team.objects.get(personal_of_id=alice.pk).slug == "alice"
        assert Team.objects.get(personal_of_id=shouty.pk).slug == f"alice-user-{shouty.pk}"
        for name, task in tasks.items():
            migrated = Task.objects.get(pk=task.pk)
            assert migrated.team.personal_of_id == migrated.owner_id, name
            teams = set(Execution.objects.filter(task_id=task.pk).values_list("team_id", flat=True))
            assert teams == {migrated.team_id}, name
        # Each sees exactly their own, as before; a new user of the same install gets a team too.
        real_alice = django_user_model.objects.get(pk=alice.pk)
        assert list(visible_tasks(real_alice).values_list("pk", flat=True)) == [tasks["alice"].pk]
        newcomer = django_user_model.objects.create_user("newcomer")
        assert newcomer.personal_team.memberships.get().role == "admin"
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
