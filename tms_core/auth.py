"""The signed-in user of a request, typed for the services that take an owner or an actor."""

from __future__ import annotations

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
