"""Personal access tokens (/api/v1/tokens) through real authentication headers."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import AccessToken
from tasks_app.models import AuditEntry, Task
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

NOOP = {"runner": "noop", "interval": 3600}


def bearer(key: str, scheme: str = "Bearer") -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {key}")
    return client


def create(client: APIClient, **body: object) -> dict:
    response = client.post("/api/v1/tokens", {"name": "ci", "scopes": ["write"], **body}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_a_new_token_shows_its_key_once_and_stores_only_a_digest(user):
    account = client_for(user)

    made = create(account, name="CI deploys", scopes=["write"], expires_in="30d")

    key = made["key"]
    assert re.fullmatch(r"tms_pat_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", key)
    assert made["prefix"] == key[: len("tms_pat_") + 13] and made["scopes"] == ["read", "write"]
    assert made["active"] is True
    expires = timezone.datetime.fromisoformat(made["expires_at"])
    assert abs(expires - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    row = AccessToken.objects.get()
    assert key not in (row.digest, row.lookup) and len(row.digest) == 64
    listed = account.get("/api/v1/tokens").json()["results"]
    assert [entry["name"] for entry in listed] == ["CI deploys"] and "key" not in listed[0]
    assert "key" not in account.get(f"/api/v1/tokens/{made['id']}").json()
    entry = AuditEntry.objects.get(action="token.create")
    assert entry.owner_id == user.pk and key not in str(entry.changes)


@pytest.mark.parametrize("scheme", ["Bearer", "Token", "bearer"])
def test_the_key_authenticates_as_its_user_by_either_scheme(user, scheme):
    key = create(client_for(user))["key"]

    response = bearer(key, scheme).post("/api/v1/tasks", NOOP, format="json")

    assert response.status_code == 201, response.content
    assert Task.objects.get().owner_id == user.pk
    assert AccessToken.objects.get().last_used_at is not None


def test_a_read_token_reads_and_may_change_nothing(user):
    key = create(client_for(user), scopes=["read"])["key"]
    reader = bearer(key)

    assert reader.get("/api/v1/tasks").status_code == 200
    refused = reader.post("/api/v1/tasks", NOOP, format="json")

    assert refused.status_code == 403
    assert "may only read" in refused.json()["detail"]
    assert Task.objects.count() == 0


def test_a_read_token_is_refused_every_write_on_every_api_route(user, other_user):
    """Walks every route under /api/v1/ (views with permission classes of their own included):
    no write answers 2xx to a read-only token."""
    key = create(client_for(user), scopes=["read"])["key"]
    reader = bearer(key)
    mine = client_for(user).post("/api/v1/tasks", NOOP, format="json").json()["id"]
    tried = 0
    for route in _api_routes():
        path = "/api/v1/" + re.sub(r"<[^>]+>|\(\?P<[^>]+>[^)]*\)", mine, route)
        for method in ("post", "put", "patch", "delete"):
            response = getattr(reader, method)(path, {}, format="json")
            tried += 1
            assert not 200 <= response.status_code < 300, (method, path, response.status_code)
    assert tried > 60
    assert Task.objects.count() == 1


def _api_routes() -> list[str]:
    (api,) = [p for p in get_resolver().url_patterns if isinstance(p, URLResolver) and str(p.pattern) == "api/v1/"]
    routes = []
    for pattern in api.url_patterns:
        assert isinstance(pattern, URLPattern)
        text = str(pattern.pattern).lstrip("^").rstrip("$").replace("/?", "").replace("\\.(?P<format>[a-z0-9]+)", "")
        if "format" not in text:
            routes.append(text)
    return routes


def test_a_revoked_token_stops_at_once_and_the_revoke_is_audited(user):
    account = client_for(user)
    made = create(account)
    holder = bearer(made["key"])
    assert holder.get("/api/v1/tasks").status_code == 200

    assert account.delete(f"/api/v1/tokens/{made['id']}").status_code == 204

    refused = holder.get("/api/v1/tasks")
    assert refused.status_code == 401 and refused.json()["detail"] == "This token was revoked."
    assert account.get(f"/api/v1/tokens/{made['id']}").json()["active"] is False
    assert AuditEntry.objects.filter(action="token.revoke", object_id=str(made["id"])).count() == 1
    # A second revoke changes nothing and records nothing.
    assert account.delete(f"/api/v1/tokens/{made['id']}").status_code == 204
    assert AuditEntry.objects.filter(action="token.revoke").count() == 1


def test_an_expired_token_says_so(user):
    made = create(client_for(user), expires_in="2m")
    AccessToken.objects.filter(pk=made["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))

    refused = bearer(made["key"]).get("/api/v1/tasks")

    assert refused.status_code == 401 and refused.json()["detail"].startswith("This token expired at ")


def test_a_wrong_secret_or_unknown_lookup_is_refused_alike(user):
    key = create(client_for(user))["key"]
    lookup_kept = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    unknown = "tms_pat_000000000000_" + key.rsplit("_", 1)[1]

    answers = {bearer(k).get("/api/v1/tasks").json()["detail"] for k in (lookup_kept, unknown, "tms_pat_")}

    assert answers == {"Invalid token."}


def test_a_token_cannot_create_tokens(user):
    key = create(client_for(user))["key"]

    refused = bearer(key).post("/api/v1/tokens", {"name": "longer", "scopes": ["write"]}, format="json")

    assert refused.status_code == 403 and "cannot create tokens" in refused.json()["detail"]
    assert AccessToken.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "scopes": []}, "scopes"),
        ({"name": "x", "scopes": ["admin"]}, "scopes"),
        ({"name": "", "scopes": ["read"]}, "name"),
        ({"scopes": ["read"]}, "name"),
        ({"name": "x", "scopes": ["read"], "expires_in": "1h", "expires_at": "2030-01-01T00:00:00Z"}, "expires_in"),
        ({"name": "x", "scopes": ["read"], "expires_at": "2020-01-01T00:00:00Z"}, "expires_at"),
        ({"name": "x", "scopes": ["read"], "expires_in": "400d"}, "expires_at"),
        ({"name": "x", "scopes": ["read"], "expires_at": None}, "expires_at"),
        ({"name": "x", "scopes": ["read"], "expires_in": "5s"}, "expires_in"),
        ({"name": "x", "scopes": ["read"], "key": "tms_pat_mine"}, "key"),
        ({"name": "x", "scopes": ["read"], "user": 1}, "user"),
    ],
)
def test_bad_input_is_a_400_on_the_field_and_creates_nothing(user, body, field):
    response = client_for(user).post("/api/v1/tokens", body, format="json")

    assert response.status_code == 400 and field in response.json()["errors"], response.content
    assert AccessToken.objects.count() == 0


def test_tokens_that_never_expire_only_where_the_operator_allows(user, settings):
    settings.TMS = {**settings.TMS, "ACCESS_TOKEN_MAX_AGE": 0}

    made = create(client_for(user), expires_at=None)

    assert made["expires_at"] is None
    assert bearer(made["key"]).get("/api/v1/tasks").status_code == 200


def test_another_users_tokens_are_not_found(user, other_user, staff_user):
    made = create(client_for(user))

    for stranger in (client_for(other_user), client_for(staff_user)):
        assert stranger.get(f"/api/v1/tokens/{made['id']}").status_code == 404
        assert stranger.delete(f"/api/v1/tokens/{made['id']}").status_code == 404
        assert stranger.get("/api/v1/tokens").json()["results"] == []
    assert bearer(made["key"]).get("/api/v1/tasks").status_code == 200


def test_an_inactive_users_token_stops_working(user):
    key = create(client_for(user))["key"]
    user.is_active = False
    user.save()

    assert bearer(key).get("/api/v1/tasks").status_code == 401


def test_the_admin_revokes_through_the_same_service(user, admin_client):
    made = create(client_for(user))

    response = admin_client.post(
        "/admin/accounts/accesstoken/", {"action": "revoke_selected", "_selected_action": [made["id"]]}, follow=True
    )

    assert response.status_code == 200 and b"1 token(s) revoked" in response.content
    assert bearer(made["key"]).get("/api/v1/tasks").status_code == 401
    assert AuditEntry.objects.filter(action="token.revoke").count() == 1
    page = admin_client.get(f"/admin/accounts/accesstoken/{made['id']}/change/")
    assert page.status_code == 200 and made["key"].encode() not in page.content
