"""The signed-in user of a request, typed for the services that take an owner or an actor."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from rest_framework.request import Request


def request_user(request: HttpRequest | Request) -> User:
    """``request.user`` where authentication has already let the request through.

    Every API view requires an authenticated user, and the admin and the back office require
    staff, so this only narrows ``User | AnonymousUser`` to ``User``. Were a view ever opened to
    anonymous requests by mistake, it refuses them here (403) instead of writing a task or an
    event with no owner.
    """
    user = request.user
    if not isinstance(user, User):
        raise PermissionDenied("Authentication is required.")
    return user


def actor_for(user: AbstractBaseUser) -> str:
    """How a user appears in execution events (``ExecutionEvent.actor``) and audit entries."""
    return f"user:{user.get_username()}"


#: The attribute :func:`restrict_to_team` sets on a request's user object: the id of the one team a
#: team-scoped access token may see and act in. Only ever on the in-memory object of one request
#: (never a column, never saved), so a session or another token of the same user is not narrowed.
TOKEN_TEAM_ATTR = "tms_token_team_id"  # noqa: S105 - an attribute name, not a secret


def restrict_to_team(user: Any, team_id: int | None) -> None:
    """Narrow everything ``user`` (this request's object) sees and does to the team ``team_id``
    (None: no restriction). The authentication calls it for a team-scoped access token; the team
    rule (:mod:`tasks_app.teams`) and :func:`sees_everything` honour it."""
    setattr(user, TOKEN_TEAM_ATTR, team_id)


def token_team_id(user: Any) -> int | None:
    """The one team ``user``'s request is restricted to by its token, or None (no restriction)."""
    return getattr(user, TOKEN_TEAM_ATTR, None)


def sees_everything(user: Any) -> bool:
    """Staff see every owner's and every team's objects (read-only support), except through a
    team-scoped token: that token narrows staff to its team like anyone else."""
    return bool(getattr(user, "is_staff", False)) and token_team_id(user) is None


#: The attribute of a request's user object naming the personal access token the request came
#: with (set by the authentication): what a token makes is recorded as the token's.
TOKEN_ID_ATTR = "tms_access_token_id"  # noqa: S105 - an attribute name, not a secret


def mark_token(user: Any, token_id: int | None) -> None:
    """Record that ``user`` (this request's object) acts through the access token ``token_id``."""
    setattr(user, TOKEN_ID_ATTR, token_id)


def acting_token_id(user: Any) -> int | None:
    """The access token ``user``'s request came with, or None (a session, an account key, a command)."""
    return getattr(user, TOKEN_ID_ATTR, None)
