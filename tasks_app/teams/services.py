"""Teams and members: the writes the API, the back office, the admin and the commands call
(personal teams, shared teams, members), each audited in its transaction. The rule they apply is
:mod:`tasks_app.teams`."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from tasks_app.audit import acting_token, audit_record
from tasks_app.models import Membership, Task, Team, TeamRole
from tasks_app.teams import (
    NO_PERSONAL_TEAM,
    is_service_account,
    people,
    require,
    reserved_slug,
)
from tms_core.auth import sees_everything, token_team_id
from tms_core.errors import InvalidInput


def _free_slug(base: str, fallback: str) -> str:
    slug = slugify(base)[:50].strip("-") or fallback
    # A personal team never takes a mapped slug: it would block the team the mapping means.
    if not reserved_slug(slug) and not Team.objects.filter(slug=slug).exists():
        return slug
    return f"{slug[:40]}-{fallback}"


def personal_team_of(user: Any) -> Team:
    """``user``'s personal team, made (with the user as its admin) if they have none yet.

    Safe to call at any time and from two places at once: the one-to-one on ``personal_of``
    decides, and the loser reads the winner's team. A service account has none and gets none: its
    own team stands in for it (what counts per user, a channel's send rate, a quota of before
    teams, counts there).
    """
    team = Team.objects.filter(personal_of_id=user.pk).first()
    if team is not None:
        return team
    if is_service_account(user):
        return Team.objects.get(service_accounts__user_id=user.pk)  # accounts.ServiceAccount.team
    try:
        with transaction.atomic():
            team = Team.objects.create(
                name=user.get_username()[:100],
                slug=_free_slug(user.get_username(), f"user-{user.pk}"),
                personal_of=user,
            )
            Membership.objects.create(team=team, user=user, role=TeamRole.ADMIN)
    except IntegrityError:
        team = Team.objects.get(personal_of_id=user.pk)
    return team


def personal_team_on_user_created(sender: Any, instance: Any, created: bool, raw: bool = False, **kwargs: Any) -> None:
    """post_save receiver of the user model: a new user gets their personal team at once, whatever
    made them (``tms_create_user``, single sign-on, the admin, ``createsuperuser``)."""
    if created and not raw and not getattr(instance, NO_PERSONAL_TEAM, False):
        personal_team_of(instance)


def default_team_of(user: Any) -> Team:
    """Where a create that names no team puts its object: the team of the request's team-scoped
    token, otherwise ``user``'s personal team."""
    restricted = token_team_id(user)
    if restricted is not None:
        return Team.objects.get(pk=restricted)
    return personal_team_of(user)


def team_for_new(user: Any, team: Team | None, *, permission: str, what: str) -> Team:
    """The team a new object of ``user`` goes in (a task, limit, calendar, artifact, notification
    channel or rule): ``team``, where ``user`` needs the editor role (or ``permission``), else
    their default team (:func:`default_team_of`: a team-scoped token's team, or their personal
    team, where they are admin)."""
    team = team if team is not None else default_team_of(user)
    if team.personal_of_id != user.pk:  # in their own personal team everyone is admin
        require(user, team.pk, TeamRole.EDITOR, permission, what=what)
    return team


def _audit_team(team: Team, action: str, *, changes: dict[str, Any] | None = None, detail: str = "") -> None:
    audit_record(
        action=f"team.{action}", object_type="team", object_id=team.pk, owner=None, changes=changes, detail=detail
    )


def team_create(*, creator: Any, name: str, slug: str = "") -> Team:
    """A shared team with ``creator`` as its admin. ``slug`` defaults to one made from ``name``.

    Not through a team-scoped token (nor by a service account): the new team would lie outside
    the token's one team, a way out of its scope (PermissionDenied, 403).

    A team staff create is *managed* (``Team.managed``): only such a team receives the members
    single sign-on's group mapping grants. A slug the mapping names (:func:`reserved_slug`) is
    refused to anyone else (400 on ``slug``), so nobody can squat it and collect the group's
    members; when staff create it and a personal team holds it, the personal team moves to
    another slug (a personal team's slug means nothing to the mapping)."""
    if token_team_id(creator) is not None or is_service_account(creator):
        raise PermissionDenied("A token scoped to one team, or a service account, cannot create teams.")
    name = name.strip()
    if not name:
        raise InvalidInput.on("name", "A team needs a name.")
    # A slug given is kept as given (the API checked it is one); one made from the name is lower case.
    chosen = slug or slugify(name)[:60].strip("-")
    if not re.fullmatch(r"[-a-zA-Z0-9_]{1,60}", chosen):
        raise InvalidInput.on("slug" if slug else "name", "Give a slug of letters, digits, hyphens or underscores.")
    managed = bool(sees_everything(creator))
    if reserved_slug(chosen) and not managed:
        raise InvalidInput.on(
            "slug",
            f"The slug {chosen!r} is named in the single sign-on group mapping (TMS_OIDC_GROUPS): only an "
            "administrator can create that team.",
        )
    try:
        with transaction.atomic():
            if managed and reserved_slug(chosen):
                _free_personal_slug(chosen)
            team = Team.objects.create(name=name[:100], slug=chosen, managed=managed)
            Membership.objects.create(team=team, user=creator, role=TeamRole.ADMIN)
            _audit_team(team, "create", changes={"name": name, "slug": chosen, "managed": managed})
    except IntegrityError:
        raise InvalidInput.on("slug", f"The slug {chosen!r} is taken: choose another.") from None
    return team


def _free_personal_slug(slug: str) -> None:
    """Move the personal team holding ``slug`` (if any) to another slug, audited."""
    personal = Team.objects.select_for_update().filter(slug__iexact=slug, personal_of__isnull=False).first()
    if personal is None:
        return
    moved = f"{slug[:40]}-user-{personal.personal_of_id}"
    Team.objects.filter(pk=personal.pk).update(slug=moved)
    _audit_team(personal, "update", changes={"slug": {"from": personal.slug, "to": moved}}, detail="mapped slug freed")


def team_set_managed(*, team: Team, managed: bool) -> Team:
    """Mark ``team`` as made by administrators (or not): only a managed team receives single
    sign-on's group grants. For a team made before the flag existed, after checking who runs it
    (``tms_team_managed``). A personal team cannot be managed (it has one member)."""
    if team.personal:
        raise InvalidInput.on("slug", f"{team.slug!r} is a personal team: it cannot receive group grants.")
    with transaction.atomic():
        won = Team.objects.filter(pk=team.pk).exclude(managed=managed).update(managed=managed)
        if won:
            _audit_team(team, "update", changes={"managed": {"from": not managed, "to": managed}})
    team.managed = managed
    return team


def team_rename(*, team: Team, name: str) -> Team:
    """Give ``team`` a new display name (its slug stays: it is how tokens and URLs name it)."""
    name = name.strip()
    if not name:
        raise InvalidInput.on("name", "A team needs a name.")
    with transaction.atomic():
        before = team.name
        team.name = name[:100]
        team.save(update_fields=["name"])
        _audit_team(team, "update", changes={"name": {"from": before, "to": team.name}})
    return team


def team_delete(*, team: Team) -> None:
    """Delete a shared team that holds no task (deleted tasks included: their history is the
    team's), and no limit, calendar, artifact, notification channel or rule. A personal team is
    never deleted (it goes with its user)."""
    if team.personal:
        raise InvalidInput.on("team", "A personal team cannot be deleted.")
    with transaction.atomic():
        locked = Team.objects.select_for_update().get(pk=team.pk)
        held = Task.objects.filter(team_id=locked.pk).count()
        if held:
            raise InvalidInput.on(
                "team",
                f"The team still holds {held} task(s) (deleted ones keep their history here): "
                "move or delete them first.",
            )
        # What else a team owns (the notification app's through the relations it declares here).
        owned = {
            "limit(s)": locked.limits.count(),
            "calendar(s)": locked.calendars.count(),
            "artifact(s)": locked.artifacts.count(),
            "notification channel(s)": locked.notification_channels.count(),
            "notification rule(s)": locked.notification_rules.count(),
        }
        left = ", ".join(f"{count} {what}" for what, count in owned.items() if count)
        if left:
            raise InvalidInput.on("team", f"The team still holds {left}: delete them first.")
        robots = Membership.objects.filter(team=locked).count() - people(Membership.objects.filter(team=locked)).count()
        if robots:
            raise InvalidInput.on(
                "team",
                f"The team still has {robots} service account(s): delete them first (that revokes their tokens).",
            )
        _audit_team(locked, "delete", changes={"name": locked.name, "slug": locked.slug})
        locked.delete()


def _user_named(username: Any) -> Any:
    user = get_user_model().objects.filter(username=str(username)).first()
    if user is None or not user.is_active:
        raise InvalidInput.on("username", f"No active user {username!r}.")
    if is_service_account(user):
        raise InvalidInput.on(
            "username",
            f"{username!r} is a service account: it belongs to its own team only, with the role it was made with.",
        )
    return user


def _admins_left(team: Team, *, without: int) -> int:
    return Membership.objects.filter(team=team, role=TeamRole.ADMIN).exclude(user_id=without).count()


def member_set(*, team: Team, username: Any, role: str, sso: bool = False) -> Membership:
    """Add ``username`` to ``team`` with ``role``, or change their role. The last admin cannot be
    demoted (the team would have nobody to manage it); a personal team has no other members.

    Through a personal access token the admin role cannot be granted (PermissionDenied, 403), and
    the membership records the token (``created_by_token``: :func:`accounts.tokens.token_made`).

    By hand (``sso`` False: the API, the back office), a membership single sign-on manages is taken
    over: it is the hand's from then on, and sign-ins leave it alone. With ``sso`` (the sign-in's
    sync, :func:`accounts.sso.sync_team_memberships`), a new membership is marked as SSO's, a
    membership added by hand is left exactly as it is, and the last-admin rule does not hold: the
    provider's groups are the truth for what they granted, and a role the provider took away must
    go even when it leaves the team without an admin (staff with ``tasks_app.change_team`` can then
    name one, and the next sign-in of someone still in the admins' group restores one).
    """
    if role not in TeamRole.values:
        raise InvalidInput.on("role", f"One of: {', '.join(TeamRole.values)}.")
    token_id = None if sso else acting_token()
    if token_id is not None and role == TeamRole.ADMIN:
        # An admin may add admins, who may add admins: through a token, a grant that outlives the
        # token's expiry and revocation. Admins are made by someone signed in (or an account key).
        raise PermissionDenied(
            "A personal access token cannot grant the team admin role: sign in (the back office), or use your "
            "account key."
        )
    user = _user_named(username)
    if team.personal and user.pk != team.personal_of_id:
        raise InvalidInput.on("username", "A personal team has one member, its user: create a team to share tasks.")
    with transaction.atomic():
        # The team's row serialises its membership changes, so two demotions at once cannot
        # both see another admin left.
        Team.objects.select_for_update().filter(pk=team.pk).first()
        membership = Membership.objects.filter(team=team, user=user).first()
        if sso and membership is not None and not membership.sso:
            return membership  # added by hand: never the sync's to change
        if membership is not None and membership.role == role and membership.sso == sso:
            return membership
        if (
            not sso
            and membership is not None
            and membership.role == TeamRole.ADMIN
            and role != TeamRole.ADMIN
            and not _admins_left(team, without=user.pk)
        ):
            raise InvalidInput.on("role", "This is the team's last admin: make another member admin first.")
        before = membership.role if membership is not None else None
        changes: dict[str, Any] = {"username": user.get_username(), "role": {"from": before, "to": role}}
        if membership is None:
            membership = Membership.objects.create(team=team, user=user, role=role, sso=sso, created_by_token=token_id)
        else:
            if membership.sso != sso:
                changes["sso"] = {"from": membership.sso, "to": sso}
            # The role set now is the grant of whoever set it: a token's (listed and undone with
            # it), or no token's.
            membership.role, membership.sso, membership.created_by_token = role, sso, token_id
            membership.save(update_fields=["role", "sso", "created_by_token"])
        if sso:
            changes["sso"] = True
        _audit_team(team, "member", changes=changes, detail=_sso_detail(team, sso, before, role))
    return membership


def _sso_detail(team: Team, sso: bool, before: str | None, after: str | None) -> str:
    if not sso:
        return ""
    if before == TeamRole.ADMIN and after != TeamRole.ADMIN and not _admins_left_now(team):
        return "single sign-on: the provider's groups no longer grant admin; the team has no admin now"
    return "single sign-on: from the provider's groups"


def _admins_left_now(team: Team) -> bool:
    return Membership.objects.filter(team=team, role=TeamRole.ADMIN).exists()


def member_remove(*, team: Team, username: Any, sso: bool = False) -> None:
    """Remove ``username`` from ``team``; never its last admin.

    With ``sso`` (the sign-in's sync), only a membership single sign-on manages is removed (one
    added by hand stays, and this is a no-op), and the last-admin rule does not hold (see
    :func:`member_set`)."""
    user = get_user_model().objects.filter(username=str(username)).first()
    with transaction.atomic():
        Team.objects.select_for_update().filter(pk=team.pk).first()
        membership = Membership.objects.filter(team=team, user=user).first() if user is not None else None
        if membership is None:
            if sso:
                return
            raise InvalidInput.on("username", f"{username!r} is not a member of this team.")
        if sso and not membership.sso:
            return  # added by hand: never the sync's to remove
        if is_service_account(membership.user):
            raise InvalidInput.on("username", f"{username!r} is a service account: delete the service account instead.")
        if not sso and membership.role == TeamRole.ADMIN and not _admins_left(team, without=membership.user_id):
            raise InvalidInput.on("username", "This is the team's last admin: make another member admin first.")
        membership.delete()
        changes: dict[str, Any] = {"username": str(username), "role": {"from": membership.role, "to": None}}
        if sso:
            changes["sso"] = True
        _audit_team(team, "member", changes=changes, detail=_sso_detail(team, sso, membership.role, None))
