"""Migrations tasks_app 0029-0031 and notifications 0010-0012: an install from before teams owned
limits, calendars, artifacts, channels and rules comes out with each in its owner's personal team
(a global limit in none), so each user sees and uses exactly what they did, and a user's default
rules keep speaking for their tasks."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from rest_framework.test import APIClient

from notifications.dispatch import effective_rules
from notifications.models import Channel, Rule
from tasks_app.models import Artifact, Calendar, Limit, Task, Team

BEFORE = [("tasks_app", "0028_task_team_not_null"), ("notifications", "0009_rulestate_workflow")]


@pytest.mark.django_db(transaction=True)
def test_existing_rows_land_in_their_owners_personal_team(django_user_model):
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(BEFORE)
        old = executor.loader.project_state(BEFORE).apps
        users = old.get_model("auth", "User")
        teams = old.get_model("tasks_app", "Team")
        memberships = old.get_model("tasks_app", "Membership")
        # Made through the historical models: no personal team yet (0030 makes them, as 0027 did).
        alice = users.objects.create(username="alice", password="!")
        bob = users.objects.create(username="bob", password="!")
        # A shared team, as teams 0026-0028 allowed: its rows are not the owners' to keep.
        shared = teams.objects.create(name="Ops", slug="ops")
        memberships.objects.create(team_id=shared.pk, user_id=alice.pk, role="admin")
        made: dict[str, dict[str, int]] = {}
        for owner in (alice, bob):
            ids = made[owner.username] = {}
            ids["limit"] = (
                old.get_model("tasks_app", "Limit").objects.create(owner_id=owner.pk, name="api", max_concurrency=2).pk
            )
            ids["calendar"] = (
                old.get_model("tasks_app", "Calendar")
                .objects.create(owner_id=owner.pk, name="plant", weekends_closed=True)
                .pk
            )
            ids["artifact"] = str(
                old.get_model("tasks_app", "Artifact")
                .objects.create(owner_id=owner.pk, name="a.sh", file="artifacts/a.sh", sha256="0" * 64, size=1)
                .pk
            )
            channel = old.get_model("notifications", "Channel").objects.create(
                owner_id=owner.pk, name="hook", kind="webhook", target="https://hooks.example.com/x"
            )
            ids["channel"] = channel.pk
            ids["rule"] = (
                old.get_model("notifications", "Rule")
                .objects.create(owner_id=owner.pk, channel_id=channel.pk, on_failure=True)
                .pk
            )
        global_limit = old.get_model("tasks_app", "Limit").objects.create(name="everyone", max_concurrency=9).pk

        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

        for owner in (alice, bob):
            personal = Team.objects.get(personal_of_id=owner.pk)
            ids = made[owner.username]
            for model, key in ((Limit, "limit"), (Calendar, "calendar"), (Artifact, "artifact")):
                assert model.objects.get(pk=ids[key]).team_id == personal.pk, (owner.username, key)
            assert Channel.objects.get(pk=ids["channel"]).team_id == personal.pk
            assert Rule.objects.get(pk=ids["rule"]).team_id == personal.pk
        assert Limit.objects.get(pk=global_limit).team_id is None
        assert not Limit.objects.filter(team_id=shared.pk).exists()

        # Each user reads exactly their own, as before; a task of theirs uses them and their
        # default rule speaks for it.
        real_alice = django_user_model.objects.get(pk=alice.pk)
        client = APIClient()
        client.force_authenticate(real_alice)
        limits = client.get("/api/v1/limits").json()
        limits = limits["results"] if isinstance(limits, dict) else limits
        assert sorted(row["name"] for row in limits) == ["api", "everyone"]
        calendars = client.get("/api/v1/calendars").json()
        calendars = calendars["results"] if isinstance(calendars, dict) else calendars
        assert [row["id"] for row in calendars] == [made["alice"]["calendar"]]
        made_task = client.post(
            "/api/v1/tasks",
            {"runner": "noop", "start_at": timezone.now().isoformat(), "calendar": "plant", "limits": ["api"]},
            format="json",
        )
        assert made_task.status_code == 201, made_task.content
        task = Task.objects.get(pk=made_task.json()["id"])
        assert [rule.pk for rule in effective_rules(task)] == [made["alice"]["rule"]]
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
