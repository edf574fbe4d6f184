"""The back office's API tokens page: create (the key shown once), list, revoke, as the API does."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from accounts.models import AccessToken
from tasks_app.models import AuditEntry

pytestmark = pytest.mark.django_db


def _key(content: bytes) -> str:
    match = re.search(rb'id="new-key-value"[^>]*value="(tms_pat_[^"]+)"', content)
    assert match, content[:2000]
    return match.group(1).decode()


def test_a_token_made_on_the_page_works_and_its_key_is_never_shown_again(alice_client, user):
    made = alice_client.post("/ui/tokens/new/", {"name": "CI deploys", "scopes": "read", "expires_in": "30d"})

    assert made.status_code == 201
    key = _key(made.content)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert api.get("/api/v1/tasks").status_code == 200
    assert api.post("/api/v1/tasks", {"runner": "noop"}, format="json").status_code == 403  # read only
    listing = alice_client.get("/ui/tokens/")
    assert b"CI deploys" in listing.content and key.encode() not in listing.content
    token = AccessToken.objects.get()
    assert token.user_id == user.pk and token.scopes == ["read"]
    assert AuditEntry.objects.get(action="token.create").source == "backoffice"


def test_bad_input_stays_on_the_form_with_the_apis_message(alice_client):
    response = alice_client.post("/ui/tokens/new/", {"name": "", "expires_in": "30d"})

    assert response.status_code == 400
    assert b"This field is required." in response.content
    assert AccessToken.objects.count() == 0


def test_revoke_from_the_page_stops_the_key(alice_client):
    key = _key(alice_client.post("/ui/tokens/new/", {"name": "x", "scopes": "write", "expires_in": "7d"}).content)
    token = AccessToken.objects.get()

    response = alice_client.post(f"/ui/tokens/{token.pk}/revoke/", follow=True)

    assert b"Token x revoked" in response.content and b"status-revoked" in response.content
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert api.get("/api/v1/tasks").status_code == 401


def test_another_users_token_cannot_be_revoked_or_seen(alice_client, other_user):
    from accounts.tokens import token_create

    theirs, _ = token_create(user=other_user, name="bobs", scopes=["read"], expires_at=None)

    assert alice_client.post(f"/ui/tokens/{theirs.pk}/revoke/").status_code == 404
    assert b"bobs" not in alice_client.get("/ui/tokens/").content
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
