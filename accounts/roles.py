"""What an identity provider's group may grant (``TMS_OIDC_GROUPS``: group -> role).

* ``staff``: read-only support (sees everyone's tasks and runs, as the staff flag does);
* ``superuser``: everything, the admin included;
* ``team:<slug>:<role>``: membership of the team whose slug is ``<slug>`` with ``<role>``, one of
  :data:`TEAM_ROLES` (viewer, operator, editor, admin: :mod:`tasks_app.teams`). The team must exist
  when the user signs in (the sign-in never creates one: see :mod:`accounts.sso`).

:func:`parse_role` reads one value and refuses what it cannot use, so a mistyped role stops
start-up (:mod:`tms_project.oidc_config`) instead of failing a sign-in. No Django import here: the
settings read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STAFF = "staff"
SUPERUSER = "superuser"
#: The roles that set the user's flags.
ROLES = frozenset({STAFF, SUPERUSER})
#: A team role, lowest first: tasks_app.models.TeamRole's values (a test keeps them equal).
TEAM_ROLES = ("viewer", "operator", "editor", "admin")
TEAM_PREFIX = "team:"
#: A team's slug as tasks_app.teams.services.team_create accepts it.
SLUG_RE = re.compile(r"[-a-zA-Z0-9_]{1,60}")


class RoleError(ValueError):
    """A ``TMS_OIDC_GROUPS`` value that is not a role; the message says what one looks like."""


@dataclass(frozen=True)
class TeamGrant:
    """Membership of the team ``slug`` with ``role`` (a value of :data:`TEAM_ROLES`)."""

    slug: str
    role: str

    @property
    def rank(self) -> int:
        return TEAM_ROLES.index(self.role)


def parse_role(value: str) -> str | TeamGrant:
    """``staff`` or ``superuser`` as is, ``team:<slug>:<role>`` as a :class:`TeamGrant`;
    :class:`RoleError` for anything else."""
    value = value.strip()
    if value in ROLES:
        return value
    if not value.startswith(TEAM_PREFIX):
        raise RoleError(
            f"{value!r}, which is not a role (roles: {', '.join(sorted(ROLES))}, or team:<slug>:<role> "
            f"with a role of {', '.join(TEAM_ROLES)})"
        )
    parts = value[len(TEAM_PREFIX) :].split(":")
    if len(parts) != 2:
        raise RoleError(f"{value!r}, which is not team:<slug>:<role> (e.g. team:ops:operator)")
    slug, role = (part.strip() for part in parts)
    if not SLUG_RE.fullmatch(slug):
        raise RoleError(f"{value!r}, whose team slug {slug!r} is not letters, digits, hyphens or underscores")
    if role not in TEAM_ROLES:
        raise RoleError(f"{value!r}, whose team role {role!r} is not one of {', '.join(TEAM_ROLES)}")
    return TeamGrant(slug=slug, role=role)
