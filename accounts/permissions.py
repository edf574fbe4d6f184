"""What a token's scopes let a request do."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission

from accounts.models import AccessToken


class TokenScopePermission(BasePermission):
    """A request authenticated by a ``read`` token may only read (GET, HEAD, OPTIONS).

    Sessions and the older per-user keys are not limited by it. In the default permission
    classes, so every API view that keeps the defaults checks it; a view with classes of its own
    lists it too (a test walks every route with a read-only token).
    """

    message = "This token may only read (its scopes are read): create a token with the write scope to change things."

    def has_permission(self, request: Any, view: Any) -> bool:
        token = request.auth
        if isinstance(token, AccessToken) and request.method not in SAFE_METHODS:
            return token.may_write
        return True
