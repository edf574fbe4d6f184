"""Users from an OpenID Connect provider's claims (the service behind :mod:`accounts.oidc`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import OidcIdentity
from accounts.roles import STAFF, SUPERUSER, RoleError, TeamGrant, parse_role
from accounts.support_group import ensure_support_group
from tasks_app.audit import audit_context, current_context
from tasks_app.models import Membership, Team
from tasks_app.teams.services import member_remove, member_set

logger = logging.getLogger(__name__)


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
    """The flag roles (staff, superuser) ``TMS_OIDC_GROUPS`` grants to a member of ``groups``."""
    return {group_roles[group] for group in groups if group_roles.get(group) in (STAFF, SUPERUSER)}


def team_roles_for_groups(groups: list[str], group_roles: Mapping[str, str]) -> dict[str, str]:
    """The team roles ``TMS_OIDC_GROUPS`` grants to a member of ``groups``: team slug -> role, the
    highest when several of the groups map to one team (``ops=team:ops:operator`` and
    ``ops-leads=team:ops:admin``: a member of both is admin)."""
    best: dict[str, TeamGrant] = {}
    for group in groups:
        if group not in group_roles:
            continue
        grant = parse_role(group_roles[group])  # checked at start-up: cannot raise here
        if isinstance(grant, TeamGrant) and (grant.slug not in best or grant.rank > best[grant.slug].rank):
            best[grant.slug] = grant
    return {slug: grant.role for slug, grant in best.items()}


def mapped_team_slugs() -> frozenset[str]:
    """The team slugs ``TMS_OIDC_GROUPS`` names (lower case), read from the settings at each call
    (so a test's settings count): only a team an administrator made may hold one
    (:func:`tasks_app.teams.reserved_slug`)."""
    config = getattr(settings, "TMS_OIDC", {}) or {}
    slugs = set()
    for role in (config.get("GROUPS") or {}).values():
        try:
            grant = parse_role(role)
        except RoleError:  # start-up refuses these; nothing to reserve
            continue
        if isinstance(grant, TeamGrant):
            slugs.add(grant.slug.lower())
    return frozenset(slugs)


def sync_team_memberships(user: AbstractUser, groups: list[str], group_roles: Mapping[str, str]) -> dict[str, str]:
    """Bring ``user``'s single sign-on memberships in step with their groups; returns what they
    hold now by SSO (team slug -> role).

    * A team a group grants gets the user as a member with the highest role granted
      (:func:`team_roles_for_groups`), added or changed; a membership SSO manages whose team no
      group grants any more is removed.
    * A membership added by hand (``Membership.sso`` False: the API, the back office, a command,
      the user's personal team) is never added to, changed or removed: the provider manages what it
      granted, people what they granted.
    * A team that does not exist is not created: the grant is skipped with a warning (logger
      ``accounts.sso``) and the sign-in goes on. A team has a name and admins that people choose,
      and the slug in the setting is checked only for its shape, so a typo would otherwise make a
      team nobody asked for. A personal team is skipped the same way (it has one member).
    * Only a team an administrator made (``Team.managed``: staff created it, or
      ``tms_team_managed`` marked it) receives grants. A team any user made under a mapped slug is
      skipped with a warning: otherwise whoever made it first would collect the group's members
      and, as its admin, see and manage them.
    * The last-admin rule does not stop a removal or a demotion here (:func:`tasks_app.teams.services.member_set`).

    Every change goes through :func:`~tasks_app.teams.services.member_set` /
    :func:`~tasks_app.teams.services.member_remove`, audited with the source ``sso`` and the user as actor.
    Teams are changed in id order, so two sign-ins at once lock them in the same order.
    """
    wanted = team_roles_for_groups(groups, group_roles)
    found = {team.slug: team for team in Team.objects.filter(slug__in=list(wanted))}
    for slug in sorted(wanted):
        team = found.get(slug)
        if team is None or team.personal or not team.managed:
            if team is None:
                why = "there is no team with that slug (create it first)"
            elif team.personal:
                why = "it is a personal team"
            else:
                why = (
                    "the team was not made by an administrator (a user's team under a mapped slug gets no group "
                    "members; an administrator who vouches for it runs `manage.py tms_team_managed <slug>`)"
                )
            logger.warning(
                "single sign-on: %s's groups grant %s of team %r, which is skipped: %s.",
                user.get_username(),
                wanted[slug],
                slug,
                why,
            )
            found.pop(slug, None)
    held = {m.team_id: m for m in Membership.objects.filter(user_id=user.pk, sso=True).select_related("team")}
    changes: dict[int, tuple[Team, str | None]] = {pk: (m.team, None) for pk, m in held.items()}
    for slug, team in found.items():
        changes[team.pk] = (team, wanted[slug])
    context = current_context()
    username = user.get_username()
    with audit_context(source="sso", actor=user, remote_addr=context.remote_addr if context is not None else None):
        for pk in sorted(changes):
            team, role = changes[pk]
            if role is None:
                member_remove(team=team, username=username, sso=True)
            elif pk not in held or held[pk].role != role:
                member_set(team=team, username=username, role=role, sso=True)
    return dict(Membership.objects.filter(user_id=user.pk, sso=True).values_list("team__slug", "role"))


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
    is empty they are left as an operator set them. With it set, the user's team memberships that
    single sign-on manages follow the groups too (:func:`sync_team_memberships`). Raises
    :class:`SsoRefused` when the username is taken by another account: an operator links that
    account by adding an :class:`~accounts.models.OidcIdentity` to it in the admin.
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
        if group_roles:
            sync_team_memberships(user, groups, group_roles)
        identity.last_login_at = timezone.now()
        identity.groups = groups
        identity.save(update_fields=["last_login_at", "groups"])
    return user
