"""API authentication by personal access tokens, beside the older per-user keys.

One class reads ``Authorization: Bearer <key>`` (or ``Token <key>``): a key that starts with
``tms_pat_`` is a personal access token (:mod:`accounts.tokens`); any other key is an account key
(:mod:`accounts.account_keys`), found by its SHA-256: the database holds no key in clear. The
account keys made before they were hashed (DRF's ``authtoken``) were hashed by a migration, so
they keep working until they are rotated.

A token scoped to one team marks the request's user object with that team
(:func:`tms_core.auth.restrict_to_team`): the team rule (:mod:`tasks_app.teams`), which every API
view, service and page asks, then sees that team only.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions

from accounts.account_keys import account_key_digest
from accounts.models import AccountKey
from accounts.tokens import TokenRefused, is_access_token_key, token_authenticate
from tms_core.api.auth import TokenAuthentication
from tms_core.auth import mark_token, restrict_to_team


class AccessTokenAuthentication(TokenAuthentication):
    """Personal access tokens and account keys, by either scheme; ``request.auth`` is the token
    (an :class:`~accounts.models.AccessToken` or an :class:`~accounts.models.AccountKey`)."""

    model = AccountKey
    key_field = "digest"

    def authenticate_credentials(self, key: str) -> Any:
        if not is_access_token_key(key):
            return super().authenticate_credentials(account_key_digest(key))
        try:
            token = token_authenticate(key)
        except TokenRefused as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        user = token.user  # loaded for this request alone: the mark goes with it
        restrict_to_team(user, token.team_id)
        mark_token(user, token.pk)  # what the request makes is recorded as this token's
        return user, token
