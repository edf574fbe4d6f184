"""Suite-wide fixtures. The suite runs against the real PostgreSQL and RabbitMQ: if either is
unreachable the whole run fails at once (it never skips)."""

from __future__ import annotations

import contextlib
import socket
from urllib.parse import urlparse

import pytest
from django.conf import settings


def _reachable(url: str, default_port: int) -> tuple[str, int, bool]:
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or default_port
    try:
        with socket.create_connection((host, port), timeout=3):
            return host, port, True
    except OSError:
        return host, port, False


def pytest_sessionstart(session: pytest.Session) -> None:
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        pytest.exit(f"The suite needs PostgreSQL; DATABASE_URL points at {db['ENGINE']}.", returncode=3)
    missing = []
    host, port, ok = _reachable(f"postgres://{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}", 5432)
    if not ok:
        missing.append(f"PostgreSQL at {host}:{port}")
    host, port, ok = _reachable(settings.CELERY_BROKER_URL, 5672)
    if not ok:
        missing.append(f"RabbitMQ at {host}:{port}")
    if missing:
        pytest.exit(
            "Required services are not reachable: " + ", ".join(missing) + " (see `make services`).", returncode=3
        )


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user(username="alice", password="alice-password")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user(username="bob", password="bob-password")


@pytest.fixture
def api_client(user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture(autouse=True)
def _dashboard_cache():
    """Each test starts with an empty dashboard cache: the database is rolled back between tests
    (the rollup epoch with it), the process's cache is not."""
    from django.core.cache import caches

    caches["dashboard"].clear()


@pytest.fixture(autouse=True)
def _launch_pace():
    """Each test's messages start as a worker process's first one does (the first run alone):
    the pace of launches a process measured is kept across messages, not across tests."""
    from executions import worker_services

    worker_services._pace.seconds = None


@pytest.fixture(scope="session", autouse=True)
def _test_queue():
    """Delete this run's RabbitMQ queues when the run ends."""
    yield
    from tms_project.celery import app

    for queue in (settings.TMS_QUEUE, settings.TMS_NOTIFY_QUEUE):
        with app.connection_for_write() as conn, contextlib.suppress(Exception):  # already gone
            conn.default_channel.queue_delete(queue)


@pytest.fixture
def staff_user(django_user_model):
    return django_user_model.objects.create_user(username="root", password="root-password", is_staff=True)


def account_key_for(user) -> str:
    """``user``'s account key, the same at every call in a test: made from the user's id, stored
    hashed as every account key is (:mod:`accounts.account_keys`), replacing any other key of theirs."""
    from accounts.account_keys import account_key_digest
    from accounts.models import AccountKey

    key = f"{user.pk:08x}" + "0" * 32  # 40 hex characters, the shape of a real key
    AccountKey.objects.update_or_create(user_id=user.pk, defaults={"digest": account_key_digest(key)})
    return key


def client_for(user):
    """An API client authenticated as ``user`` with a real account key, as API users are."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {account_key_for(user)}")
    return client


@pytest.fixture
def other_client(other_user):
    return client_for(other_user)


@pytest.fixture
def staff_client(staff_user):
    return client_for(staff_user)


@pytest.fixture
def test_runners(settings):
    """Adds the runners whose cancel behaviour tests can observe (``tests.runners_for_tests.RUNNERS``)."""
    from tests import runners_for_tests

    runners_for_tests.reset()
    settings.TMS_RUNNERS = {**settings.TMS_RUNNERS, **runners_for_tests.RUNNERS}
    return runners_for_tests
