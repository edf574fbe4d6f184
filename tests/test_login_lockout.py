"""Password logins lock out after repeated failures (django-axes); API tokens are unaffected.

Each login page is driven through the real view, as a browser would post its form.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import F
from django.test import Client, override_settings

from tests.conftest import account_key_for

pytestmark = pytest.mark.django_db

PASSWORD = "right-password-1"
LOGINS = ["/admin/login/", "/ui/login/", "/api-auth/login/"]


@pytest.fixture
def staff():
    return get_user_model().objects.create_user("ops", password=PASSWORD, is_staff=True, is_superuser=True)


def _login(path: str, password: str, *, ip: str = "203.0.113.7") -> tuple[int, Client]:
    client = Client(REMOTE_ADDR=ip)
    response = client.post(path, {"username": "ops", "password": password})
    return response.status_code, client


def _logged_in(client: Client) -> bool:
    return client.get("/ui/tasks/").status_code == 200


def test_defaults_come_from_the_environment_with_sensible_values():
    assert settings.AXES_ENABLED is True
    assert settings.AXES_FAILURE_LIMIT == 5
    assert settings.AXES_COOLOFF_TIME.total_seconds() == 15 * 60
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]


@pytest.mark.parametrize("path", LOGINS)
def test_wrong_passwords_lock_the_account_out_until_the_cool_off(path, staff):
    token = account_key_for(staff)
    with override_settings(AXES_FAILURE_LIMIT=3, AXES_COOLOFF_TIME=timedelta(seconds=2)):
        statuses = [_login(path, "wrong")[0] for _ in range(3)]
        assert statuses[:2] == [200, 200]  # the form again, with its error
        assert statuses[2] == 429  # the third failure reaches the limit

        status, client = _login(path, PASSWORD)
        assert status == 429
        assert not _logged_in(client)

        # The lockout is per username and address: the same user elsewhere is not locked out.
        status, elsewhere = _login(path, PASSWORD, ip="198.51.100.9")
        assert status == 302 and _logged_in(elsewhere)

        # API tokens are not passwords: the locked-out user's token keeps working.
        api = Client(REMOTE_ADDR="203.0.113.7", HTTP_AUTHORIZATION=f"Token {token}")
        assert api.get("/api/v1/tasks").status_code == 200

        AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=11))
        status, client = _login(path, PASSWORD)
        assert status == 302 and _logged_in(client)


def test_a_success_resets_the_failure_count(staff):
    with override_settings(AXES_FAILURE_LIMIT=3):
        assert [_login("/ui/login/", "wrong")[0] for _ in range(2)] == [200, 200]
        assert _login("/ui/login/", PASSWORD)[0] == 302
        assert [_login("/ui/login/", "wrong")[0] for _ in range(2)] == [200, 200]
        assert _login("/ui/login/", PASSWORD)[0] == 302
