"""What a personal access token may make that outlives it (security audit round 3, item 7): a
trigger URL and a membership below admin, recorded as the token's, listed and removed on the
token; never the team admin role."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.tokens import token_create
from tasks_api.creation import task_create
from tasks_app.models import Membership, TaskHook
from tasks_app.teams.services import team_create
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(django_user_model):
    ann = django_user_model.objects.create_user(username="ann", password="ann-password-1")
    django_user_model.objects.create_user(username="bob")
    django_user_model.objects.create_user(username="cid")
    ops = team_create(creator=ann, name="Ops")
    task = task_create(owner=ann, team=ops, runner="noop", start_at=timezone.now() + timedelta(days=1))
    token, key = token_create(
        user=ann, name="one hour", scopes=["write"], expires_at=timezone.now() + timedelta(hours=1)
    )
    with_token = APIClient()
    with_token.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return {"ann": ann, "ops": ops, "task": task, "token": token, "with_token": with_token}


def test_a_token_cannot_grant_the_team_admin_role_and_a_session_or_account_key_can(world):
    ops, with_token = world["ops"], world["with_token"]
    members = f"/api/v1/teams/{ops.pk}/members"
    refused = with_token.post(members, {"username": "bob", "role": "admin"}, format="json")
    assert refused.status_code == 403, refused.content
    assert "cannot grant the team admin role" in refused.json()["detail"]
    assert not Membership.objects.filter(team=ops, user__username="bob").exists()
    # Nor by promoting a member it added.
    assert with_token.post(members, {"username": "bob", "role": "editor"}, format="json").status_code == 201
    assert with_token.patch(f"{members}/bob", {"role": "admin"}, format="json").status_code == 403
    assert Membership.objects.get(team=ops, user__username="bob").role == "editor"
    # The account key (and a session) still may.
    assert client_for(world["ann"]).patch(f"{members}/bob", {"role": "admin"}, format="json").status_code == 200


def test_what_a_revoked_token_made_is_listed_on_it_and_removed_with_one_call(world):
    ops, task, token, with_token = world["ops"], world["task"], world["token"], world["with_token"]
    made = with_token.post(f"/api/v1/tasks/{task.pk}/trigger-url")
    assert made.status_code == 201, made.content
    assert (
        with_token.post(
            f"/api/v1/teams/{ops.pk}/members", {"username": "cid", "role": "operator"}, format="json"
        ).status_code
        == 201
    )
    owner = client_for(world["ann"])
    assert owner.delete(f"/api/v1/tokens/{token.pk}").status_code == 204
    assert with_token.get("/api/v1/tasks").status_code == 401

    # Both outlive the token, and the token lists them.
    assert TaskHook.objects.filter(task=task).exists()
    assert Membership.objects.filter(team=ops, user__username="cid").exists()
    listed = owner.get(f"/api/v1/tokens/{token.pk}/made")
    assert listed.status_code == 200, listed.content
    body = listed.json()
    assert [hook["task"] for hook in body["trigger_urls"]] == [str(task.pk)]
    assert [(m["team_slug"], m["username"], m["role"]) for m in body["memberships"]] == [(ops.slug, "cid", "operator")]

    removed = owner.post(f"/api/v1/tokens/{token.pk}/made/revoke")
    assert removed.status_code == 200, removed.content
    assert removed.json() == {"trigger_urls": 1, "memberships": 1, "kept": []}
    assert not TaskHook.objects.filter(task=task).exists()
    assert not Membership.objects.filter(team=ops, user__username="cid").exists()
    assert APIClient().post(f"/hooks/v1/{made.json()['id']}", data={}, format="json").status_code == 404
    assert owner.get(f"/api/v1/tokens/{token.pk}/made").json() == {"trigger_urls": [], "memberships": []}


def test_made_by_a_session_is_no_tokens_and_another_users_token_is_not_found(world, django_user_model):
    task, token = world["task"], world["token"]
    owner = client_for(world["ann"])
    assert owner.post(f"/api/v1/tasks/{task.pk}/trigger-url").status_code == 201  # an account key: no token's
    assert TaskHook.objects.get(task=task).created_by_token is None
    assert owner.get(f"/api/v1/tokens/{token.pk}/made").json() == {"trigger_urls": [], "memberships": []}
    # A rotation through the token makes the new secret the token's.
    assert world["with_token"].post(f"/api/v1/tasks/{task.pk}/trigger-url").status_code == 200
    assert TaskHook.objects.get(task=task).created_by_token == token.pk
    other = client_for(django_user_model.objects.get(username="bob"))
    assert other.get(f"/api/v1/tokens/{token.pk}/made").status_code == 404
    assert other.post(f"/api/v1/tokens/{token.pk}/made/revoke").status_code == 404
    assert TaskHook.objects.filter(task=task).exists()


def test_the_token_page_lists_what_a_token_made_and_removes_it(world):
    ops, task, with_token = world["ops"], world["task"], world["with_token"]
    assert with_token.post(f"/api/v1/tasks/{task.pk}/trigger-url").status_code == 201
    assert (
        with_token.post(
            f"/api/v1/teams/{ops.pk}/members", {"username": "cid", "role": "viewer"}, format="json"
        ).status_code
        == 201
    )
    page = Client()
    page.force_login(world["ann"])
    listing = page.get("/ui/tokens/").content.decode()
    assert f'id="token-made-{world["token"].pk}"' in listing
    assert "cid as viewer in" in listing and "trigger URL of" in listing
    assert "a token cannot grant the admin role" in listing
    done = page.post(f"/ui/tokens/{world['token'].pk}/made/revoke/", follow=True)
    assert done.status_code == 200 and "1 trigger URL(s), 1 membership(s)" in done.content.decode()
    assert not TaskHook.objects.filter(task=task).exists()
    assert not Membership.objects.filter(team=ops, user__username="cid").exists()
