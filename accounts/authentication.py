"""API authentication by personal access tokens, beside the older per-user keys.

One class reads ``Authorization: Bearer <key>`` (or ``Token <key>``): a key that starts with
``tms_pat_`` is a personal access token (:mod:`accounts.tokens`); any other key is looked up as
a DRF key, as before, so the keys that exist keep working until they are deleted.

A token scoped to one team marks the request's user object with that team
(:func:`tms_core.auth.restrict_to_team`): the team rule (:mod:`tasks_app.teams`), which every API
view, service and page asks, then sees that team only.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions

from accounts.tokens import TokenRefused, is_access_token_key, token_authenticate
from tms_core.api.auth import TokenAuthentication
from tms_core.auth import restrict_to_team


class AccessTokenAuthentication(TokenAuthentication):
    """Personal access tokens and DRF keys, by either scheme; ``request.auth`` is the token."""

    def authenticate_credentials(self, key: str) -> Any:
        if not is_access_token_key(key):
            return super().authenticate_credentials(key)
        try:
            token = token_authenticate(key)
        except TokenRefused as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        user = token.user  # loaded for this request alone: the mark goes with it
        restrict_to_team(user, token.team_id)
        return user, token
