"""The API side of :mod:`tasks_app.teams`: views over tasks and their runs see the caller's
teams' rows (every team's for staff) and check the caller's role before a write."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request

from tasks_app.models import TeamRole
from tasks_app.teams import require, scope_to_teams
from tms_core.api.base import OwnerScopedMixin


class TeamScopedMixin(OwnerScopedMixin):
    """:class:`~tms_core.api.base.OwnerScopedMixin` by team instead of by owner.

    A row of a team the caller is not in answers 404. A write needs the operator role for the
    actions named in ``operator_actions`` (run, pause, cancel, ...) and the editor role for every
    other (change, delete), in the row's team; or the model's permission
    (:func:`tasks_app.teams.may`). ``team_field`` names the column with the row's team id.
    """

    team_field: str = "team_id"
    operator_actions: frozenset[str] = frozenset()

    def owner_scope(self, queryset: QuerySet, owner_field: str = "owner") -> QuerySet:
        if getattr(self, "swagger_fake_view", False):
            return queryset.none()
        return scope_to_teams(queryset, self.request.user, self.team_field)

    def check_object_permissions(self, request: Request, obj: Any) -> None:
        # DRF's own checks (permission classes), not the owner rule this replaces.
        super(OwnerScopedMixin, self).check_object_permissions(request, obj)
        if request.method in SAFE_METHODS:
            return
        self.require_role(obj, self.role_needed())

    def role_needed(self) -> str:
        return TeamRole.OPERATOR if getattr(self, "action", None) in self.operator_actions else TeamRole.EDITOR

    def require_role(self, obj: Any, role: str) -> None:
        """PermissionDenied (403) unless the caller holds ``role`` in ``obj``'s team."""
        meta = obj._meta
        verb = "delete" if self.request.method == "DELETE" else "change"
        what = f"this {meta.verbose_name}"
        require(
            self.request.user,
            getattr(obj, self.team_field),
            role,
            f"{meta.app_label}.{verb}_{meta.model_name}",
            what=what,
        )


TEAM_FILTER_HELP = "Only those of this team (its slug or id); one you are not a member of is a 400 on `team`."


def filter_by_team(queryset: QuerySet, request: Any, value: str, team_field: str = "team_id") -> QuerySet:
    """``?team=``: ``queryset`` narrowed to one of the caller's teams; a team they are not in (or
    that does not exist) is a 400 on ``team``, not an empty list that would look like "no tasks"."""
    from rest_framework.exceptions import ValidationError

    from tasks_app.teams import team_resolve
    from tms_core.errors import InvalidInput

    try:
        team = team_resolve(request.user, value)
    except InvalidInput as exc:
        raise ValidationError(exc.errors) from None
    return queryset.filter(**{team_field: team.pk})
