"""The back office's service accounts (issue 30, tokens): listed on the team's page, made and deleted
by its admins there, their tokens made (the key shown once) and revoked on each account's page,
through the API's services; the tokens page shows each token's team and scopes a new one."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from accounts.models import AccessToken, ServiceAccount
from accounts.service_accounts import service_account_create
from tasks_app.models import AuditEntry, Team
from tasks_app.teams.services import member_set, team_create

pytestmark = pytest.mark.django_db


def _key(content: bytes) -> str:
    match = re.search(rb'id="new-key-value"[^>]*value="(tms_pat_[^"]+)"', content)
    assert match, content[:2000]
    return match.group(1).decode()


@pytest.fixture
def ops(db, user):
    """Alice's team "ops" with Bob as an editor."""
    team = team_create(creator=user, name="Ops")
    get_user_model().objects.create_user("bob")
    member_set(team=team, username="bob", role="editor")
    return team


def test_an_admin_makes_a_service_account_and_its_token_on_the_pages(alice_client, ops):
    page = alice_client.get(f"/ui/teams/{ops.pk}/").content.decode()
    assert 'id="service-accounts"' in page and 'id="add-service-account-form"' in page
    assert '<label class="field" for="id_name">' in page and "<h2>Service accounts</h2>" in page

    made = alice_client.post(f"/ui/teams/{ops.pk}/service-accounts/", {"name": "deploy-ci", "role": "operator"})

    account = ServiceAccount.objects.get()
    assert made.status_code == 302 and made.url == f"/ui/teams/{ops.pk}/service-accounts/{account.pk}/"
    team_page = alice_client.get(f"/ui/teams/{ops.pk}/").content.decode()
    assert f'id="service-account-{account.pk}"' in team_page
    assert 'id="member-sa.ops.deploy-ci"' not in team_page  # not among the people
    created = alice_client.post(
        f"/ui/teams/{ops.pk}/service-accounts/{account.pk}/tokens/",
        {"name": "github", "scopes": "write", "expires_in": "30d"},
    )
    assert created.status_code == 201
    key = _key(created.content)
    token = AccessToken.objects.get()
    assert (token.user_id, token.team_id) == (account.user_id, ops.pk)
    assert key.encode() not in alice_client.get(f"/ui/teams/{ops.pk}/service-accounts/{account.pk}/").content
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert api.get("/api/v1/tasks").status_code == 200

    revoked = alice_client.post(f"/ui/teams/{ops.pk}/service-accounts/{account.pk}/tokens/{token.pk}/revoke/")
    assert revoked.status_code == 302 and api.get("/api/v1/tasks").status_code == 401
    deleted = alice_client.post(f"/ui/teams/{ops.pk}/service-accounts/{account.pk}/delete/")
    assert deleted.status_code == 302 and ServiceAccount.objects.get().deleted_at is not None
    assert AuditEntry.objects.get(action="service_account.delete").source == "backoffice"


def test_bad_input_stays_on_the_form(alice_client, ops):
    for body, text in (
        ({"name": "", "role": "operator"}, "required"),
        ({"name": "x", "role": "admin"}, "valid choice"),
        ({"name": "a/b", "role": "viewer"}, "letters, digits"),
    ):
        refused = alice_client.post(f"/ui/teams/{ops.pk}/service-accounts/", body)
        assert refused.status_code == 400 and text in refused.content.decode(), body
    account = service_account_create(team=ops, name="ci", role="viewer", creator=None)
    taken = alice_client.post(f"/ui/teams/{ops.pk}/service-accounts/", {"name": "ci", "role": "viewer"})
    assert taken.status_code == 400 and "already has a service account" in taken.content.decode()
    bad_token = alice_client.post(
        f"/ui/teams/{ops.pk}/service-accounts/{account.pk}/tokens/", {"name": "", "scopes": "read", "expires_in": "7d"}
    )
    assert bad_token.status_code == 400 and not AccessToken.objects.exists()


def test_a_member_who_is_not_admin_sees_the_accounts_and_has_no_buttons(client, ops):
    account = service_account_create(team=ops, name="ci", role="viewer", creator=None)
    client.force_login(get_user_model().objects.get(username="bob"))
    page = client.get(f"/ui/teams/{ops.pk}/").content.decode()
    assert f'id="service-account-{account.pk}"' in page
    assert 'id="add-service-account-form"' not in page and "service-accounts/" not in page
    base = f"/ui/teams/{ops.pk}/service-accounts"
    assert client.post(f"{base}/", {"name": "x", "role": "viewer"}).status_code == 403
    assert client.get(f"{base}/{account.pk}/").status_code == 403
    assert client.post(f"{base}/{account.pk}/delete/").status_code == 403
    assert client.post(f"{base}/{account.pk}/tokens/", {"name": "x", "scopes": "read"}).status_code == 403
    client.force_login(get_user_model().objects.create_user("eve"))
    assert client.get(f"{base}/{account.pk}/").status_code == 404
    assert client.post(f"{base}/{account.pk}/delete/").status_code == 404
    assert ServiceAccount.objects.get().deleted_at is None


def test_the_tokens_page_scopes_a_token_to_a_team_and_shows_it(alice_client, user, ops):
    page = alice_client.get("/ui/tokens/").content.decode()
    assert '<option value="ops">Ops</option>' in page and "<th>Team</th>" in page
    body = {"name": "ops ci", "scopes": "write", "team": "ops", "expires_in": "7d"}
    made = alice_client.post("/ui/tokens/new/", body)
    assert made.status_code == 201
    assert AccessToken.objects.get().team_id == ops.pk
    assert f'href="/ui/teams/{ops.pk}/"' in alice_client.get("/ui/tokens/").content.decode()
    other = team_create(creator=get_user_model().objects.get(username="bob"), name="Bobs")
    refused = alice_client.post("/ui/tokens/new/", {**body, "team": other.slug})
    assert refused.status_code == 400 and AccessToken.objects.count() == 1
    assert Team.objects.filter(pk=other.pk).exists()
