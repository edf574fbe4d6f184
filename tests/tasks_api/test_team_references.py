"""A task uses only its own team's calendar, named limits and artifact, and a notification rule only
its own team's channel and task (issue 30): another team's is a 400 on the field, exactly as a
missing one. A task does not move to another team while it uses its old team's (400 naming what),
unless the same request gives it the new team's. A team's rules speak for the team's tasks,
whoever created them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from rest_framework.test import APIClient

from executions import transitions
from notifications import dispatch
from notifications import services as notify
from notifications.models import Delivery, Outbox
from tasks_api.calendars import calendar_create
from tasks_api.creation import task_create
from tasks_api.limits import limit_create
from tasks_app.artifacts import artifact_create
from tasks_app.models import Task
from tasks_app.teams.services import member_set, team_create

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _media(tmp_path, settings):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.TMS_ARTIFACT_CACHE_DIR = str(tmp_path / "cache")


@pytest.fixture
def ops(db):
    """Team "ops" with two editors, ann (its admin) and ben; each also has a personal team."""
    users = get_user_model().objects
    ann, ben = users.create_user("ann"), users.create_user("ben")
    team = team_create(creator=ann, name="Ops")
    member_set(team=team, username="ben", role="editor")
    return {"team": team, "ann": ann, "ben": ben}


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _upload(owner, team=None):
    return artifact_create(owner=owner, team=team, upload=SimpleUploadedFile("run.sh", b"#!/bin/sh\necho hi\n"))


def test_a_task_takes_a_calendar_and_limits_of_its_own_team_only(ops):
    ann, team = ops["ann"], ops["team"]
    calendar_create(owner=ann, name="home", weekends_closed=True)  # ann's personal team
    calendar_create(owner=ann, team=team, name="plant", weekends_closed=True)
    limit_create(owner=ann, name="mine", max_concurrency=1)
    limit_create(owner=ann, team=team, name="api", max_concurrency=1)
    client = _client(ann)
    base = {"runner": "noop", "team": team.slug, "interval": "1h"}

    wrong_calendar = client.post("/api/v1/tasks", {**base, "calendar": "home"}, format="json")
    assert wrong_calendar.status_code == 400 and "calendar" in wrong_calendar.json()["errors"]
    wrong_limit = client.post("/api/v1/tasks", {**base, "limits": ["mine"]}, format="json")
    assert wrong_limit.status_code == 400 and "limits" in wrong_limit.json()["errors"]
    assert not Task.objects.filter(team=team).exists()

    made = client.post("/api/v1/tasks", {**base, "calendar": "plant", "limits": ["api"]}, format="json")
    assert made.status_code == 201, made.content
    task_id = made.json()["id"]
    # A change is held to the task's team the same way.
    changed = client.patch(f"/api/v1/tasks/{task_id}", {"calendar": "home", "limits": ["mine"]}, format="json")
    assert changed.status_code == 400 and {"calendar"} <= set(changed.json()["errors"]), changed.content
    task = Task.objects.get(pk=task_id)
    assert task.calendar.name == "plant" and [limit.name for limit in task.limits.all()] == ["api"]


def test_a_task_runs_an_artifact_of_its_own_team_only(ops):
    ann, team = ops["ann"], ops["team"]
    personal, shared = _upload(ann), _upload(ann, team)
    client = _client(ann)
    body = {"runner": "subprocess", "config": {"artifact": True}, "team": team.slug}
    refused = client.post("/api/v1/tasks", {**body, "artifact": str(personal.pk)}, format="json")
    assert refused.status_code == 400 and "artifact" in refused.json()["errors"], refused.content
    made = client.post("/api/v1/tasks", {**body, "artifact": str(shared.pk)}, format="json")
    assert made.status_code == 201, made.content
    # Another member sees the team's artifact; someone outside the team does not.
    assert _client(ops["ben"]).get(f"/api/v1/artifacts/{shared.pk}").status_code == 200
    assert _client(ops["ben"]).get(f"/api/v1/artifacts/{personal.pk}").status_code == 404


def test_a_move_is_refused_while_the_task_uses_its_old_teams_calendar_limits_or_rules(ops):
    ann, team = ops["ann"], ops["team"]
    calendar_create(owner=ann, name="home", weekends_closed=True)
    calendar_create(owner=ann, team=team, name="plant", weekends_closed=True)
    limit_create(owner=ann, name="mine", max_concurrency=1)
    limit_create(owner=ann, team=team, name="api", max_concurrency=1)
    limit_create(owner=None, name="everyone", max_concurrency=5)  # global: goes anywhere
    task = task_create(
        owner=ann, runner="noop", interval=timedelta(hours=1), calendar="home", limits=["mine", "everyone"]
    )
    client = _client(ann)

    refused = client.patch(f"/api/v1/tasks/{task.pk}", {"team": team.slug}, format="json")
    assert refused.status_code == 400, refused.content
    errors = refused.json()["errors"]
    assert set(errors) == {"calendar", "limits"}
    assert (
        "'home'" in errors["calendar"][0] and "'mine'" in errors["limits"][0] and "everyone" not in errors["limits"][0]
    )
    assert Task.objects.get(pk=task.pk).team_id == ann.personal_team.pk

    # The same request gives it the new team's: it moves, with them.
    moved = client.patch(
        f"/api/v1/tasks/{task.pk}",
        {"team": team.slug, "calendar": "plant", "limits": ["api", "everyone"]},
        format="json",
    )
    assert moved.status_code == 200, moved.content
    task.refresh_from_db()
    assert task.team_id == team.pk and task.calendar.name == "plant"
    assert sorted(limit.name for limit in task.limits.all()) == ["api", "everyone"]

    # A rule of the team set for the task keeps it there.
    channel = notify.channel_create(
        owner=ann, team=team, data={"name": "c", "kind": "webhook", "target": "https://hooks.example.com/c"}
    )
    rule = notify.rule_create(owner=ann, data={"channel": channel, "task": task, "on_failure": True})
    back = client.patch(f"/api/v1/tasks/{task.pk}", {"team": ann.personal_team.slug, "calendar": None}, format="json")
    assert back.status_code == 400 and str(rule.pk) in back.json()["errors"]["team"][0], back.content


def test_a_move_is_refused_while_the_task_runs_an_artifact_of_its_old_team(ops):
    ann, team = ops["ann"], ops["team"]
    task = task_create(owner=ann, runner="subprocess", config={"artifact": True}, artifact=_upload(ann))
    refused = _client(ann).patch(f"/api/v1/tasks/{task.pk}", {"team": team.slug}, format="json")
    assert refused.status_code == 400 and set(refused.json()["errors"]) == {"artifact"}, refused.content
    assert Task.objects.get(pk=task.pk).team_id == ann.personal_team.pk
    # A task of the team runs the team's copy.
    shared = _upload(ann, team)
    there = task_create(owner=ann, team=team, runner="subprocess", config={"artifact": True}, artifact=shared)
    assert there.artifact_id == shared.pk


def test_a_rule_takes_a_channel_and_a_task_of_its_own_team_only(ops):
    ann, team = ops["ann"], ops["team"]
    mine = notify.channel_create(
        owner=ann, data={"name": "mine", "kind": "webhook", "target": "https://hooks.example.com/m"}
    )
    theirs = notify.channel_create(
        owner=ann, team=team, data={"name": "ops", "kind": "webhook", "target": "https://hooks.example.com/o"}
    )
    team_task = task_create(owner=ann, team=team, runner="noop", interval=timedelta(hours=1))
    client = _client(ann)
    # The rule goes in its channel's team: a task of another team is a 400 on task.
    crossed = client.post(
        "/api/v1/notification-rules", {"channel": mine.pk, "task": str(team_task.pk), "on_failure": True}
    )
    assert crossed.status_code == 400 and "task" in crossed.json()["errors"], crossed.content
    # Naming the team, a channel of another team is a 400 on channel.
    named = client.post(
        "/api/v1/notification-rules",
        {"team": team.slug, "channel": mine.pk, "task": str(team_task.pk), "on_failure": True},
    )
    assert named.status_code == 400 and "channel" in named.json()["errors"], named.content
    made = client.post(
        "/api/v1/notification-rules", {"channel": theirs.pk, "task": str(team_task.pk), "on_failure": True}
    )
    assert made.status_code == 201 and made.json()["team"] == team.pk, made.content
    # Another team's channel is a 400 on a change too.
    changed = client.patch(f"/api/v1/notification-rules/{made.json()['id']}", {"channel": mine.pk}, format="json")
    assert changed.status_code == 400 and "channel" in changed.json()["errors"]


def _fail(task) -> None:
    """One execution of ``task`` through the real transitions, to a final failure."""
    (pk,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, timezone.now(), task.priority)], actor="t"
    )
    transitions.executions_take_due(limit=100, actor="monitor")
    assert transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id="w", lease_seconds=60)
    assert transitions.execution_fail(
        execution_id=pk, attempt=1, worker_id="w", error="boom", output="", retry_in=None, max_chars=100
    )


def test_a_teams_default_rule_fires_for_a_task_another_member_created(ops):
    ann, ben, team = ops["ann"], ops["ben"], ops["team"]
    channel = notify.channel_create(
        owner=ann, team=team, data={"name": "ops", "kind": "webhook", "target": "http://127.0.0.1:9/hook"}
    )
    notify.rule_create(owner=ann, data={"channel": channel, "on_failure": True})  # the team's default
    bens_in_team = task_create(owner=ben, team=team, runner="noop", start_at=timezone.now())
    bens_own = task_create(owner=ben, runner="noop", start_at=timezone.now())
    anns_own = task_create(owner=ann, runner="noop", start_at=timezone.now())
    for task in (bens_in_team, bens_own, anns_own):
        _fail(task)
    # The trigger wrote the outbox for the team's task only (not for ann's own: the rule is the
    # team's, not ann's), and the dispatcher tells it through the team's channel.
    assert list(Outbox.objects.values_list("task_id", "kind")) == [(bens_in_team.pk, "failed")]
    dispatch.dispatch_outbox()
    assert list(Delivery.objects.values_list("task_id", "channel_id", "event")) == [
        (bens_in_team.pk, channel.pk, "failing")
    ]


def test_a_task_follows_tasks_of_its_own_team_whoever_made_them_and_moves_only_with_its_workflow(ops):
    ann, ben, team = ops["ann"], ops["ben"], ops["team"]
    ann_client, ben_client = _client(ann), _client(ben)
    # Ben's task in the shared team, and one in his personal team.
    shared = ben_client.post("/api/v1/tasks", {"runner": "noop", "team": team.slug, "interval": "1h"}, format="json")
    own = ben_client.post("/api/v1/tasks", {"runner": "noop", "interval": "1h"}, format="json")
    assert shared.status_code == own.status_code == 201
    shared_id, own_id = shared.json()["id"], own.json()["id"]

    # Ann's task in the team may follow Ben's task of the team (before teams, only her own tasks)...
    follower = ann_client.post(
        "/api/v1/tasks", {"runner": "noop", "team": team.slug, "after": [{"task": shared_id}]}, format="json"
    )
    assert follower.status_code == 201, follower.content
    follower_id = follower.json()["id"]
    # ... but not a task of another team, said as for one that does not exist, and nothing is made.
    count = Task.objects.count()
    crossing = ann_client.post(
        "/api/v1/tasks", {"runner": "noop", "team": team.slug, "after": [{"task": own_id}]}, format="json"
    )
    assert crossing.status_code == 400 and "after" in crossing.json()["errors"], crossing.content
    assert Task.objects.count() == count
    changed = ann_client.patch(f"/api/v1/tasks/{follower_id}", {"after": [{"task": own_id}]}, format="json")
    assert changed.status_code == 400 and "after" in changed.json()["errors"]
    assert ann_client.get(f"/api/v1/tasks/{follower_id}").json()["after"] == [{"task": shared_id, "on": "success"}]

    # The upstream does not leave the team while a task of the team follows it (400 on team) ...
    personal = Task.objects.get(pk=own_id).team.slug
    moved = ben_client.patch(f"/api/v1/tasks/{shared_id}", {"team": personal}, format="json")
    assert moved.status_code == 400 and follower_id in " ".join(moved.json()["errors"]["team"]), moved.content
    # ... nor the follower with links to its old team's tasks, unless the request replaces them.
    moved = ann_client.patch(f"/api/v1/tasks/{follower_id}", {"team": ann.username}, format="json")
    assert moved.status_code == 400 and "after" in moved.json()["errors"], moved.content
    assert Task.objects.get(pk=follower_id).team_id == team.pk
    moved = ann_client.patch(f"/api/v1/tasks/{follower_id}", {"team": ann.username, "after": []}, format="json")
    assert moved.status_code == 200, moved.content
    assert Task.objects.get(pk=follower_id).team.slug == ann.username
    # Nothing follows the upstream now: it moves.
    assert ben_client.patch(f"/api/v1/tasks/{shared_id}", {"team": personal}, format="json").status_code == 200


def test_the_audit_log_shows_a_team_s_task_history_to_its_members_whoever_acted(ops):
    ann, ben, team = ops["ann"], ops["ben"], ops["team"]
    outsider = get_user_model().objects.create_user("cid")
    made = _client(ann).post("/api/v1/tasks", {"runner": "noop", "team": team.slug, "interval": "1h"}, format="json")
    assert made.status_code == 201
    task_id = made.json()["id"]
    assert _client(ann).patch(f"/api/v1/tasks/{task_id}", {"name": "nightly"}, format="json").status_code == 200
    _client(ann).post("/api/v1/tasks", {"runner": "noop", "interval": "1h"}, format="json")  # ann's own task

    # Ben, her teammate, reads the shared task's history (Ann created and changed it) ...
    entries = _client(ben).get("/api/v1/audit").json()["results"]
    assert {(e["action"], e["task_id"]) for e in entries} >= {("create", task_id), ("update", task_id)}
    # ... and not Ann's personal task's; with ?team= only the team's.
    assert {e["task_id"] for e in entries if e["object_type"] == "task"} == {task_id}
    team_only = _client(ann).get(f"/api/v1/audit?team={team.slug}").json()["results"]
    assert {e["task_id"] for e in team_only} == {task_id}
    # Someone outside the team reads none of it, and naming the team is a 400 on team.
    assert [e for e in _client(outsider).get("/api/v1/audit").json()["results"] if e["task_id"] == task_id] == []
    refused = _client(outsider).get(f"/api/v1/audit?team={team.slug}")
    assert refused.status_code == 400 and "team" in refused.json()["errors"]
