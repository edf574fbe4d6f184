"""DRF keys read with their user in one statement written once (tms_core.api.auth, issue 33):
the same answers as DRF's own lookup."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed

from tests.conftest import account_key_for
from tms_core.api.auth import TokenAuthentication

pytestmark = pytest.mark.django_db


def test_a_key_gives_its_user_and_token_in_one_statement(user):
    key = Token.objects.create(user=user).key
    with CaptureQueriesContext(connection) as queries:
        found, token = TokenAuthentication().authenticate_credentials(key)
        assert token.user is found, "the user comes with the token, as select_related gives it"
    assert len(queries.captured_queries) == 1
    assert (found.pk, found.username, found.is_active, found.date_joined) == (
        user.pk,
        user.username,
        True,
        user.date_joined,
    )
    assert (token.pk, token.user_id, token.created) == (key, user.pk, Token.objects.get(pk=key).created)


def test_an_unknown_key_and_an_inactive_users_key_are_refused_as_drf_refuses_them(user):
    with pytest.raises(AuthenticationFailed, match=r"Invalid token\."):
        TokenAuthentication().authenticate_credentials("0" * 40)
    key = Token.objects.create(user=user).key
    user.is_active = False
    user.save(update_fields=["is_active"])
    with pytest.raises(AuthenticationFailed, match=r"User inactive or deleted\."):
        TokenAuthentication().authenticate_credentials(key)


def test_the_api_answers_a_key_as_before(client, user):
    key = account_key_for(user)
    assert client.get("/api/v1/tasks", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    refused = client.get("/api/v1/tasks", HTTP_AUTHORIZATION="Bearer " + "1" * 40)
    assert refused.status_code == 401
    assert "Invalid token." in refused.content.decode()
