"""``/api/v1/teams`` and their members (issue 30): list with the caller's role, create (the creator
is admin), rename, delete an empty shared team; admins manage members by username; the last admin
stays."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tasks_api.creation import task_create
from tasks_app.models import AuditEntry, Membership, Team

URL = "/api/v1/teams"


def client_of(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def people(db):
    users = get_user_model().objects
    return {name: users.create_user(name) for name in ("ann", "ben", "cat")}


def test_a_user_lists_their_personal_team_and_creates_a_shared_one(people):
    ann = client_of(people["ann"])
    (personal,) = ann.get(URL).json()["results"]
    assert (personal["slug"], personal["personal"], personal["role"]) == ("ann", True, "admin")
    created = ann.post(URL, {"name": "Data Platform"}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert (body["name"], body["slug"], body["personal"], body["role"]) == (
        "Data Platform",
        "data-platform",
        False,
        "admin",
    )
    assert [team["slug"] for team in ann.get(URL).json()["results"]] == ["ann", "data-platform"]
    # Another user neither lists nor reads it.
    ben = client_of(people["ben"])
    assert [team["slug"] for team in ben.get(URL).json()["results"]] == ["ben"]
    assert ben.get(f"{URL}/{body['id']}").status_code == 404
    assert ben.get(f"{URL}/{body['id']}/members").status_code == 404
    taken = ben.post(URL, {"name": "Other", "slug": "data-platform"}, format="json")
    assert taken.status_code == 400 and "slug" in taken.json()["errors"]
    kept = ben.post(URL, {"name": "Ben's", "slug": "Ben_Team-2"}, format="json")  # a slug given is kept as given
    assert (kept.status_code, kept.json()["slug"]) == (201, "Ben_Team-2")
    for bad in ({}, {"name": ""}, {"name": "x", "slug": "not a slug"}, {"name": "x", "role": "admin"}, {"name": 5}):
        assert ben.post(URL, bad, format="json").status_code == 400, bad


def test_admins_manage_members_and_the_last_admin_stays(people):
    ann_user = people["ann"]
    ann, ben = client_of(ann_user), client_of(people["ben"])
    team = ann.post(URL, {"name": "Ops"}, format="json").json()
    members = f"{URL}/{team['id']}/members"
    added = ann.post(members, {"username": "ben", "role": "viewer"}, format="json")
    assert added.status_code == 201 and added.json()["role"] == "viewer"
    assert ann.post(members, {"username": "ben", "role": "operator"}, format="json").status_code == 200
    assert ann.post(members, {"username": "nobody", "role": "viewer"}, format="json").status_code == 400
    assert ann.post(members, {"username": "cat", "role": "owner"}, format="json").status_code == 400
    # Ben sees the team and its members, with his role, and may not manage it.
    (listed,) = [t for t in ben.get(URL).json()["results"] if t["id"] == team["id"]]
    assert listed["role"] == "operator"
    assert {m["username"]: m["role"] for m in ben.get(members).json()["results"]} == {"ann": "admin", "ben": "operator"}
    refused = ben.post(members, {"username": "cat", "role": "viewer"}, format="json")
    assert refused.status_code == 403 and "admin" in refused.json()["detail"]
    assert ben.patch(f"{URL}/{team['id']}", {"name": "Mine"}, format="json").status_code == 403
    assert ben.delete(f"{URL}/{team['id']}").status_code == 403
    # The last admin can be neither demoted nor removed ...
    demote = ann.patch(f"{members}/ann", {"role": "editor"}, format="json")
    assert demote.status_code == 400 and "last admin" in str(demote.json()["errors"])
    remove = ann.delete(f"{members}/ann")
    assert remove.status_code == 400 and "last admin" in str(remove.json()["errors"])
    # ... until another member is admin.
    assert ann.patch(f"{members}/ben", {"role": "admin"}, format="json").json()["role"] == "admin"
    assert ann.patch(f"{members}/ann", {"role": "viewer"}, format="json").status_code == 200
    assert ben.delete(f"{members}/ann").status_code == 204
    assert ann.get(f"{URL}/{team['id']}").status_code == 404
    assert ben.get(f"{members}/nobody").status_code == 404
    assert AuditEntry.objects.filter(object_type="team", object_id=str(team["id"]), action="team.member").count() == 5


def test_a_member_may_leave_and_a_personal_team_keeps_its_one_member(people):
    ann, ben = client_of(people["ann"]), client_of(people["ben"])
    team = ann.post(URL, {"name": "Ops"}, format="json").json()
    ann.post(f"{URL}/{team['id']}/members", {"username": "ben", "role": "editor"}, format="json")
    assert ben.delete(f"{URL}/{team['id']}/members/ben").status_code == 204
    personal = people["ann"].personal_team
    shared = ann.post(f"{URL}/{personal.pk}/members", {"username": "ben", "role": "viewer"}, format="json")
    assert shared.status_code == 400 and "username" in shared.json()["errors"]
    assert ann.delete(f"{URL}/{personal.pk}").status_code == 400


def test_a_team_is_renamed_and_deleted_only_when_it_holds_no_task(people):
    ann = client_of(people["ann"])
    team = ann.post(URL, {"name": "Ops"}, format="json").json()
    renamed = ann.patch(f"{URL}/{team['id']}", {"name": "Operations"}, format="json")
    assert (renamed.json()["name"], renamed.json()["slug"]) == ("Operations", "ops")
    assert ann.patch(f"{URL}/{team['id']}", {"slug": "x"}, format="json").status_code == 400
    task = task_create(owner=people["ann"], team=Team.objects.get(pk=team["id"]), runner="noop")
    held = ann.delete(f"{URL}/{team['id']}")
    assert held.status_code == 400 and "1 task" in str(held.json()["errors"])
    assert ann.delete(f"/api/v1/tasks/{task.pk}").status_code in (200, 202)
    assert ann.delete(f"{URL}/{team['id']}").status_code == 400  # a deleted task's history is the team's
    empty = ann.post(URL, {"name": "Empty"}, format="json").json()
    assert ann.delete(f"{URL}/{empty['id']}").status_code == 204
    assert not Team.objects.filter(pk=empty["id"]).exists()
    assert not Membership.objects.filter(team_id=empty["id"]).exists()


def test_staff_list_every_team_read_only(people, staff_user):
    team = client_of(people["ann"]).post(URL, {"name": "Ops"}, format="json").json()
    staff = client_of(staff_user)
    slugs = {t["slug"] for t in staff.get(URL).json()["results"]}
    assert {"ann", "ben", "cat", "ops", "root"} <= slugs
    assert staff.get(f"{URL}/{team['id']}/members").status_code == 200
    assert (
        staff.post(f"{URL}/{team['id']}/members", {"username": "ben", "role": "admin"}, format="json").status_code
        == 403
    )
