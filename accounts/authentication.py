"""API authentication by personal access tokens, beside the older per-user keys.

One class reads ``Authorization: Bearer <key>`` (or ``Token <key>``): a key that starts with
``tms_pat_`` is a personal access token (:mod:`accounts.tokens`); any other key is looked up as
a DRF key, as before, so the keys that exist keep working until they are deleted.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions

from accounts.tokens import TokenRefused, is_access_token_key, token_authenticate
from tms_core.api.auth import TokenAuthentication


class AccessTokenAuthentication(TokenAuthentication):
    """Personal access tokens and DRF keys, by either scheme; ``request.auth`` is the token."""

    def authenticate_credentials(self, key: str) -> Any:
        if not is_access_token_key(key):
            return super().authenticate_credentials(key)
        try:
            token = token_authenticate(key)
        except TokenRefused as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        return token.user, token
