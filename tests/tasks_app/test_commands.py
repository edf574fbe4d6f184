"""manage.py tms_create_user: a user and the token it authenticates with."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from accounts.account_keys import account_key_digest
from accounts.models import AccountKey

pytestmark = pytest.mark.django_db


def _create(*args: str) -> str:
    out = io.StringIO()
    call_command("tms_create_user", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_prints_a_token_that_authenticates_the_new_user():
    token = _create("dave")
    user = get_user_model().objects.get(username="dave")
    # Only the key's hash is stored: the row does not hold the key.
    stored = AccountKey.objects.get(user=user)
    assert stored.digest == account_key_digest(token) and token not in str(
        AccountKey.objects.filter(user=user).values()
    )
    assert not user.is_staff and not user.has_usable_password()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/v1/tasks").status_code == 200
    assert client.get("/api/v1/workers").status_code == 403


def test_staff_flag_password_and_rerun_keep_one_token():
    token = _create("erin", "--staff", "--password", "s3cret-pass")
    user = get_user_model().objects.get(username="erin")
    assert user.is_staff and not user.is_superuser and user.check_password("s3cret-pass")
    assert _create("erin") == ""  # the same user; the key stays and is not shown again (it is not known)
    rotated = _create("erin", "--rotate")
    assert len(rotated) == 40 and rotated != token and AccountKey.objects.filter(user=user).count() == 1
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {rotated}")
    assert client.get("/api/v1/workers").status_code == 200
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/v1/workers").status_code == 401  # the key it replaced


def test_superuser_implies_staff_and_empty_names_are_refused():
    _create("frank", "--superuser")
    frank = get_user_model().objects.get(username="frank")
    assert frank.is_superuser and frank.is_staff
    with pytest.raises(CommandError):
        _create("  ")
