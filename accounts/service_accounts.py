"""Service accounts: a team's identities for machines (CI jobs, deploy scripts).

A service account is a user row that cannot sign in (no usable password; refused by
:class:`ServiceAccountLoginGate` whatever its password becomes), a member of its one team with
the role it was made with (viewer, operator or editor: never admin, so it cannot manage the team
that owns it), and the holder of access tokens, each scoped to that team. It has no personal
team. The team's admins make and delete it (the API's ``/teams/{id}/service-accounts`` and the
team's back-office page call these services; they check the admin role, the services check
everything else).

Deleting one revokes its tokens, removes it from the team and makes its user inactive, in one
transaction; the user row stays, so the tasks it created keep their owner and the audit log its
name. Every change is audited (``service_account.create``, ``service_account.delete``, and the
tokens' own ``token.create``/``token.revoke``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone
from django.utils.text import slugify

from accounts.models import AccessToken, ServiceAccount
from accounts.tokens import token_create, token_revoke
from tasks_app.audit import audit_record
from tasks_app.models import Membership, Team, TeamRole
from tasks_app.teams import NO_PERSONAL_TEAM
from tms_core.errors import InvalidInput

#: The roles a service account may hold: admin would let a key manage the team that owns it.
ROLES = (TeamRole.VIEWER, TeamRole.OPERATOR, TeamRole.EDITOR)
#: The same as choices, for forms, serializers and the schema's enum (``ServiceAccountRoleEnum``).
ROLE_CHOICES = [(role.value, role.label) for role in ROLES]
#: Its username: ``sa.<team slug>.<name>``, a dot-separated name no sign-in form hands out.
_USERNAME = "sa.{team}.{name}"


class ServiceAccountLoginGate:
    """An authentication backend, first in ``AUTHENTICATION_BACKENDS``: every password sign-in
    (the admin's, the back office's, the browsable API's) with a service account's username is
    refused, even if someone gave the account a password. It answers nothing else."""

    def authenticate(
        self, request: Any, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> None:
        if username is not None and ServiceAccount.objects.filter(user__username=username).exists():
            raise PermissionDenied("A service account cannot sign in: it uses access tokens.")
        return None

    # No get_user: a backend without one is never recorded in a session, nor picked by
    # Client.force_login as the session's backend (the next backend serves sessions, as before).


def _audit(account: ServiceAccount, action: str, changes: dict[str, Any]) -> None:
    audit_record(
        action=f"service_account.{action}",
        object_type="service_account",
        object_id=account.pk,
        owner=None,
        changes=changes,
        detail=f"{account.name} in {account.team.slug}",
    )


def _free_username(team: Team, name: str) -> str:
    base = _USERNAME.format(team=team.slug, name=slugify(name) or "account")[:140]
    taken = set(
        get_user_model().objects.filter(username__startswith=base).values_list("username", flat=True)
    )  # a deleted account keeps its user row (and name): the next one takes a number
    if base not in taken:
        return base
    number = 2
    while f"{base}-{number}" in taken:
        number += 1
    return f"{base}-{number}"


def service_account_create(*, team: Team, name: str, role: str, creator: Any | None) -> ServiceAccount:
    """A new service account of ``team`` with ``role`` (viewer, operator or editor).

    InvalidInput on ``name`` (empty, or taken in the team: names are unique among the team's
    live accounts), on ``role`` (admin or unknown), on ``team`` for a personal team (it has one
    member, its user). The caller has checked that ``creator`` is the team's admin.
    """
    name = name.strip()
    if not name:
        raise InvalidInput.on("name", "A service account needs a name.")
    if not re.fullmatch(r"[-\w .]{1,100}", name):
        raise InvalidInput.on("name", "Use at most 100 letters, digits, spaces, dots, hyphens or underscores.")
    if role not in ROLES:
        raise InvalidInput.on("role", f"One of: {', '.join(ROLES)} (a service account is never admin).")
    if team.personal:
        raise InvalidInput.on("team", "A personal team has one member, its user: create a shared team first.")
    try:
        with transaction.atomic():
            Team.objects.select_for_update().filter(pk=team.pk).first()
            if ServiceAccount.objects.filter(team=team, name=name, deleted_at__isnull=True).exists():
                raise InvalidInput.on("name", f"The team already has a service account named {name!r}.")
            user = get_user_model()(username=_free_username(team, name), is_active=True)
            user.set_unusable_password()
            setattr(user, NO_PERSONAL_TEAM, True)  # see tasks_app.teams.services.personal_team_on_user_created
            user.save()
            account = ServiceAccount.objects.create(
                user=user, team=team, name=name, created_by=creator if getattr(creator, "pk", None) else None
            )
            Membership.objects.create(team=team, user=user, role=role)
            by = creator.get_username() if creator is not None else None  # None: a script, a shell
            _audit(
                account,
                "create",
                {"name": name, "username": user.get_username(), "role": role, "by": by},
            )
    except IntegrityError:
        # Two creates of one name at once: the partial unique constraint decides.
        raise InvalidInput.on("name", f"The team already has a service account named {name!r}.") from None
    return account


def live_accounts(team: Team) -> QuerySet[ServiceAccount]:
    """``team``'s service accounts that are not deleted, oldest first, with their user and role."""
    role = Membership.objects.filter(team_id=team.pk, user_id=OuterRef("user_id")).values("role")[:1]
    return (
        ServiceAccount.objects.filter(team=team, deleted_at__isnull=True)
        .select_related("user", "team")
        .annotate(role=Subquery(role))
        .order_by("id")
    )


def service_account_delete(*, account: ServiceAccount, actor: Any) -> bool:
    """Delete ``account``: revoke every token it holds, remove it from its team and make its user
    inactive, at once (a conditional update: only the first delete wins and is audited).
    Returns whether this call deleted it."""
    now = timezone.now()
    with transaction.atomic():
        won = ServiceAccount.objects.filter(pk=account.pk, deleted_at__isnull=True).update(deleted_at=now) == 1
        if not won:
            return False
        account.deleted_at = now
        tokens = AccessToken.objects.filter(user_id=account.user_id)
        revoked = [token.pk for token in tokens if token_revoke(token=token)]
        Membership.objects.filter(user_id=account.user_id).delete()
        get_user_model().objects.filter(pk=account.user_id).update(is_active=False)
        changes = {"deleted_at": now.isoformat(), "tokens_revoked": revoked, "by": actor.get_username()}
        _audit(account, "delete", changes)
    return True


def service_account_token_create(
    *, account: ServiceAccount, name: str, scopes: Iterable[str], expires_at: datetime | None
) -> tuple[AccessToken, str]:
    """A token of ``account``, scoped to its team; the key is returned this once
    (:func:`accounts.tokens.token_create`). InvalidInput on ``account`` once it is deleted."""
    if account.deleted_at is not None:
        raise InvalidInput.on("account", "This service account is deleted.")
    return token_create(user=account.user, name=name, scopes=scopes, expires_at=expires_at, team=account.team)
