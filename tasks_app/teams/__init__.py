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

This package is the team concept's home in the domain: the models are ``tasks_app.models``'
``Team``, ``Membership`` and ``TeamRole`` (Django's place for the app's models); this module is
the rule (the reads: who sees what, roles, the team a request names); :mod:`.services` holds the
writes (personal teams, creating, renaming and deleting teams, members). The API over it is
:mod:`teams_api`, the pages ``backoffice/team_views.py``, the admin ``accounts/admin.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import OuterRef, QuerySet, Subquery

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
