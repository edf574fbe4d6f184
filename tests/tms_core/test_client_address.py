"""Issue 43, item 6: one client address for the throttles, the login lockout, the audit log and
``/metrics``; ``X-Forwarded-For`` believed only from ``TMS_TRUSTED_PROXIES``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.helpers import get_client_ip_address
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, RequestFactory, override_settings
from rest_framework.test import APIClient

from executions.callbacks import callback_token
from tasks_app.models import AuditEntry
from tests.factories import TaskFactory
from tms_core.api.throttling import AnonRateThrottle, UserRateThrottle
from tms_core.client_address import client_address
from tms_core.conf import TmsSettings, tms_settings

pytestmark = pytest.mark.django_db


@pytest.fixture
def proxies(settings):
    def configure(*entries: str) -> None:
        settings.TMS = {**settings.TMS, "TRUSTED_PROXIES": tuple(entries)}

    return configure


@pytest.fixture(autouse=True)
def _fresh_cache():
    cache.clear()
    yield
    cache.clear()


def _request(peer: str, forwarded: str | None = None):
    extra = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return RequestFactory().get("/", **extra)


def test_without_trusted_proxies_the_peer_is_the_client_whatever_the_header():
    assert client_address(_request("192.0.2.10", "203.0.113.5")) == "192.0.2.10"
    assert client_address(_request("192.0.2.10")) == "192.0.2.10"


def test_behind_trusted_proxies_the_first_untrusted_hop_from_the_end_is_the_client(proxies):
    proxies("10.0.0.0/8", "127.0.0.1")

    # A client's own entries (to the left) are never reached.
    assert client_address(_request("127.0.0.1", "6.6.6.6, 203.0.113.5")) == "203.0.113.5"
    assert client_address(_request("127.0.0.1", "6.6.6.6, 203.0.113.5, 10.1.2.3")) == "203.0.113.5"
    assert client_address(_request("127.0.0.1", "[2001:db8::1]:4711")) == "2001:db8::1"
    assert client_address(_request("127.0.0.1", "203.0.113.5:4711")) == "203.0.113.5"
    # A peer that is no trusted proxy: its header is not believed.
    assert client_address(_request("192.0.2.10", "203.0.113.5")) == "192.0.2.10"
    # Garbage where a proxy would have written an address: the last address a proxy vouched for.
    assert client_address(_request("127.0.0.1", "not-an-address, 10.9.9.9")) == "10.9.9.9"
    # No header: the proxy itself.
    assert client_address(_request("127.0.0.1")) == "127.0.0.1"


def test_a_trusted_proxy_that_is_no_network_is_refused_at_start_up():
    with pytest.raises(ImproperlyConfigured, match=r"TMS_TRUSTED_PROXIES: 'proxy\.local'"):
        TmsSettings(**{**_configured(), "TRUSTED_PROXIES": ("proxy.local",)})


def _configured() -> dict:
    from django.conf import settings

    return dict(settings.TMS)


def test_every_drf_throttle_and_the_login_lockout_use_the_client_address(proxies):
    spoofed = _request("192.0.2.10", "203.0.113.5")
    assert UserRateThrottle().get_ident(spoofed) == AnonRateThrottle().get_ident(spoofed) == "192.0.2.10"
    assert get_client_ip_address(spoofed) == "192.0.2.10"

    proxies("192.0.2.0/24")
    assert AnonRateThrottle().get_ident(spoofed) == get_client_ip_address(spoofed) == "203.0.113.5"


def _hook_requests(made: dict, count: int, peer: str = "127.0.0.1") -> list[int]:
    client = APIClient(REMOTE_ADDR=peer)
    return [
        client.post(
            f"/hooks/v1/{made['id']}",
            data=b"{}",
            content_type="application/json",
            HTTP_X_TMS_SIGNATURE="0" * 64,
            HTTP_X_TMS_TIMESTAMP="1",
            HTTP_X_FORWARDED_FOR=f"198.51.100.{number}",
        ).status_code
        for number in range(count)
    ]


def _trigger_url(api_client, user) -> dict:
    task = TaskFactory(owner=user)
    response = api_client.post(f"/api/v1/tasks/{task.pk}/trigger-url")
    assert response.status_code == 201
    return response.json()


def test_twenty_trigger_url_requests_with_other_forwarded_headers_are_throttled(api_client, user, settings):
    settings.TMS_HOOK_THROTTLE = "5/minute"
    made = _trigger_url(api_client, user)

    codes = _hook_requests(made, 20)

    assert codes.count(401) == 5 and codes.count(429) == 15


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_count(api_client, user, settings, proxies):
    settings.TMS_HOOK_THROTTLE = "5/minute"
    proxies("127.0.0.1")
    made = _trigger_url(api_client, user)

    codes = _hook_requests(made, 20)

    assert codes == [401] * 20


def test_twenty_callbacks_with_other_forwarded_headers_are_throttled(settings):
    settings.TMS_CALLBACK_THROTTLE = "5/minute"
    token = callback_token(execution_id=999_999, attempt=1, timeout=timedelta(seconds=60))
    client = APIClient()
    codes = [
        client.post(
            "/api/v1/executions/999999/callback",
            {"status": "heartbeat"},
            format="json",
            HTTP_X_TMS_CALLBACK_TOKEN=token,
            HTTP_X_FORWARDED_FOR=f"198.51.100.{number}",
        ).status_code
        for number in range(20)
    ]

    assert codes.count(429) == 15 and 429 not in codes[:5]


def test_the_audit_log_records_the_client_address_and_no_forged_one(api_client, user, proxies):
    forged = api_client.post(
        "/api/v1/tasks", {"name": "a", "runner": "noop"}, format="json", HTTP_X_FORWARDED_FOR="203.0.113.66"
    )
    proxies("127.0.0.1")
    forwarded = api_client.post(
        "/api/v1/tasks", {"name": "b", "runner": "noop"}, format="json", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.77"
    )

    assert forged.status_code == forwarded.status_code == 201
    assert AuditEntry.objects.get(object_id=forged.json()["id"], action="create").remote_addr == "127.0.0.1"
    assert AuditEntry.objects.get(object_id=forwarded.json()["id"], action="create").remote_addr == "203.0.113.77"


def test_a_forged_header_does_not_escape_the_login_lockout():
    get_user_model().objects.create_user("ops", password="right-password-1", is_staff=True)
    with override_settings(AXES_FAILURE_LIMIT=3, AXES_COOLOFF_TIME=timedelta(seconds=60)):
        codes = [
            Client(REMOTE_ADDR="192.0.2.44", HTTP_X_FORWARDED_FOR=f"198.51.100.{number}")
            .post("/ui/login/", {"username": "ops", "password": "wrong"})
            .status_code
            for number in range(5)
        ]

    assert codes == [200, 200, 429, 429, 429]
    assert tms_settings().TRUSTED_PROXIES == ()
