"""Personal access tokens: creating, checking and revoking them.

A key reads ``tms_pat_<lookup>_<secret>``: ``lookup`` (12 hex characters) finds the row and is
safe to show; ``secret`` (43 URL-safe characters, 256 random bits) is never stored. The row keeps
the SHA-256 of the whole key, compared in constant time. The distinctive prefix lets secret
scanners and log filters recognise a leaked key, and lets the API tell these keys from the
older per-user DRF keys, which keep working until they are deleted.

Every change is audited (``token.create``, ``token.revoke``) in the transaction that makes it.

What a token may make that outlives it: a task's trigger URL secret (``POST /tasks/{id}/hook``)
and a team membership below admin (the admin role cannot be granted through a token:
:func:`tasks_app.teams.services.member_set`). It cannot make another token, nor an account key. Each
such credential records the token (``created_by_token``); :func:`token_made` lists those it still
holds, and :func:`token_made_revoke` removes them. Revoking a token does not remove them by
itself: a trigger URL a CI job made is often meant to stay, so the owner decides (the API's
``/tokens/{id}/made`` and the back office's token page show them beside the revoked token).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import AccessToken, TokenScope
from tasks_api.hooks import task_hook_delete
from tasks_app.audit import audit_record
from tasks_app.models import Membership, TaskHook, Team
from tasks_app.teams.services import member_remove
from tms_core.errors import InvalidInput

#: What every key starts with.
KEY_PREFIX = "tms_pat_"
_LOOKUP_BYTES = 6
#: last_used_at is written at most this often per token.
_TOUCH_EVERY = timedelta(minutes=1)


class TokenRefused(Exception):
    """A key that does not authenticate; the message says why in words fit for the client."""


def is_access_token_key(key: str) -> bool:
    """Whether ``key`` has the shape of a personal access token (not an older DRF key)."""
    return key.startswith(KEY_PREFIX)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def normalise_scopes(scopes: Iterable[str]) -> list[str]:
    """Sorted, deduplicated scope names; ``write`` brings ``read`` with it."""
    chosen = set(scopes)
    if TokenScope.WRITE in chosen:
        chosen.add(TokenScope.READ)
    return sorted(str(scope) for scope in chosen)


def token_create(
    *, user: User, name: str, scopes: Iterable[str], expires_at: datetime | None, team: Team | None = None
) -> tuple[AccessToken, str]:
    """Create a token for ``user``; return it and its key, which nothing can show again.

    ``team``: the one team the token sees and acts in (None: all of its user's teams). The
    caller has checked the name, scopes and expiry (:class:`accounts.api.AccessTokenSerializer`
    does, against the operator's limits); ``user`` must be a member of ``team`` (checked here
    too, so no caller can scope a token to a team its user is not in).
    """
    if team is not None and not Membership.objects.filter(team=team, user_id=user.pk).exists():
        raise InvalidInput.on("team", "The token's user is not a member of this team.")
    for _ in range(3):  # a lookup collision (2**-48 per pair) is retried with a fresh key
        lookup = secrets.token_hex(_LOOKUP_BYTES)
        key = f"{KEY_PREFIX}{lookup}_{secrets.token_urlsafe(32)}"
        try:
            with transaction.atomic():
                token = AccessToken.objects.create(
                    user=user,
                    name=name,
                    lookup=lookup,
                    digest=_digest(key),
                    scopes=normalise_scopes(scopes),
                    expires_at=expires_at,
                    team=team,
                )
                token.refresh_from_db(fields=["created_at"])
                audit_record(
                    action="token.create",
                    object_type="token",
                    object_id=token.pk,
                    owner=user,
                    changes={
                        "name": {"from": None, "to": name},
                        "scopes": {"from": None, "to": token.scopes},
                        "expires_at": {"from": None, "to": expires_at.isoformat() if expires_at else None},
                        "prefix": {"from": None, "to": token.prefix},
                        "team": {"from": None, "to": team.slug if team is not None else None},
                    },
                )
                return token, key
        except IntegrityError:
            if AccessToken.objects.filter(lookup=lookup).exists():
                continue
            raise
    raise RuntimeError("could not draw an unused token lookup three times running")


def token_revoke(*, token: AccessToken) -> bool:
    """Revoke ``token`` at once (a conditional update: only the first revoke wins and is audited).

    The row stays, so lists and the audit log can still name it. Returns whether this call revoked it.
    """
    now = timezone.now()
    with transaction.atomic():
        won = AccessToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now) == 1
        if won:
            token.revoked_at = now
            audit_record(
                action="token.revoke",
                object_type="token",
                object_id=token.pk,
                owner=token.user_id,
                changes={"revoked_at": {"from": None, "to": now.isoformat()}},
                detail=token.name,
            )
    return won


def token_authenticate(key: str) -> AccessToken:
    """The live token whose key ``key`` is, with its user loaded; raise :class:`TokenRefused` if none.

    Unknown keys and wrong secrets get the same answer, so a guess learns nothing about which
    lookups exist. A revoked or expired token says so: whoever holds its key knew it once.
    """
    lookup = key[len(KEY_PREFIX) :].partition("_")[0]
    token = AccessToken.objects.select_related("user").filter(lookup=lookup).first() if lookup else None
    if token is None or not hmac.compare_digest(token.digest, _digest(key)):
        raise TokenRefused("Invalid token.")
    if token.revoked_at is not None:
        raise TokenRefused("This token was revoked.")
    now = timezone.now()
    if token.expires_at is not None and token.expires_at <= now:
        raise TokenRefused(f"This token expired at {token.expires_at:%Y-%m-%dT%H:%M:%SZ}.")
    if not token.user.is_active:
        raise TokenRefused("User inactive or deleted.")
    if (
        token.team_id is not None
        and not Membership.objects.filter(team_id=token.team_id, user_id=token.user_id).exists()
    ):
        # Checked on every request, not only at creation: a member removed from the team (or a
        # deleted service account) must not keep a key that still names it.
        raise TokenRefused("This token's user is no longer a member of the token's team.")
    if token.last_used_at is None or token.last_used_at <= now - _TOUCH_EVERY:
        # Conditional, so concurrent requests write it once; never inside the request's own
        # transaction (ATOMIC_REQUESTS is off), so a request that fails still counts as a use.
        AccessToken.objects.filter(pk=token.pk).exclude(last_used_at__gt=now - _TOUCH_EVERY).update(last_used_at=now)
        token.last_used_at = now
    return token


@dataclass(frozen=True)
class TokenMade:
    """The credentials a token made that are still its own (each later change by someone else
    makes them theirs)."""

    trigger_urls: list[TaskHook] = field(default_factory=list)
    memberships: list[Membership] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.trigger_urls) + len(self.memberships)


def token_made(*, token: AccessToken) -> TokenMade:
    """The trigger URLs and memberships ``token`` made (or last changed) that exist still."""
    return TokenMade(
        trigger_urls=list(TaskHook.objects.filter(created_by_token=token.pk).select_related("task").order_by("pk")),
        memberships=list(
            Membership.objects.filter(created_by_token=token.pk).select_related("team", "user").order_by("pk")
        ),
    )


@dataclass(frozen=True)
class TokenMadeRevoked:
    """What :func:`token_made_revoke` removed, and what it left with the reason."""

    trigger_urls: int
    memberships: int
    kept: list[str]


def token_made_revoke(*, token: AccessToken) -> TokenMadeRevoked:
    """Remove what ``token`` made: delete its trigger URLs (their requests answer 404 from then on)
    and remove the memberships it granted, through the services the API uses (audited). A
    membership whose removal a rule refuses (the team's last admin) is kept and named in ``kept``."""
    made = token_made(token=token)
    hooks = sum(1 for hook in made.trigger_urls if task_hook_delete(task=hook.task))
    removed, kept = 0, []
    for membership in made.memberships:
        try:
            member_remove(team=membership.team, username=membership.user.get_username())
            removed += 1
        except InvalidInput as exc:
            kept.append(f"{membership.user.get_username()} in {membership.team.slug}: {_first_message(exc)}")
    return TokenMadeRevoked(trigger_urls=hooks, memberships=removed, kept=kept)


def _first_message(exc: InvalidInput) -> str:
    for messages in exc.errors.values():
        return str(messages[0] if isinstance(messages, list) else messages)
    return str(exc)
