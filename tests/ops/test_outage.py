"""Outages answered, not crashed: a database or broker outage is a 503 with Retry-After in the
API's error shape, and the API answers again once the dependency is back."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import requests
from django.conf import settings as django_settings
from django.test import RequestFactory
from kombu.exceptions import OperationalError as BrokerOperationalError

from ops.middleware import OutageMiddleware
from tests.conftest import account_key_for
from tests.ops.test_health import closed_port
from tests.tcp_proxy import TcpProxy
from tests.web import start_web


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_api_answers_503_while_postgresql_is_unreachable_and_recovers(user):
    token = account_key_for(user)
    db = django_settings.DATABASES["default"]
    proxy = TcpProxy(int(db["PORT"] or 5432), db["HOST"] or "127.0.0.1")
    web, base = start_web(
        workers=1, DATABASE_URL=f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}", TMS_RETRY_AFTER="7"
    )
    headers = {"Authorization": f"Token {token}"}
    try:
        assert requests.get(f"{base}/api/v1/tasks", headers=headers, timeout=10).status_code == 200

        schema = requests.get(f"{base}/api/schema/?format=json", timeout=30).json()
        # The upload PUT checks its signed token before it needs the database: a real one.
        begun = requests.post(
            f"{base}/api/v1/artifacts/uploads",
            headers=headers,
            json={
                "name": "run.sh",
                "size": 1,
                "sha256": "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
            },
            timeout=10,
        )
        assert begun.status_code == 201, begun.text
        upload_token = begun.json()["upload"]["url"].rstrip("/").rsplit("/", 1)[1]

        proxy.cut()  # drops the server's persistent connection and refuses new ones
        _every_operation_answers_503(base, schema, headers, upload_token)
        for path in ("/api/v1/tasks", "/tasks"):
            response = requests.get(f"{base}{path}", headers=headers, timeout=10)
            assert response.status_code == 503, response.text
            assert response.headers["Retry-After"] == "7"
            assert response.json() == {
                "type": "service_unavailable",
                "detail": "The service is temporarily unavailable (database); retry shortly.",
            }
        created = requests.post(f"{base}/api/v1/tasks", headers=headers, json={"runner": "noop"}, timeout=10)
        assert created.status_code == 503
        ready = requests.get(f"{base}/readyz", timeout=10)
        assert ready.status_code == 503
        checks = ready.json()["checks"]
        assert checks["database"]["ok"] is False and checks["broker"]["ok"] is True
        assert checks["migrations"] == {"ok": False, "detail": "skipped: database unreachable"}
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200  # alive all along

        proxy.restore()
        assert requests.get(f"{base}/readyz", timeout=10).status_code == 200
        response = requests.post(f"{base}/api/v1/tasks", headers=headers, json={"runner": "noop"}, timeout=10)
        assert response.status_code == 201, response.text
        assert "Traceback" not in web.log()  # answered, not crashed
    finally:
        web.stop()
        proxy.close()


def _example(parameter: dict[str, Any], upload_token: str) -> str:
    schema = parameter.get("schema", {})
    if parameter["name"] == "token":
        return upload_token
    if schema.get("format") == "uuid":
        return str(uuid.uuid4())
    return "1" if schema.get("type") == "integer" or schema.get("pattern", "").startswith("^[0-9]") else "abc"


def _every_operation_answers_503(base: str, schema: dict[str, Any], headers: dict[str, str], upload_token: str) -> None:
    """Every operation of the schema, with the database unreachable: 503 with Retry-After in the
    error shape, as the schema documents for each (docs/api.md promises it for the whole API)."""
    answered = []
    operations = sum(
        method in {"get", "post", "put", "patch", "delete"} for item in schema["paths"].values() for method in item
    )
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            documented = operation["responses"].get("503")
            assert documented is not None, (method, path)
            assert documented["headers"]["Retry-After"]["required"] is True, (method, path)
            url = path
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path":
                    url = url.replace("{" + parameter["name"] + "}", _example(parameter, upload_token))
            content = operation.get("requestBody", {}).get("content", {})
            body: dict[str, Any] = {}
            if "application/json" in content:
                body["json"] = {}
            elif "multipart/form-data" in content:
                body["files"] = {"file": ("run.sh", b"#!/bin/sh\n")}
            elif content:
                body["data"] = b"x"
                body["headers"] = {**headers, "Content-Type": next(iter(content))}
            call_headers = body.pop("headers", headers) | {"X-TMS-Callback-Token": "abc"}
            response = requests.request(method, f"{base}{url}", headers=call_headers, timeout=10, **body)
            if path == "/api/v1/executions/{id}/callback":
                # Its token is signed: a made-up one is refused before the database is needed.
                assert response.status_code == 403, response.text
                continue
            assert response.status_code == 503, (method, path, response.status_code, response.text[:300])
            assert response.headers["Retry-After"] == "7", (method, path)
            assert response.json()["type"] == "service_unavailable", (method, path)
            answered.append((method, path))
    # Every operation of the schema but the callback (at least the 54 of the API when this was written).
    assert len(answered) == operations - 1 >= 54, answered


@pytest.mark.django_db
def test_the_api_keeps_accepting_tasks_while_the_broker_is_unreachable(api_client, client, settings):
    settings.CELERY_BROKER_URL = f"amqp://guest:guest@127.0.0.1:{closed_port()}//"
    response = api_client.post("/api/v1/tasks", {"runner": "noop"}, format="json")
    assert response.status_code == 201  # the monitor publishes it once the broker is back
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["checks"]["broker"]["ok"] is False


@pytest.mark.parametrize(
    ("path", "content_type", "body"),
    [
        (
            "/api/v1/executions/1/cancel",
            "application/json",
            b'{"type": "service_unavailable", '
            b'"detail": "The service is temporarily unavailable (broker); retry shortly."}',
        ),
        ("/admin/", "text/plain; charset=utf-8", b"The service is temporarily unavailable (broker); retry shortly."),
    ],
)
def test_a_broker_error_in_a_view_is_a_503(path, content_type, body):
    middleware = OutageMiddleware(lambda request: None)
    response = middleware.process_exception(RequestFactory().post(path), BrokerOperationalError("connection refused"))
    assert response is not None
    assert (response.status_code, response["Content-Type"], response["Retry-After"]) == (503, content_type, "5")
    assert response.content == body


def test_other_errors_are_left_to_the_500_handler():
    middleware = OutageMiddleware(lambda request: None)
    assert middleware.process_exception(RequestFactory().get("/api/v1/tasks"), ValueError("a bug")) is None
