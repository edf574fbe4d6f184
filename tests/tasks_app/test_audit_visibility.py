"""Whose audit history a user reads: the task's current team's members, not its creator
(security audit, round 3, item 4)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.tokens import token_create
from tasks_api.creation import task_create
from tasks_api.editing import task_update
from tasks_api.moving import task_move
from tasks_app.audit import audit_context
from tasks_app.models import TeamRole
from tasks_app.teams.services import member_remove, member_set, team_create
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def _task_entries(client, task) -> list[tuple[str, str]]:
    response = client.get(f"/api/v1/audit?task={task.pk}")
    assert response.status_code == 200, response.content
    return [(item["action"], item["actor"]) for item in response.json()["results"]]


def _all_task_ids(client) -> set[str]:
    response = client.get("/api/v1/audit?limit=200")
    assert response.status_code == 200, response.content
    return {item["task_id"] for item in response.json()["results"] if item["task_id"]}


def test_a_creator_removed_from_the_team_no_longer_reads_the_tasks_history(django_user_model):
    ann = django_user_model.objects.create_user(username="ann")
    bob = django_user_model.objects.create_user(username="bob")
    team = team_create(creator=bob, name="Reports")
    member_set(team=team, username="ann", role=TeamRole.EDITOR)
    task = task_create(
        owner=ann,
        team=team,
        runner="http",
        config={"url": "https://a.example/x"},
        start_at=timezone.now() + timedelta(days=1),
    )
    assert _task_entries(client_for(ann), task) == [("create", "system")]
    member_remove(team=team, username="ann")
    with audit_context(source="api", actor=bob, remote_addr="198.51.100.7"):
        task_update(task=task, actor="bob", changes={"config": {"url": "https://b.example/secret-path"}})
    ann_client = client_for(ann)
    # Neither the list (by task, or all of it) nor the entries one by one.
    assert _task_entries(ann_client, task) == []
    assert str(task.pk) not in _all_task_ids(ann_client)
    body = ann_client.get("/api/v1/audit?limit=200").content.decode()
    assert "secret-path" not in body and "198.51.100.7" not in body
    from tasks_app.models import AuditEntry

    for entry in AuditEntry.objects.filter(task_id=task.pk):
        assert ann_client.get(f"/api/v1/audit/{entry.pk}").status_code == 404
    # The team still reads all of it, the change by bob first.
    assert _task_entries(client_for(bob), task) == [("update", "bob"), ("create", "system")]


def test_after_a_move_the_old_team_no_longer_reads_the_history_and_the_new_team_does(django_user_model):
    ann = django_user_model.objects.create_user(username="ann")
    old_member = django_user_model.objects.create_user(username="olly")
    new_member = django_user_model.objects.create_user(username="nina")
    old = team_create(creator=ann, name="Old")
    new = team_create(creator=ann, name="New")
    member_set(team=old, username="olly", role=TeamRole.VIEWER)
    member_set(team=new, username="nina", role=TeamRole.ADMIN)
    task = task_create(owner=ann, team=old, runner="noop", start_at=timezone.now() + timedelta(days=1))
    assert _task_entries(client_for(old_member), task) == [("create", "system")]
    assert _task_entries(client_for(new_member), task) == []
    task_move(task=task, team=new, user=ann)
    member_remove(team=new, username="ann")  # the creator leaves the new team too
    assert _task_entries(client_for(old_member), task) == []
    assert [action for action, _ in _task_entries(client_for(new_member), task)] == ["update", "create"]
    # The creator is still the old team's admin: the task is no longer the old team's, so neither
    # is its history.
    assert _task_entries(client_for(ann), task) == []


def test_account_entries_stay_their_owners_and_team_objects_follow_their_team(django_user_model):
    ann = django_user_model.objects.create_user(username="ann")
    bob = django_user_model.objects.create_user(username="bob")
    team = team_create(creator=bob, name="Shared")
    member_set(team=team, username="ann", role=TeamRole.EDITOR)
    token_create(user=ann, name="laptop", scopes=["read"], expires_at=None)
    ann_client, bob_client = client_for(ann), client_for(bob)
    response = ann_client.post("/api/v1/limits", {"name": "db", "team": team.slug, "max_concurrency": 2}, format="json")
    assert response.status_code == 201, response.content

    def actions(client) -> list[str]:
        return [item["action"] for item in client.get("/api/v1/audit").json()["results"]]

    assert actions(ann_client) == ["limit.create", "token.create"]
    assert actions(bob_client) == ["limit.create"]  # the team's limit, not ann's token
    member_remove(team=team, username="ann")
    assert actions(client_for(ann)) == ["token.create"]
