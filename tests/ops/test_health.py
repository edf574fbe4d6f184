"""/healthz and /readyz: alive without touching anything; ready names the dependency that is down."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import pytest
import requests
from django.conf import settings as django_settings
from django.db import connection

from ops import checks
from tests.tcp_proxy import TcpProxy
from tests.web import start_web

pytestmark = pytest.mark.django_db


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(autouse=True)
def _fresh_migration_cache():
    checks._migrations_applied.clear()
    yield
    checks._migrations_applied.clear()


def test_healthz_is_alive_without_a_query(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "alive"}
    assert response["Cache-Control"] == "no-store"


def test_readyz_is_ready_when_database_broker_and_migrations_are(client):
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "ready"
    assert {name: check["ok"] for name, check in body["checks"].items()} == {
        "database": True,
        "broker": True,
        "migrations": True,
    }


def test_readyz_fails_while_the_broker_is_unreachable_and_recovers(client, settings):
    reachable = settings.CELERY_BROKER_URL
    settings.CELERY_BROKER_URL = f"amqp://guest:guest@127.0.0.1:{closed_port()}//"

    response = client.get("/readyz")

    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["broker"]["ok"] is False
    assert "unreachable" in body["checks"]["broker"]["detail"]
    assert body["checks"]["database"]["ok"] is True and body["checks"]["migrations"]["ok"] is True

    settings.CELERY_BROKER_URL = reachable
    response = client.get("/readyz")
    assert response.status_code == 200 and response.json()["checks"]["broker"]["ok"] is True


def test_readyz_fails_while_a_migration_is_not_applied(client):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE app = 'executions' AND name LIKE '0005%%'")
    response = client.get("/readyz")
    assert response.status_code == 503
    migrations = response.json()["checks"]["migrations"]
    assert migrations == {"ok": False, "detail": "1 not applied (executions.0005_events_without_fk_constraint)"}


def test_probes_answer_before_the_ssl_redirect_and_the_host_check(client, settings):
    """A platform probes the container by IP over plain HTTP; the API itself stays guarded."""
    settings.SECURE_SSL_REDIRECT = True
    settings.ALLOWED_HOSTS = ["tms.example.com"]
    assert client.get("/healthz", HTTP_HOST="10.0.0.7:8000").status_code == 200
    assert client.get("/readyz", HTTP_HOST="10.0.0.7:8000").status_code == 200
    assert client.get("/api/v1/tasks", HTTP_HOST="10.0.0.7:8000").status_code == 400  # DisallowedHost
    redirect = client.get("/api/v1/tasks", HTTP_HOST="tms.example.com")
    assert redirect.status_code == 301 and redirect["Location"].startswith("https://tms.example.com/")


def test_probes_are_read_only(client):
    response = client.post("/readyz")
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_readyz_of_a_real_web_process_fails_while_the_broker_is_gone_and_recovers():
    """The broker taken away from one gunicorn process (its connections cut and refused, as when
    RabbitMQ stops; the shared RabbitMQ itself is never stopped here): /readyz answers 503 naming
    the broker, /healthz stays alive, and /readyz is 200 again once the broker is back."""
    broker = urlsplit(django_settings.CELERY_BROKER_URL)
    proxy = TcpProxy(broker.port or 5672, broker.hostname or "127.0.0.1")
    through_proxy = broker._replace(netloc=f"{broker.username}:{broker.password}@127.0.0.1:{proxy.port}").geturl()
    web, base = start_web(workers=1, CELERY_BROKER_URL=through_proxy, TMS_RETRY_AFTER="4")
    try:
        assert requests.get(f"{base}/readyz", timeout=10).status_code == 200

        proxy.cut()
        down = requests.get(f"{base}/readyz", timeout=10)
        assert down.status_code == 503 and down.headers["Retry-After"] == "4"
        checks = down.json()["checks"]
        assert checks["broker"]["ok"] is False and checks["database"]["ok"] is True
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200

        proxy.restore()
        assert requests.get(f"{base}/readyz", timeout=10).json()["status"] == "ready"
        assert "Traceback" not in web.log()
    finally:
        web.stop()
        proxy.close()
