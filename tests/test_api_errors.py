"""One error shape everywhere, session authentication for the browsable API."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/api/v1/nothing-here", "/api/v1/tasks/x/y/z", "/tasks/a/b"])
def test_unknown_api_paths_are_json_404s(api_client, path):
    response = api_client.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"type": "not_found", "detail": "Not found."}


def test_browsable_api_works_with_a_session(client, user):
    client.force_login(user)
    response = client.get("/api/v1/tasks", HTTP_ACCEPT="text/html")
    assert response.status_code == 200 and b"Register tasks" in response.content
    assert client.get("/api-auth/login/").status_code == 200


def test_session_writes_need_the_csrf_token(user):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post("/api/v1/tasks", {"runner": "noop"}, format="json")
    assert response.status_code == 403
    body = response.json()
    assert body["type"] == "permission_denied" and "CSRF" in body["detail"]


@pytest.mark.parametrize(
    "body",
    [
        "[" * 200_000 + "]" * 200_000,  # deeper than the decoder's recursion
        '{"runner": "noop", "config": ' + '{"a": ' * 500 + "1" + "}" * 500 + "}",
    ],
)
def test_absurdly_nested_json_is_a_400_not_a_crash(api_client, body):
    response = api_client.generic("POST", "/api/v1/tasks", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["type"] == "parse_error" and "nested" in response.json()["detail"]


def test_reasonably_nested_config_is_fine(api_client):
    body = '{"runner": "noop", "config": ' + '{"a": ' * 10 + "1" + "}" * 10 + "}"
    response = api_client.generic("POST", "/api/v1/tasks", body, content_type="application/json")
    assert response.status_code == 400 and "config" in response.json()["errors"]  # noop takes no config
