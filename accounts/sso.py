"""Users from an OpenID Connect provider's claims (the service behind :mod:`accounts.oidc`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import OidcIdentity
from accounts.roles import STAFF, SUPERUSER
from tms_core.roles import ensure_support_group


class SsoRefused(Exception):
    """The provider vouched for this person, but TMS will not sign them in; says why."""


def claim_groups(claims: Mapping[str, Any], groups_claim: str) -> list[str]:
    """The groups claim as a sorted list of strings (providers send a list, or one string)."""
    value = claims.get(groups_claim) if groups_claim else None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        return []
    return sorted({str(group) for group in value})


def roles_for_groups(groups: list[str], group_roles: Mapping[str, str]) -> set[str]:
    """The roles ``TMS_OIDC_GROUPS`` grants to a member of ``groups``."""
    return {group_roles[group] for group in groups if group in group_roles}


def _username(claims: Mapping[str, Any], username_claim: str) -> str:
    for value in (claims.get(username_claim), claims.get("email"), claims.get("sub")):
        if isinstance(value, str) and value.strip():
            return value.strip()[:150]
    raise SsoRefused("the provider sent no username, e-mail or subject.")


def oidc_user_sync(
    *,
    issuer: str,
    claims: Mapping[str, Any],
    username_claim: str,
    groups_claim: str,
    group_roles: Mapping[str, str],
) -> AbstractUser:
    """The user whose identity at ``issuer`` is ``claims["sub"]``, created on the first sign-in and
    brought up to date with the claims on every one.

    The user is found by (issuer, subject) only, never by e-mail or username. A new user is named
    after ``username_claim`` (else the e-mail, else the subject) and gets no usable password. When
    ``group_roles`` is set, the staff and superuser flags (and, for staff, the read-only support
    group) follow the groups claim at each sign-in (a user who left the group loses them); when it
    is empty they are left as an operator set them. Raises :class:`SsoRefused` when the username is
    taken by another account: an operator links that account by adding an
    :class:`~accounts.models.OidcIdentity` to it in the admin.
    """
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject or not issuer:
        raise SsoRefused("the provider's answer has no issuer or subject.")
    user_model = get_user_model()
    username = _username(claims, username_claim)
    groups = claim_groups(claims, groups_claim)
    with transaction.atomic():
        identity = (
            OidcIdentity.objects.select_for_update()
            .select_related("user")
            .filter(issuer=issuer, subject=subject)
            .first()
        )
        if identity is None:
            if user_model.objects.filter(username__iexact=username).exists():
                raise SsoRefused(
                    f"The username {username!r} belongs to an account that is not linked to this sign-in. "
                    "An administrator can link it (Accounts > OIDC identities in the admin)."
                )
            try:
                with transaction.atomic():
                    user = user_model.objects.create_user(username=username, email=claims.get("email") or "")
                    identity = OidcIdentity.objects.create(user=user, issuer=issuer, subject=subject)
            except IntegrityError:
                # The same person's first sign-in from two tabs at once: the other one made the user.
                identity = (
                    OidcIdentity.objects.select_for_update().select_related("user").get(issuer=issuer, subject=subject)
                )
        user = identity.user
        if (
            username != user.username
            and not user_model.objects.filter(username__iexact=username).exclude(pk=user.pk).exists()
        ):
            user.username = username  # renamed at the provider; kept if the new name is taken here
        email = claims.get("email")
        if isinstance(email, str):
            user.email = email
        for field, claim in (("first_name", "given_name"), ("last_name", "family_name")):
            value = claims.get(claim)
            if isinstance(value, str):
                setattr(user, field, value[:150])
        roles = roles_for_groups(groups, group_roles) if group_roles else None
        if roles is not None:
            user.is_superuser = SUPERUSER in roles
            # The admin lets only staff in, so a superuser is staff too.
            user.is_staff = bool(roles & {STAFF, SUPERUSER})
        user.save()
        if roles is not None:
            # Staff are read-only support in the admin through the support group, as
            # ``tms_create_user --staff`` makes them (tms_core.roles); leaving the role leaves it.
            support = ensure_support_group()
            if support is not None:
                (user.groups.add if STAFF in roles else user.groups.remove)(support)
        identity.last_login_at = timezone.now()
        identity.groups = groups
        identity.save(update_fields=["last_login_at", "groups"])
    return user
