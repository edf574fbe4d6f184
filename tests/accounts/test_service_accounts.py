"""Service accounts (issue 30, tokens): a team's identity for CI, made by the team's admins, holding
tokens scoped to its team; it cannot sign in, has no personal team, and deleting it revokes its
tokens."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import AccessToken, ServiceAccount
from accounts.service_accounts import service_account_create
from tasks_app.models import AuditEntry, Membership, Task, Team, TeamRole
from tasks_app.teams.services import member_remove, member_set, team_create, team_delete
from tests.conftest import client_for
from tms_core.errors import InvalidInput

pytestmark = pytest.mark.django_db

NOOP = {"runner": "noop", "interval": 3600}


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.fixture
def world(db):
    users = get_user_model().objects
    ann, ben, cat = (users.create_user(name, password=f"{name}-password") for name in ("ann", "ben", "cat"))
    ops = team_create(creator=ann, name="Ops")
    member_set(team=ops, username="ben", role=TeamRole.EDITOR)
    return {"ann": ann, "ben": ben, "cat": cat, "ops": ops, "base": f"/api/v1/teams/{ops.pk}/service-accounts"}


def create_account(client: APIClient, base: str, **body: object) -> dict:
    made = client.post(base, {"name": "deploy-ci", "role": "operator", **body}, format="json")
    assert made.status_code == 201, made.content
    return made.json()


def create_key(client: APIClient, url: str, **body: object) -> dict:
    made = client.post(url, {"name": "github actions", "scopes": ["write"], **body}, format="json")
    assert made.status_code == 201, made.content
    return made.json()


def test_an_admin_makes_a_service_account_whose_token_runs_the_teams_tasks(world):
    ann = client_for(world["ann"])
    ops_task = ann.post("/api/v1/tasks", {**NOOP, "name": "nightly", "team": "ops"}, format="json").json()["id"]
    personal_task = ann.post("/api/v1/tasks", {**NOOP, "name": "mine"}, format="json").json()["id"]

    account = create_account(ann, world["base"])
    assert (account["name"], account["role"], account["team"], account["created_by"]) == (
        "deploy-ci",
        "operator",
        world["ops"].pk,
        "ann",
    )
    assert account["username"] == "sa.ops.deploy-ci"
    user = get_user_model().objects.get(username=account["username"])
    assert not user.has_usable_password() and not user.is_staff
    assert not Team.objects.filter(personal_of=user).exists()  # no personal team
    assert AuditEntry.objects.filter(action="service_account.create", object_id=str(account["id"])).exists()
    # Listed with the team's service accounts, not among its people.
    assert [row["name"] for row in ann.get(world["base"]).json()["results"]] == ["deploy-ci"]
    members = ann.get(f"/api/v1/teams/{world['ops'].pk}/members").json()["results"]
    assert sorted(member["username"] for member in members) == ["ann", "ben"]

    tokens_url = f"{world['base']}/{account['id']}/tokens"
    made = create_key(ann, tokens_url, expires_in="30d")
    assert made["team"] == world["ops"].pk and made["key"].startswith("tms_pat_")
    assert "key" not in ann.get(tokens_url).json()["results"][0]
    ci = bearer(made["key"])

    run = ci.post(f"/api/v1/tasks/{ops_task}/trigger")
    assert run.status_code == 201, run.content
    assert ci.get(f"/api/v1/tasks/{personal_task}").status_code == 404
    assert [task["id"] for task in ci.get("/api/v1/tasks").json()["results"]] == [ops_task]
    # An operator: runs, but neither changes nor creates tasks.
    assert ci.patch(f"/api/v1/tasks/{ops_task}", {"interval": 60}, format="json").status_code == 403
    assert ci.post("/api/v1/tasks", {**NOOP, "name": "x"}, format="json").status_code == 403
    # It manages nothing: no tokens, no teams, no service accounts.
    assert ci.post("/api/v1/tokens", {"name": "x", "scopes": ["read"]}, format="json").status_code == 403
    assert ci.post("/api/v1/teams", {"name": "Mine now"}, format="json").status_code == 403
    assert ci.post(world["base"], {"name": "other", "role": "viewer"}, format="json").status_code == 403
    assert ci.post(tokens_url, {"name": "more", "scopes": ["read"]}, format="json").status_code == 403


def test_an_editor_service_account_owns_the_tasks_it_creates_in_its_team(world):
    ann = client_for(world["ann"])
    account = create_account(ann, world["base"], name="provisioner", role="editor")
    ci = bearer(create_key(ann, f"{world['base']}/{account['id']}/tokens")["key"])

    created = ci.post("/api/v1/tasks", {**NOOP, "name": "made by ci"}, format="json")

    assert created.status_code == 201, created.content
    task = Task.objects.select_related("owner").get(pk=created.json()["id"])
    assert (task.owner.username, task.team_id) == ("sa.ops.provisioner", world["ops"].pk)
    other = ci.post("/api/v1/tasks", {**NOOP, "name": "x", "team": "ann"}, format="json")
    assert other.status_code == 400 and "team" in other.json()["errors"]


def test_a_service_account_cannot_sign_in_anywhere(world, client):
    account = service_account_create(team=world["ops"], name="ci", role=TeamRole.OPERATOR, creator=world["ann"])
    user = account.user
    user.set_password("guessable-password")  # even if someone gives it one
    user.save()
    for page in ("/ui/login/", "/admin/login/"):
        response = client.post(page, {"username": user.username, "password": "guessable-password"})
        assert response.status_code == 200, page  # the form again, with its error: no session
        assert "_auth_user_id" not in client.session
    # A person signs in as before.
    assert client.post("/ui/login/", {"username": "ann", "password": "ann-password"}).status_code == 302
    assert "_auth_user_id" in client.session


def test_deleting_a_service_account_revokes_its_tokens_and_is_audited(world):
    ann = client_for(world["ann"])
    account = create_account(ann, world["base"])
    url = f"{world['base']}/{account['id']}"
    keep = create_key(ann, f"{url}/tokens", name="one")
    revoked = create_key(ann, f"{url}/tokens", name="two")
    assert ann.delete(f"{url}/tokens/{revoked['id']}").status_code == 204
    refused = bearer(revoked["key"]).get("/api/v1/tasks")
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
    assert bearer(keep["key"]).get("/api/v1/tasks").status_code == 200

    assert ann.delete(url).status_code == 204

    assert bearer(keep["key"]).get("/api/v1/tasks").status_code == 401
    assert not AccessToken.objects.filter(user__username=account["username"], revoked_at__isnull=True).exists()
    assert not Membership.objects.filter(user__username=account["username"]).exists()
    assert ann.get(url).status_code == 404 and ann.get(world["base"]).json()["results"] == []
    entry = AuditEntry.objects.get(action="service_account.delete")
    assert sorted(entry.changes["tokens_revoked"]) == [keep["id"]]  # the other was revoked already
    assert ann.delete(url).status_code == 404
    # The name is free again; the new account is another user.
    again = create_account(ann, world["base"])
    assert again["username"] == "sa.ops.deploy-ci-2"


def test_only_admins_manage_service_accounts_and_non_members_see_nothing(world):
    ann, ben, cat = (client_for(world[name]) for name in ("ann", "ben", "cat"))
    account = create_account(ann, world["base"])
    url = f"{world['base']}/{account['id']}"

    refused = ben.post(world["base"], {"name": "x", "role": "viewer"}, format="json")
    assert refused.status_code == 403 and "editor" in refused.json()["detail"]
    assert ben.get(world["base"]).status_code == 200  # members read the list
    assert ben.delete(url).status_code == 403
    assert ben.get(f"{url}/tokens").status_code == 403
    assert ben.post(f"{url}/tokens", {"name": "x", "scopes": ["read"]}, format="json").status_code == 403
    for path in (world["base"], url, f"{url}/tokens"):
        assert cat.get(path).status_code == 404, path
    assert cat.post(world["base"], {"name": "x", "role": "viewer"}, format="json").status_code == 404
    assert ServiceAccount.objects.count() == 1


def test_an_admins_personal_token_may_not_make_keys(world):
    ann = client_for(world["ann"])
    account = create_account(ann, world["base"])
    pat = ann.post("/api/v1/tokens", {"name": "mine", "scopes": ["write"]}, format="json").json()["key"]
    refused = bearer(pat).post(f"{world['base']}/{account['id']}/tokens", {"name": "x", "scopes": ["read"]})
    assert refused.status_code == 403


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"role": "operator"}, "name"),
        ({"name": "", "role": "operator"}, "name"),
        ({"name": "a/b", "role": "operator"}, "name"),
        ({"name": "x" * 101, "role": "operator"}, "name"),
        ({"name": 5, "role": "operator"}, "name"),
        ({"name": "deploy-ci", "role": "operator"}, "name"),  # taken
        ({"name": "ci"}, "role"),
        ({"name": "ci", "role": "admin"}, "role"),
        ({"name": "ci", "role": "boss"}, "role"),
        ({"name": "ci", "role": "viewer", "username": "x"}, "username"),
    ],
)
def test_bad_input_is_a_400_on_the_field(world, body, field):
    ann = client_for(world["ann"])
    create_account(ann, world["base"])
    refused = ann.post(world["base"], body, format="json")
    assert refused.status_code == 400, refused.content
    assert field in refused.json()["errors"]
    assert ServiceAccount.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"scopes": ["write"]}, "name"),
        ({"name": "x", "scopes": []}, "scopes"),
        ({"name": "x", "scopes": ["admin"]}, "scopes"),
        ({"name": "x", "scopes": ["read"], "team": "ann"}, "team"),
        ({"name": "x", "scopes": ["read"], "expires_in": "soon"}, "expires_in"),
    ],
)
def test_bad_token_input_is_a_400_on_the_field(world, body, field):
    ann = client_for(world["ann"])
    account = create_account(ann, world["base"])
    refused = ann.post(f"{world['base']}/{account['id']}/tokens", body, format="json")
    assert refused.status_code == 400, refused.content
    assert field in refused.json()["errors"]
    assert not AccessToken.objects.exists()


def test_a_personal_team_has_no_service_accounts(world):
    ann = client_for(world["ann"])
    personal = Team.objects.get(personal_of=world["ann"])
    refused = ann.post(f"/api/v1/teams/{personal.pk}/service-accounts", {"name": "ci", "role": "viewer"})
    assert refused.status_code == 400 and "team" in refused.json()["errors"]


def test_the_member_services_leave_service_accounts_alone(world):
    account = service_account_create(team=world["ops"], name="ci", role=TeamRole.VIEWER, creator=world["ann"])
    other = team_create(creator=world["ann"], name="Other")
    with pytest.raises(InvalidInput) as raised:
        member_set(team=other, username=account.user.username, role=TeamRole.ADMIN)
    assert "username" in raised.value.errors
    with pytest.raises(InvalidInput):
        member_set(team=world["ops"], username=account.user.username, role=TeamRole.ADMIN)
    with pytest.raises(InvalidInput):
        member_remove(team=world["ops"], username=account.user.username)
    ann = client_for(world["ann"])
    assert ann.get(f"/api/v1/teams/{world['ops'].pk}/members/{account.user.username}").status_code == 404
    # A team with a service account is not deleted until the account is.
    empty = team_create(creator=world["ann"], name="Empty")
    service_account_create(team=empty, name="ci", role=TeamRole.VIEWER, creator=world["ann"])
    with pytest.raises(InvalidInput) as raised:
        team_delete(team=empty)
    assert "service account" in str(raised.value.errors["team"])


def test_an_expired_service_account_token_is_refused(world):
    ann = client_for(world["ann"])
    account = create_account(ann, world["base"])
    made = create_key(ann, f"{world['base']}/{account['id']}/tokens")
    AccessToken.objects.filter(pk=made["id"]).update(expires_at=timezone.now() - timedelta(minutes=1))
    refused = bearer(made["key"]).get("/api/v1/tasks")
    assert refused.status_code == 401 and "expired" in refused.json()["detail"]


def test_a_service_account_is_never_linked_to_single_sign_on(world):
    from django.core.exceptions import ValidationError

    from accounts.models import OidcIdentity

    account = service_account_create(team=world["ops"], name="ci", role=TeamRole.VIEWER, creator=world["ann"])
    with pytest.raises(ValidationError):
        OidcIdentity.objects.create(user=account.user, issuer="https://idp.example.com", subject="ci")
    assert not OidcIdentity.objects.exists()
    OidcIdentity.objects.create(user=world["ann"], issuer="https://idp.example.com", subject="ann")


def test_the_admin_lists_service_accounts_and_token_teams_and_deletes_through_the_service(world, admin_client):
    ann = client_for(world["ann"])
    account = create_account(ann, world["base"])
    made = create_key(ann, f"{world['base']}/{account['id']}/tokens")

    listed = admin_client.get("/admin/accounts/serviceaccount/")
    assert listed.status_code == 200 and b"deploy-ci" in listed.content and b"operator" in listed.content
    tokens = admin_client.get("/admin/accounts/accesstoken/")
    assert tokens.status_code == 200 and b"column-team" in tokens.content
    assert f">{world['ops']}<".encode() in tokens.content
    assert admin_client.get("/admin/accounts/serviceaccount/add/").status_code == 403
    assert admin_client.get(f"/admin/accounts/serviceaccount/{account['id']}/delete/").status_code == 403

    response = admin_client.post(
        "/admin/accounts/serviceaccount/",
        {"action": "delete_accounts", "_selected_action": [account["id"]]},
        follow=True,
    )

    assert response.status_code == 200 and b"1 service account(s) deleted" in response.content
    assert ServiceAccount.objects.get(pk=account["id"]).deleted_at is not None
    assert bearer(made["key"]).get("/api/v1/tasks").status_code == 401
    assert AuditEntry.objects.filter(action="service_account.delete").count() == 1


def test_tms_create_user_gives_a_service_account_neither_a_key_nor_a_password(world):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from accounts.models import AccountKey

    account = service_account_create(team=world["ops"], name="ci", role=TeamRole.VIEWER, creator=world["ann"])
    for extra in ([], ["--password", "A-long-enough-passw0rd!"], ["--staff"]):
        with pytest.raises(CommandError, match="is a service account"):
            call_command("tms_create_user", account.user.username, *extra)
    account.user.refresh_from_db()
    assert not AccountKey.objects.filter(user=account.user).exists()
    assert not account.user.has_usable_password() and not account.user.is_staff


def test_a_service_account_counts_in_its_team_where_a_user_counts_in_their_personal_team(world):
    """What counts per user (a channel's send rate, the per-user quota form) counts for a service
    account in its team: it has no personal team, and none is made for it."""
    from tasks_app.quotas import personal_team_id
    from tasks_app.teams.services import personal_team_of

    account = service_account_create(team=world["ops"], name="ci", role=TeamRole.EDITOR, creator=world["ann"])
    assert personal_team_of(account.user) == world["ops"]
    assert personal_team_id(account.user_id) == world["ops"].pk
    assert not Team.objects.filter(personal_of=account.user).exists()
