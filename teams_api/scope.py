"""The REST side of the team rule (:mod:`tasks_app.teams`), shared by every API over team-owned rows
(tasks, runs, limits, calendars, artifacts, notifications): views see the caller's teams' rows
(every team's for staff) and check the caller's role before a write; the ``team`` field and
``?team=``."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request

from tasks_app.models import Team, TeamRole
from tasks_app.teams import require, scope_to_teams, team_resolve
from tms_core.api.base import OwnerScopedMixin, StrictFilterSet
from tms_core.errors import InvalidInput


class TeamScopedMixin(OwnerScopedMixin):
    """:class:`~tms_core.api.base.OwnerScopedMixin` by team instead of by owner.

    A row of a team the caller is not in answers 404. A write needs the operator role for the
    actions named in ``operator_actions`` (run, pause, cancel, ...) and the editor role for every
    other (change, delete), in the row's team; or the model's permission
    (:func:`tasks_app.teams.may`). ``team_field`` names the column with the row's team id.
    """

    team_field: str = "team_id"
    operator_actions: frozenset[str] = frozenset()

    def visible_rows(self, queryset: QuerySet, owner_field: str) -> QuerySet:
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


class TeamOwnedMixin(TeamScopedMixin):
    """Views over what a team owns besides tasks: named limits, calendars, artifacts, notification
    channels and rules. Members read them; writing needs the editor role in the object's team (or
    the model's permission); a non-member gets 404. The list takes ``?team=`` (400 on ``team`` for
    a team the caller is not in). A create goes in the team given (editor there), by default the
    caller's personal team: the services decide (:func:`tasks_app.teams.services.team_for_new`). An object
    never changes team (:func:`refuse_team_change`)."""

    def get_queryset(self) -> QuerySet:
        queryset = super().get_queryset()
        value = self.request.query_params.get("team") if getattr(self, "action", None) == "list" else None
        filterset = getattr(self, "filterset_class", None)
        # A view whose filter set has ``team`` filters there (and documents it).
        if value is not None and "team" not in getattr(filterset, "base_filters", ()):
            queryset = filter_by_team(queryset, self.request, value, self.team_field)
        return queryset


@extend_schema_field({"oneOf": [{"type": "string", "maxLength": 60}, {"type": "integer"}]})
class TeamRefField(serializers.Field):
    """A team by slug or id, among the caller's teams (:func:`tasks_app.teams.team_resolve`):
    one they are not in reads as one that does not exist. Shown as the team's id."""

    default_error_messages = {"invalid": "The slug or id of one of your teams."}

    def to_internal_value(self, data: Any) -> Team:
        if isinstance(data, bool) or not isinstance(data, str | int) or len(str(data)) > 60:
            self.fail("invalid")
        request = self.context.get("request")
        if request is None:  # pragma: no cover - the views always pass the request
            self.fail("invalid")
        try:
            return team_resolve(request.user, data)
        except InvalidInput as exc:
            raise serializers.ValidationError(exc.errors["team"]) from None

    def get_attribute(self, instance: Any) -> Any:
        # The id column: no query for the team's row.
        return getattr(instance, f"{self.source}_id", None)

    def to_representation(self, value: Any) -> Any:
        return getattr(value, "pk", value)


def team_field(what: str) -> TeamRefField:
    """The ``team`` field of a serializer of team-owned objects: written once, at creation."""
    return TeamRefField(
        required=False,
        help_text=f"The team {what} belongs to, by slug or id (default: your personal team; you need the editor "
        "role there). Members of the team see it; it cannot move to another team.",
    )


def refuse_team_change(data: dict[str, Any], what: str) -> None:
    """A PATCH naming ``team``: a 400 on it, since objects other than tasks stay in their team
    (a task of the old team might use them)."""
    if "team" in data:
        raise InvalidInput.on("team", f"{what} stays in its team: create it again in the other team.")


TEAM_FILTER_HELP = "Only those of this team (its slug or id); one you are not a member of is a 400 on `team`."


def filter_by_team(queryset: QuerySet, request: Any, value: str, team_field: str = "team_id") -> QuerySet:
    """``?team=``: ``queryset`` narrowed to one of the caller's teams; a team they are not in (or
    that does not exist) is a 400 on ``team``, not an empty list that would look like "no tasks"."""
    try:
        team = team_resolve(request.user, value)
    except InvalidInput as exc:
        raise ValidationError(exc.errors) from None
    return queryset.filter(**{team_field: team.pk})


class TeamFilterSet(StrictFilterSet):
    """A list's filters with ``?team=`` (:func:`filter_by_team` on the rows' ``team_id``); a
    subclass names ``team`` in its ``Meta.fields`` beside its own filters."""

    team = filters.CharFilter(method="filter_team", help_text=TEAM_FILTER_HELP)

    def filter_team(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return filter_by_team(queryset, self.request, value)
