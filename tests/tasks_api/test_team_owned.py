"""Teams own limits, calendars, artifacts and notification channels and rules (issue 30), as they own
tasks: members read them, editors create, change and delete them, a non-member gets 404, every list
takes ``?team=`` (400 for a team one is not in), and a create goes in the team named (editor there),
by default the caller's personal team.

The matrix: each kind x each role (and a non-member, and read-only support staff)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from notifications import services as notify
from notifications.models import Channel, Rule
from tasks_api.calendars import calendar_create
from tasks_api.limits import limit_create
from tasks_app.artifacts import artifact_create
from tasks_app.models import Artifact, Calendar, Limit
from tasks_app.teams.services import member_set, team_create

pytestmark = pytest.mark.django_db

ROLES = ["viewer", "operator", "editor", "admin", "outsider", "staff"]
WRITERS = {"editor", "admin"}


@pytest.fixture(autouse=True)
def _media(tmp_path, settings):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.TMS_ARTIFACT_CACHE_DIR = str(tmp_path / "cache")


@pytest.fixture
def world(db):
    """Team "ops" (made by its admin) with one member of each role; a non-member; support staff."""
    users = get_user_model().objects
    admin = users.create_user("ops-admin")
    team = team_create(creator=admin, name="Ops")
    people = {"admin": admin}
    for role in ("viewer", "operator", "editor"):
        people[role] = users.create_user(f"ops-{role}")
        member_set(team=team, username=f"ops-{role}", role=role)
    people["outsider"] = users.create_user("outsider")
    people["staff"] = users.create_user("support", is_staff=True)
    return {"team": team, "people": people}


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _upload(name: str) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, b"#!/bin/sh\necho hi\n")


#: Each kind: its path, how the team's admin makes one, a create body, a change, and its model.
KINDS: dict[str, dict[str, Any]] = {
    "limit": {
        "path": "/api/v1/limits",
        "make": lambda owner, team: limit_create(owner=owner, team=team, name="api", max_concurrency=2),
        "body": lambda world: {"name": "second", "max_concurrency": 3},
        "change": {"max_concurrency": 5},
        "model": Limit,
    },
    "calendar": {
        "path": "/api/v1/calendars",
        "make": lambda owner, team: calendar_create(owner=owner, team=team, name="plant", weekends_closed=True),
        "body": lambda world: {"name": "second", "weekends_closed": True},
        "change": {"name": "renamed"},
        "model": Calendar,
    },
    "artifact": {
        "path": "/api/v1/artifacts",
        "make": lambda owner, team: artifact_create(owner=owner, team=team, upload=_upload("a.sh")),
        "body": lambda world: {"file": _upload("b.sh")},
        "change": None,  # artifacts are not changed, only uploaded and deleted
        "model": Artifact,
    },
    "channel": {
        "path": "/api/v1/notification-channels",
        "make": lambda owner, team: notify.channel_create(
            owner=owner, team=team, data={"name": "hook", "kind": "webhook", "target": "https://hooks.example.com/a"}
        ),
        "body": lambda world: {"name": "second", "kind": "webhook", "target": "https://hooks.example.com/b"},
        "change": {"name": "renamed"},
        "model": Channel,
    },
    "rule": {
        "path": "/api/v1/notification-rules",
        "make": lambda owner, team: notify.rule_create(
            owner=owner,
            data={
                "channel": notify.channel_create(
                    owner=owner,
                    team=team,
                    data={"name": "c", "kind": "webhook", "target": "https://hooks.example.com/c"},
                ),
                "on_failure": True,
            },
        ),
        "body": lambda world: {"channel": Channel.objects.get(team=world["team"]).pk, "on_retry": True},
        "change": {"on_recovery": True},
        "model": Rule,
    },
}


def _create(client: APIClient, kind: str, world: dict, **extra: Any) -> Any:
    spec = KINDS[kind]
    body = {**spec["body"](world), **extra}
    fmt = "multipart" if kind == "artifact" else "json"
    return client.post(spec["path"], body, format=fmt)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("role", ROLES)
def test_the_role_matrix(world, kind, role):
    spec = KINDS[kind]
    team = world["team"]
    obj = spec["make"](world["people"]["admin"], team)
    assert obj.team_id == team.pk  # a rule goes in its channel's team by default
    client = _client(world["people"][role])
    url = f"{spec['path']}/{obj.pk}"

    # Read: members and staff; a non-member does not see it.
    read = client.get(url)
    assert read.status_code == (200 if role != "outsider" else 404), read.content
    if read.status_code == 200:
        assert read.json()["team"] == team.pk
    # The list, narrowed to the team: a team one is not in is a 400 on team, not an empty list.
    listed = client.get(spec["path"], {"team": team.slug})
    if role == "outsider":
        assert listed.status_code == 400 and "team" in listed.json()["errors"], listed.content
    else:
        assert listed.status_code == 200, listed.content
        rows = listed.json()
        rows = rows["results"] if isinstance(rows, dict) else rows
        assert [row["id"] for row in rows] == [obj.pk if kind != "artifact" else str(obj.pk)]

    # Create in the team: editors; lower roles 403; a non-member's team is not found (400);
    # staff see the team but hold no role there (403).
    made = _create(client, kind, world, team=team.slug)
    want = 201 if role in WRITERS else 400 if role == "outsider" else 403
    if kind == "rule" and role == "staff":
        want = 400  # without the permission staff pick no team's channel: "does not exist"
    assert made.status_code == want, made.content
    if want == 201:
        assert made.json()["team"] == team.pk

    # Change (where the kind can change) and delete: editors; 403 for those who only read; 404 outside.
    denied = 404 if role == "outsider" else 403
    if spec["change"] is not None:
        changed = client.patch(url, spec["change"], format="json")
        assert changed.status_code == (200 if role in WRITERS else denied), changed.content
        moved = client.patch(url, {"team": team.slug}, format="json")
        if role in WRITERS:
            assert moved.status_code == 400 and "team" in moved.json()["errors"], moved.content
    deleted = client.delete(url)
    assert deleted.status_code == (204 if role in WRITERS else denied), deleted.content
    assert spec["model"].objects.filter(pk=obj.pk).exists() == (role not in WRITERS)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_create_without_team_goes_in_the_personal_team_and_a_stranger_does_not_see_it(world, kind, user):
    if kind == "rule":
        notify.channel_create(
            owner=user, data={"name": "mine", "kind": "webhook", "target": "https://hooks.example.com/m"}
        )
        made = _client(user).post(
            "/api/v1/notification-rules", {"channel": Channel.objects.get(owner=user).pk, "on_failure": True}
        )
    else:
        made = _create(_client(user), kind, {"team": None})
    assert made.status_code == 201, made.content
    assert made.json()["team"] == user.personal_team.pk
    path = KINDS[kind]["path"]
    stranger = _client(world["people"]["outsider"])
    assert stranger.get(f"{path}/{made.json()['id']}").status_code == 404
    rows = stranger.get(path).json()
    rows = rows["results"] if isinstance(rows, dict) else rows
    assert rows == []
    # ?team= with a team that does not exist is the same 400 as one of another's.
    missing = _client(user).get(path, {"team": "no-such-team"})
    assert missing.status_code == 400 and "team" in missing.json()["errors"]


def test_a_global_limit_has_no_team_and_every_team_reads_it(world, staff_user):
    staff_user.is_superuser = True
    staff_user.save()
    made = _client(staff_user).post("/api/v1/limits", {"name": "shared", "max_concurrency": 9, "is_global": True})
    assert made.status_code == 201, made.content
    assert made.json()["team"] is None and made.json()["is_global"] is True
    both = _client(staff_user).post(
        "/api/v1/limits", {"name": "x", "max_concurrency": 9, "is_global": True, "team": world["team"].slug}
    )
    assert both.status_code == 400 and "team" in both.json()["errors"]
    outsider = _client(world["people"]["outsider"])
    assert outsider.get(f"/api/v1/limits/{made.json()['id']}").status_code == 200
    assert outsider.patch(f"/api/v1/limits/{made.json()['id']}", {"max_concurrency": 1}).status_code == 403


def test_a_team_holding_limits_calendars_or_channels_is_not_deleted(world):
    admin, team = world["people"]["admin"], world["team"]
    calendar_create(owner=admin, team=team, name="plant", weekends_closed=True)
    refused = _client(admin).delete(f"/api/v1/teams/{team.pk}")
    assert refused.status_code == 400 and "1 calendar(s)" in str(refused.json()["errors"]["team"])
    Calendar.objects.filter(team=team).delete()
    assert _client(admin).delete(f"/api/v1/teams/{team.pk}").status_code == 204
