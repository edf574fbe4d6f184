"""Access tokens scoped to one team (issue 30, tokens): requests with such a token see and act in
that team only, through every list and object, with the user's role there; staff's see-all goes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import AccessToken
from executions.models import Execution
from tasks_app.models import AuditEntry, Membership, Task, TeamRole
from tasks_app.teams.services import member_set, personal_team_of, team_create
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

NOOP = {"runner": "noop", "interval": 3600}


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def make_token(client: APIClient, **body: object) -> dict:
    response = client.post("/api/v1/tokens", {"name": "ci", "scopes": ["write"], **body}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


@pytest.fixture
def world(db):
    """Ann: admin of the shared team ops (Ben is its viewer) and of her personal team, a task and
    a run in each; Cat: a task and a run in her own personal team."""
    users = get_user_model().objects
    ann, ben, cat = (users.create_user(name) for name in ("ann", "ben", "cat"))
    ops = team_create(creator=ann, name="Ops")
    member_set(team=ops, username="ben", role=TeamRole.VIEWER)
    ann_client, cat_client = client_for(ann), client_for(cat)
    tasks = {}
    for name, client, team in (("ops", ann_client, "ops"), ("mine", ann_client, "ann"), ("cat", cat_client, "cat")):
        made = client.post("/api/v1/tasks", {**NOOP, "name": name, "team": team}, format="json")
        assert made.status_code == 201, made.content
        tasks[name] = made.json()["id"]
        assert client.post(f"/api/v1/tasks/{made.json()['id']}/trigger").status_code == 201
    return {"ann": ann, "ben": ben, "cat": cat, "ops": ops, "tasks": tasks, "ann_client": ann_client}


def test_a_team_scoped_token_sees_and_acts_in_its_team_only(world):
    ops, tasks = world["ops"], world["tasks"]
    made = make_token(world["ann_client"], team="ops")
    assert made["team"] == ops.pk
    scoped = bearer(made["key"])

    listed = scoped.get("/api/v1/tasks").json()["results"]
    assert [task["id"] for task in listed] == [tasks["ops"]]
    runs = scoped.get("/api/v1/executions").json()["results"]
    assert runs and {run["team"] for run in runs} == {ops.pk}
    assert [team["slug"] for team in scoped.get("/api/v1/teams").json()["results"]] == ["ops"]
    # Her own personal team's task is as absent as another user's.
    for task in (tasks["mine"], tasks["cat"]):
        assert scoped.get(f"/api/v1/tasks/{task}").status_code == 404
        assert scoped.post(f"/api/v1/tasks/{task}/trigger").status_code == 404
        assert scoped.get(f"/api/v1/tasks/{task}/executions").status_code == 404
    mine_run = Execution.objects.filter(task_id=tasks["mine"]).first()
    assert scoped.get(f"/api/v1/executions/{mine_run.pk}").status_code == 404
    assert scoped.get(f"/api/v1/teams/{personal_team_of(world['ann']).pk}").status_code == 404
    assert scoped.get("/api/v1/tasks", {"team": "ann"}).status_code == 400
    assert scoped.get("/api/v1/executions", {"team": "ann"}).status_code == 400

    # Creating: the token's team by default; another team of hers is a 400 on team.
    created = scoped.post("/api/v1/tasks", {**NOOP, "name": "deploy"}, format="json")
    assert created.status_code == 201, created.content
    assert Task.objects.get(pk=created.json()["id"]).team_id == ops.pk
    elsewhere = scoped.post("/api/v1/tasks", {**NOOP, "name": "x", "team": "ann"}, format="json")
    assert elsewhere.status_code == 400 and "team" in elsewhere.json()["errors"]
    moved = scoped.patch(f"/api/v1/tasks/{tasks['ops']}", {"team": "ann"}, format="json")
    assert moved.status_code == 400 and "team" in moved.json()["errors"]
    # Nor can it make a team outside its scope.
    assert scoped.post("/api/v1/teams", {"name": "Escape"}, format="json").status_code == 403
    assert scoped.post(f"/api/v1/tasks/{tasks['ops']}/trigger").status_code == 201

    # The same user's session and unscoped keys are not narrowed.
    assert len(world["ann_client"].get("/api/v1/tasks").json()["results"]) == 3


def test_a_scoped_token_lists_only_the_tokens_of_its_team(world):
    ann = world["ann_client"]
    scoped = make_token(ann, team="ops", name="ops ci")
    make_token(ann, name="everything")
    listed = bearer(scoped["key"]).get("/api/v1/tokens").json()["results"]
    assert [token["name"] for token in listed] == ["ops ci"]
    assert [token["name"] for token in ann.get("/api/v1/tokens").json()["results"]] == ["everything", "ops ci"]
    entry = AuditEntry.objects.filter(action="token.create").order_by("id").first()
    assert entry.changes["team"] == {"from": None, "to": "ops"}


def test_staff_see_all_is_narrowed_by_a_team_scoped_token(world, django_user_model):
    root = django_user_model.objects.create_user("root", is_staff=True)
    root_client = client_for(root)
    assert len(root_client.get("/api/v1/tasks").json()["results"]) == 3  # support sees every team
    scoped = bearer(make_token(root_client, team="root")["key"])
    assert scoped.get("/api/v1/tasks").json()["results"] == []
    assert scoped.get("/api/v1/executions").json()["results"] == []
    assert [team["slug"] for team in scoped.get("/api/v1/teams").json()["results"]] == ["root"]
    assert scoped.get(f"/api/v1/tasks/{world['tasks']['ops']}").status_code == 404
    # Nor the platform's processes, nor anyone's audit log.
    assert root_client.get("/api/v1/workers").status_code == 200
    assert scoped.get("/api/v1/workers").status_code == 403
    assert root_client.get("/api/v1/audit").json()["results"]
    assert scoped.get("/api/v1/audit").json()["results"] == []
    # Staff may not scope a token to a team they only see.
    refused = root_client.post("/api/v1/tokens", {"name": "x", "scopes": ["read"], "team": "ops"}, format="json")
    assert refused.status_code == 400 and "team" in refused.json()["errors"]


@pytest.mark.parametrize(
    "team",
    ["cat", "no-such-team", 999999, True, ["ops"], {"slug": "ops"}, "x" * 61],
)
def test_a_token_names_only_a_team_of_its_user(world, team):
    refused = world["ann_client"].post("/api/v1/tokens", {"name": "x", "scopes": ["read"], "team": team}, format="json")
    assert refused.status_code == 400, refused.content
    assert list(refused.json()["errors"]) == ["team"]
    assert not AccessToken.objects.exists()


def test_a_team_given_by_id_or_null(world):
    assert make_token(world["ann_client"], team=world["ops"].pk)["team"] == world["ops"].pk
    assert make_token(world["ann_client"], team=None)["team"] is None


def test_the_role_still_applies_and_a_read_token_cannot_write(world):
    ben_client = client_for(world["ben"])
    viewer = bearer(make_token(ben_client, team="ops")["key"])
    task = world["tasks"]["ops"]
    assert viewer.get(f"/api/v1/tasks/{task}").status_code == 200
    refused = viewer.post(f"/api/v1/tasks/{task}/trigger")
    assert refused.status_code == 403 and "viewer" in refused.json()["detail"]
    assert viewer.post("/api/v1/tasks", {**NOOP, "name": "x"}, format="json").status_code == 403

    reader = bearer(make_token(world["ann_client"], team="ops", scopes=["read"])["key"])
    assert reader.get(f"/api/v1/tasks/{task}").status_code == 200
    refused = reader.post(f"/api/v1/tasks/{task}/trigger")
    assert refused.status_code == 403 and "may only read" in refused.json()["detail"]


def test_an_expired_token_and_a_member_who_left_are_refused(world):
    made = make_token(world["ann_client"], team="ops")
    member_set(team=world["ops"], username="ben", role=TeamRole.ADMIN)
    key = made["key"]
    assert bearer(key).get("/api/v1/tasks").status_code == 200
    Membership.objects.filter(team=world["ops"], user=world["ann"]).delete()
    left = bearer(key).get("/api/v1/tasks")
    assert left.status_code == 401 and "no longer a member" in left.json()["detail"]
    Membership.objects.create(team=world["ops"], user=world["ann"], role=TeamRole.ADMIN)
    AccessToken.objects.filter(pk=made["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    expired = bearer(key).get("/api/v1/tasks")
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]


def test_deleting_the_team_deletes_its_tokens(world):
    ann = world["ann_client"]
    team = ann.post("/api/v1/teams", {"name": "Short lived"}, format="json").json()
    made = make_token(ann, team=team["slug"])
    assert ann.delete(f"/api/v1/teams/{team['id']}").status_code == 204
    assert not AccessToken.objects.filter(pk=made["id"]).exists()
    assert bearer(made["key"]).get("/api/v1/tasks").status_code == 401


def test_a_scoped_token_reads_the_audit_entries_of_its_teams_tasks_only(world):
    scoped = bearer(make_token(world["ann_client"], team="ops")["key"])
    everything = world["ann_client"].get("/api/v1/audit").json()["results"]
    assert {entry["task_id"] for entry in everything} >= {world["tasks"]["ops"], world["tasks"]["mine"]}
    entries = scoped.get("/api/v1/audit").json()["results"]
    assert entries and {entry["task_id"] for entry in entries} == {world["tasks"]["ops"]}


def test_a_superusers_team_scoped_token_neither_makes_nor_changes_a_global_limit(world, django_user_model):
    """A global limit belongs to no team: a key scoped to one team may not define or change one,
    whatever its user may do otherwise."""
    root = django_user_model.objects.create_superuser("root", password="pw")
    root_client = client_for(root)
    body = {"name": "shared", "max_concurrency": 5, "is_global": True}
    made = root_client.post("/api/v1/limits", body, format="json")
    assert made.status_code == 201, made.content
    scoped = bearer(make_token(root_client, team="root")["key"])
    refused = scoped.post("/api/v1/limits", {**body, "name": "other"}, format="json")
    assert refused.status_code == 403
    changed = scoped.patch(f"/api/v1/limits/{made.json()['id']}", {"max_concurrency": 1}, format="json")
    assert changed.status_code == 403
