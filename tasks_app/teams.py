"""Teams and roles: who sees and who may act on a task and its runs. The one rule the API, the back
office and the admin share.

* A user **sees** the tasks (and executions) of the teams they are a member of; staff see every
  team's (read-only "support", :mod:`tms_core.roles`).
* A member **acts** by their role in the object's team; each role includes the ones before it:

  ============  ============================================================================
  viewer        read
  operator      run now, pause, resume, cancel, retry, backfill, trigger, replay (with ``input``)
  editor        create, change, move between teams, delete; a run's own ``config`` (replay)
  admin         manage the team's members and its name
  ============  ============================================================================

* Anyone with the model permission an action names (``tasks_app.change_task``, ...; superusers
  have them all) may act on what they see, as the admin always allowed: so support staff act only
  where an operator granted them a permission.

An object the user may not see answers 404 (exactly as a missing one); one they see but whose
role is too low, 403 with a message naming the role needed.

Every user has a personal team (:func:`personal_team_of`), made with the user
(:func:`personal_team_on_user_created`) and by migration for users that existed before teams:
alone in it, as its admin, each user sees and does exactly what they did when tasks belonged to
users. Service accounts (:mod:`accounts.service_accounts`) have none: they belong to one team.

**A team-scoped access token** narrows all of this to its one team
(:func:`tms_core.auth.restrict_to_team` marks the request's user object): the user is a member of
that team only, staff included (their see-all goes), and a model permission acts only there. It
never raises a role: the user's role in that team still decides.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils.text import slugify

from tasks_app.audit import acting_token, audit_record
from tasks_app.models import Membership, Task, Team, TeamRole
from tms_core.auth import sees_everything, token_team_id
from tms_core.errors import InvalidInput, RoleRequired

#: Each role's rank: a role includes every role of a lower rank.
RANK = {TeamRole.VIEWER: 0, TeamRole.OPERATOR: 1, TeamRole.EDITOR: 2, TeamRole.ADMIN: 3}

#: What each role adds, for messages and the docs.
ROLE_DOES = {
    TeamRole.VIEWER: "read",
    TeamRole.OPERATOR: "run, pause, resume, cancel, retry, backfill, trigger and replay",
    TeamRole.EDITOR: "create, change, move and delete tasks, and change the team's limits, calendars, artifacts and "
    "notifications",
    TeamRole.ADMIN: "manage the team's members",
}


def _memberships(user: Any) -> QuerySet[Membership]:
    """``user``'s memberships: all of them, or the one of the team their token is scoped to."""
    memberships = Membership.objects.filter(user_id=user.pk)
    restricted = token_team_id(user)
    return memberships if restricted is None else memberships.filter(team_id=restricted)


def member_team_ids(user: Any) -> QuerySet[Membership, Any]:
    """The ids of the teams ``user`` is a member of, as a subquery (``team_id__in=...``); only the
    token's team for a request with a team-scoped token."""
    return _memberships(user).order_by().values("team_id")


def sees_all(user: Any) -> bool:
    """Staff see every team's objects (read-only unless granted permissions); not through a
    team-scoped token (:func:`tms_core.auth.sees_everything`)."""
    return sees_everything(user)


def outside_token_team(user: Any, team_id: Any) -> bool:
    """Whether ``user``'s request has a team-scoped token and ``team_id`` is another team."""
    restricted = token_team_id(user)
    return restricted is not None and (team_id is None or int(team_id) != restricted)


def scope_to_teams(queryset: QuerySet, user: Any, team_field: str = "team_id") -> QuerySet:
    """``queryset`` narrowed to the objects of ``user``'s teams (all of it for staff);
    ``team_field`` names the column holding the team's id (``team_id`` on tasks and executions).

    The team ids are read first (one indexed query) and given to the list's query as values:
    PostgreSQL then estimates how many rows they hold from its statistics and picks the index
    that serves. With the ids as a subquery (an InitPlan) it could not, assumed every row
    matched, and read a small team's task list along the newest-first index of all tasks: 90,000
    other rows filtered away for 51, 190 ms at 100,000 tasks."""
    if sees_all(user):
        return queryset
    ids = list(member_team_ids(user).values_list("team_id", flat=True))
    return queryset.filter(**{f"{team_field}__in": ids})


def visible_tasks(user: Any) -> QuerySet[Task]:
    """Tasks ``user`` may see; deleted ones are gone, as everywhere."""
    from tasks_app.models import TaskStatus

    return scope_to_teams(Task.objects.exclude(status=TaskStatus.DELETED), user)


def visible_teams(user: Any) -> QuerySet[Team]:
    """The teams ``user`` is a member of (every team for staff), each with ``caller_role``."""
    teams = Team.objects.all() if sees_all(user) else Team.objects.filter(pk__in=member_team_ids(user))
    return with_role(teams, user, "id")


def teams_with_role(user: Any, role: str) -> QuerySet[Team]:
    """The teams where ``user`` holds ``role`` or a higher one (what the back office offers in a
    new object's team menu)."""
    held = [name for name, rank in RANK.items() if rank >= RANK[TeamRole(role)]]
    # Through the memberships the token allows (a team-scoped token: its team only).
    return Team.objects.filter(pk__in=_memberships(user).filter(role__in=held).values("team_id"))


def role_in(user: Any, team_id: Any) -> str | None:
    """``user``'s role in the team, or None when they are not a member (one indexed read: a role
    is never remembered, so a change applies to the very next request)."""
    if team_id is None or not getattr(user, "is_authenticated", False) or outside_token_team(user, team_id):
        return None
    return Membership.objects.filter(user_id=user.pk, team_id=team_id).values_list("role", flat=True).first()


def with_role(queryset: QuerySet, user: Any, team_field: str = "team_id") -> QuerySet:
    """``queryset`` with ``caller_role``: ``user``'s role in each row's team (None: not a member),
    read in the same query (a page that shows one task and its buttons reads the role for free)."""
    role = _memberships(user).filter(team_id=OuterRef(team_field)).values("role")[:1]
    return queryset.annotate(caller_role=Subquery(role))


def includes(held: str | None, role: str) -> bool:
    """Whether a member holding ``held`` (None: not a member) has ``role``."""
    return held is not None and RANK[TeamRole(held)] >= RANK[TeamRole(role)]


def has_role(user: Any, team_id: Any, role: str) -> bool:
    """Whether ``user`` holds ``role`` (or a higher one) in the team."""
    return includes(role_in(user, team_id), role)


def may(user: Any, team_id: Any, role: str, permission: str) -> bool:
    """Whether ``user`` may do what needs ``role`` on an object of the team: by their role, or
    anywhere they see with ``permission`` (superusers, and staff an operator granted it). Through
    a team-scoped token, nothing outside its team (a permission does not reach past the scope)."""
    if outside_token_team(user, team_id):
        return False
    return has_role(user, team_id, role) or bool(user.has_perm(permission))


def require(user: Any, team_id: Any, role: str, permission: str, *, what: str = "this task") -> None:
    """:func:`may`, or :class:`~tms_core.errors.RoleRequired` (a 403) naming the role needed."""
    if not may(user, team_id, role, permission):
        held = role_in(user, team_id)
        if held is None:
            message = f"You may look at {what} but not change it."
        else:
            message = f"Your role in this team is {held}: to {ROLE_DOES[TeamRole(role)]} you need {role} or higher."
        raise RoleRequired(message, role=role, held=held)


def require_config_change(user: Any, team_id: Any, *, what: str = "these runs") -> None:
    """:class:`~tms_core.errors.RoleRequired` (a 403) naming the role needed, unless ``user`` may change what a run of
    the team's tasks does: its runner ``config`` (a task's, or a replay's override laid over it).

    That is an editor's act wherever it happens (a task's change, a replay): an operator runs the
    tasks as they are and may give a run its ``input`` only (which the task's editors bound with
    ``input_schema`` and ``input_fills``). The model permission ``tasks_app.change_task`` stands
    for the role, as for a task's change."""
    if may(user, team_id, TeamRole.EDITOR, "tasks_app.change_task"):
        return
    held = role_in(user, team_id)
    if held is None:
        raise RoleRequired(
            f"You may run {what} but not change what they do (`config`): that needs editor.",
            role=TeamRole.EDITOR,
            held=None,
        )
    raise RoleRequired(
        f"Your role in this team is {held}: `config` changes what {what} do, which needs editor or higher "
        "(an operator may give `input` only).",
        role=TeamRole.EDITOR,
        held=held,
    )


# -- Teams and members (the services the API, the back office and the commands call) -------------


#: Returns the team slugs single sign-on's group mapping names (``TMS_OIDC_GROUPS``), lower case.
#: accounts (above this module) registers the reader at start-up (:func:`register_reserved_slugs`).
_reserved_slugs: Callable[[], frozenset[str]] = frozenset


def register_reserved_slugs(reader: Callable[[], frozenset[str]]) -> None:
    """Make ``reader`` the source of the slugs only administrators may give a team."""
    global _reserved_slugs
    _reserved_slugs = reader


def reserved_slug(slug: str) -> bool:
    """Whether ``slug`` is one the group mapping names (only an administrator's team may hold it)."""
    return slug.lower() in _reserved_slugs()


def _free_slug(base: str, fallback: str) -> str:
    slug = slugify(base)[:50].strip("-") or fallback
    # A personal team never takes a mapped slug: it would block the team the mapping means.
    if not reserved_slug(slug) and not Team.objects.filter(slug=slug).exists():
        return slug
    return f"{slug[:40]}-{fallback}"


#: Set (True) on a user object before its first save to make it without a personal team: a
#: service account (:mod:`accounts.service_accounts`) belongs to its one team only.
NO_PERSONAL_TEAM = "tms_no_personal_team"

#: The reverse name of ``accounts.ServiceAccount.user``. The team rule asks it by name (an ORM
#: lookup, not an import: accounts sits above tasks_app) to keep service accounts out of the
#: places meant for people: personal teams, the member lists and the member services.
SERVICE_ACCOUNT = "service_account"


def is_service_account(user: Any) -> bool:
    """Whether ``user`` is a team's service account (one query; a flag set before the first save
    answers without one)."""
    if getattr(user, NO_PERSONAL_TEAM, False):
        return True
    if user.pk is None:
        return False
    return get_user_model().objects.filter(pk=user.pk, **{f"{SERVICE_ACCOUNT}__isnull": False}).exists()


def people(queryset: QuerySet[Membership]) -> QuerySet[Membership]:
    """``queryset`` of memberships without those of service accounts (listed on their own)."""
    return queryset.filter(**{f"user__{SERVICE_ACCOUNT}__isnull": True})


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


def team_resolve(user: Any, value: Any, *, field: str = "team", members_only: bool = False) -> Team:
    """The team ``value`` names (a slug, or an id) among ``user``'s teams (any team for staff,
    unless ``members_only``; only its team through a team-scoped token); InvalidInput on ``field``
    otherwise, the same for a team that does not exist and one the user is not in (so the answer
    tells nothing about other teams)."""
    everyone = sees_all(user) and not members_only
    teams = Team.objects.all() if everyone else Team.objects.filter(pk__in=member_team_ids(user))
    text = str(value).strip()
    found = None
    if text.isdigit() and len(text) <= 9:
        found = teams.filter(pk=int(text)).first()
    if found is None and text:
        found = teams.filter(slug=text).first()
    if found is None:
        scoped = " (this token may use its own team only)" if token_team_id(user) is not None else ""
        raise InvalidInput.on(
            field, f"No team {text!r} of yours: give the slug or id of a team you are a member of{scoped}."
        )
    return found


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
