"""The back office's teams (issue 30): the teams page, a team's members page (admins manage them
through the API's services) and the team switcher of the task and execution lists and of the
dashboard."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from tasks_api.creation import task_create
from tasks_app.models import Membership, Team
from tasks_app.teams.services import member_set, team_create
from tests.backoffice.helpers import run
from tests.factories import ExecutionFactory


@pytest.fixture
def ops(db, user):
    """Alice's team "ops" with Bob as a viewer."""
    team = team_create(creator=user, name="Ops")
    get_user_model().objects.create_user("bob")
    member_set(team=team, username="bob", role="viewer")
    return team


def test_the_teams_page_lists_them_and_makes_one(alice_client, ops):
    page = alice_client.get("/ui/teams/").content.decode()
    assert f'id="team-{ops.pk}"' in page and "personal" in page
    made = alice_client.post("/ui/teams/new/", {"name": "Data", "slug": ""})
    team = Team.objects.get(slug="data")
    assert made.status_code == 302 and made.url == f"/ui/teams/{team.pk}/"
    assert Membership.objects.get(team=team).role == "admin"
    taken = alice_client.post("/ui/teams/new/", {"name": "Again", "slug": "data"})
    assert taken.status_code == 400 and "is taken" in taken.content.decode()


def test_an_admin_manages_members_and_the_last_admin_stays(alice_client, ops):
    page = alice_client.get(f"/ui/teams/{ops.pk}/").content.decode()
    assert 'id="member-bob"' in page and 'id="add-member-form"' in page
    get_user_model().objects.create_user("cat")
    assert alice_client.post(f"/ui/teams/{ops.pk}/members/", {"username": "cat", "role": "operator"}).status_code == 302
    assert alice_client.post(f"/ui/teams/{ops.pk}/members/", {"username": "bob", "role": "editor"}).status_code == 302
    roles = dict(Membership.objects.filter(team=ops).values_list("user__username", "role"))
    assert roles == {"alice": "admin", "bob": "editor", "cat": "operator"}
    nobody = alice_client.post(f"/ui/teams/{ops.pk}/members/", {"username": "nobody", "role": "viewer"})
    assert nobody.status_code == 400 and "No active user" in nobody.content.decode()
    demoted = alice_client.post(f"/ui/teams/{ops.pk}/members/", {"username": "alice", "role": "viewer"})
    assert demoted.status_code == 400 and "last admin" in demoted.content.decode()
    kept = alice_client.post(f"/ui/teams/{ops.pk}/members/alice/remove/", follow=True)
    assert "last admin" in kept.content.decode() and Membership.objects.filter(team=ops, role="admin").exists()
    assert alice_client.post(f"/ui/teams/{ops.pk}/members/cat/remove/").status_code == 302
    assert alice_client.post(f"/ui/teams/{ops.pk}/rename/", {"name": "Operations"}).status_code == 302
    assert Team.objects.get(pk=ops.pk).name == "Operations"


def test_a_viewer_sees_the_members_and_changes_nothing_and_an_outsider_sees_no_team(client, ops):
    bob = get_user_model().objects.get(username="bob")
    client.force_login(bob)
    page = client.get(f"/ui/teams/{ops.pk}/").content.decode()
    assert 'id="member-alice"' in page and 'id="read-only"' in page and 'id="add-member-form"' not in page
    assert client.post(f"/ui/teams/{ops.pk}/members/", {"username": "bob", "role": "admin"}).status_code == 403
    assert client.post(f"/ui/teams/{ops.pk}/rename/", {"name": "Mine"}).status_code == 403
    assert client.post(f"/ui/teams/{ops.pk}/delete/").status_code == 403
    client.force_login(get_user_model().objects.create_user("eve"))
    assert client.get(f"/ui/teams/{ops.pk}/").status_code == 404
    assert client.post(f"/ui/teams/{ops.pk}/members/", {"username": "eve", "role": "admin"}).status_code == 404


def test_the_switcher_narrows_the_task_and_execution_lists_to_one_team(alice_client, user, ops):
    shared = task_create(owner=user, team=ops, runner="noop", name="shared one")
    own = task_create(owner=user, runner="noop", name="own one")
    ExecutionFactory(task=shared, status="SUCCEEDED")
    ExecutionFactory(task=own, status="SUCCEEDED")
    everything = alice_client.get("/ui/tasks/").content.decode()
    assert "shared one" in everything and "own one" in everything
    # The rows (the form's "runs after" pickers suggest every task name of one's teams).
    narrowed = alice_client.get("/ui/tasks/", {"team": "ops"})
    assert [row["task"].name for row in narrowed.context["rows"]] == ["shared one"]
    runs = alice_client.get("/ui/executions/", {"team": "ops"})
    assert [row["execution"].task_id for row in runs.context["rows"]] == [shared.pk]
    refused = alice_client.get("/ui/tasks/", {"team": "nope"})
    assert refused.status_code == 400 and "No team" in refused.content.decode()


def _runs_tile(page) -> int:
    match = re.search(r'id="tile-runs">(\d+)<', page.content.decode())
    assert match, page.content[:300]
    return int(match.group(1))


def test_the_dashboard_shows_a_teams_runs_to_its_members_and_the_switcher_narrows_it(client, user, ops):
    """Alice makes a task in "ops" and one in her personal team. Bob, a viewer in ops, sees the
    ops task's runs on his dashboard (before teams it counted only tasks one made); Eve, in no
    team of Alice's, sees none; ?team= narrows to one of one's teams, and another is a 400."""
    shared = task_create(owner=user, team=ops, runner="noop", name="shared one")
    own = task_create(owner=user, runner="noop", name="own one")
    run(shared)
    run(shared, outcome="fail")
    run(own)
    bob = get_user_model().objects.get(username="bob")
    client.force_login(bob)
    page = client.get("/")
    assert page.status_code == 200 and _runs_tile(page) == 2
    assert [t.name for t in page.context["s"].top_failing_tasks] == ["shared one"]
    assert 'id="team-switch"' in page.content.decode() and page.context["team"] == ""
    assert _runs_tile(client.get("/", {"team": "ops"})) == 2
    # Alice's personal team is not Bob's: said so, a 400, and the figures stay his teams'.
    refused = client.get("/", {"team": user.personal_team.slug})
    assert refused.status_code == 400 and "No team" in refused.content.decode() and _runs_tile(refused) == 2
    live = client.get("/ui/dashboard/live", {"team": "ops", "window": "1h"})
    assert live.status_code == 200 and _runs_tile(live) == 2
    assert "window=24h&amp;team=ops" in live.content.decode()  # the span links keep the team
    assert client.get("/ui/dashboard/live", {"team": user.personal_team.slug}).status_code == 400

    client.force_login(get_user_model().objects.create_user("eve"))
    assert _runs_tile(client.get("/")) == 0
    assert client.get("/", {"team": "ops"}).status_code == 400

    client.force_login(user)
    assert _runs_tile(client.get("/")) == 3
    narrowed = client.get("/", {"team": "ops"})
    assert _runs_tile(narrowed) == 2 and narrowed.context["team"] == "ops"
    assert 'data-refresh-url="/ui/dashboard/live?window=24h&amp;team=ops"' in narrowed.content.decode()
    mine = client.get("/", {"team": user.personal_team.slug})
    assert _runs_tile(mine) == 1 and [t.name for t in mine.context["s"].top_failing_tasks] == []
