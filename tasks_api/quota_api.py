"""``/api/v1/teams/{id}/quota``: a team's quota (its limits, as set and in force, and what it uses).

Its admins read it (staff read every team's); operators with the permission
``tasks_app.change_teamquota`` (superusers) change it, as in the admin, through
:func:`tasks_app.quotas.team_quota_set`. A team the caller is not in answers 404, a member who is
not its admin 403.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from tasks_app.models import Team, TeamQuota, TeamRole
from tasks_app.quotas import MAX_FAIR_WEIGHT, QUOTA_FIELDS, team_limits, team_quota_set, team_quota_use
from tasks_app.teams import includes, role_in, sees_all, visible_teams
from tms_core.api.base import ApiViewMixin, StrictInputMixin
from tms_core.auth import request_user

#: The permission that lets a user change any team's quota.
CHANGE_QUOTA = "tasks_app.change_teamquota"

_LIMIT_HELP = {
    "max_tasks": "Tasks the team may hold (not deleted). Null: `TMS_QUOTA_MAX_TASKS`; 0: no limit.",
    "max_executions_per_hour": "Executions its tasks may be given on request (run now, backfill, retry, replay, "
    "materialise) per rolling hour. Null: `TMS_QUOTA_EXECUTIONS_PER_HOUR`; 0: no limit.",
    "max_artifact_bytes": "Bytes of uploaded artifacts. Null: `TMS_QUOTA_ARTIFACT_BYTES`; 0: no limit.",
    "fair_weight": f"Its share of the workers when more is due than they can start, against other teams "
    f"(1 to {MAX_FAIR_WEIGHT}). Null: `TMS_FAIR_WEIGHT`.",
}


class InForceSerializer(serializers.Serializer):
    max_tasks = serializers.IntegerField(help_text="0: no limit.")
    max_executions_per_hour = serializers.IntegerField(help_text="0: no limit.")
    max_artifact_bytes = serializers.IntegerField(help_text="0: no limit.")
    fair_weight = serializers.IntegerField()


class UsedSerializer(serializers.Serializer):
    tasks = serializers.IntegerField(help_text="Tasks not deleted.")
    executions_last_hour = serializers.IntegerField(help_text="Executions created on request in the last hour.")
    artifact_bytes = serializers.IntegerField(
        help_text="Bytes of the team's artifacts held (all but rejected ones, whoever uploaded them): the count "
        "the quota enforces."
    )


class TeamQuotaSerializer(serializers.Serializer):
    """A team's quota: what an operator set (null: the default), what is in force, what it uses."""

    team = serializers.IntegerField(help_text="The team's id.")
    max_tasks = serializers.IntegerField(allow_null=True, help_text=_LIMIT_HELP["max_tasks"])
    max_executions_per_hour = serializers.IntegerField(
        allow_null=True, help_text=_LIMIT_HELP["max_executions_per_hour"]
    )
    max_artifact_bytes = serializers.IntegerField(allow_null=True, help_text=_LIMIT_HELP["max_artifact_bytes"])
    fair_weight = serializers.IntegerField(allow_null=True, help_text=_LIMIT_HELP["fair_weight"])
    in_force = InForceSerializer(help_text="The limits that apply: the values set, else the defaults.")
    used = UsedSerializer(help_text="What the team uses now.")


class TeamQuotaChangeSerializer(StrictInputMixin, serializers.Serializer):
    """Some of a team's limits; null sets one back to the default, a field left out keeps its value."""

    read_only_names = frozenset({"team", "in_force", "used"})

    max_tasks = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=2**31 - 1, help_text=_LIMIT_HELP["max_tasks"]
    )
    max_executions_per_hour = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=2**31 - 1,
        help_text=_LIMIT_HELP["max_executions_per_hour"],
    )
    max_artifact_bytes = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=2**63 - 1, help_text=_LIMIT_HELP["max_artifact_bytes"]
    )
    fair_weight = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_FAIR_WEIGHT, help_text=_LIMIT_HELP["fair_weight"]
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError(
                {"non_field_errors": [f"Give one or more of: {', '.join(QUOTA_FIELDS)}."]}
            )
        return attrs


def quota_body(team: Team) -> dict[str, Any]:
    """The API's view of ``team``'s quota."""
    row = TeamQuota.objects.filter(pk=team.pk).first() or TeamQuota(team_id=team.pk)
    limits, use = team_limits(team.pk), team_quota_use(team)
    return {
        "team": team.pk,
        **{name: getattr(row, name) for name in QUOTA_FIELDS},
        "in_force": {name: getattr(limits, name) for name in QUOTA_FIELDS},
        "used": {
            "tasks": use.tasks,
            "executions_last_hour": use.executions_last_hour,
            "artifact_bytes": use.artifact_bytes,
        },
    }


TEAM_ID = OpenApiParameter("id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH, description="The team's id.")


@extend_schema_view(
    get=extend_schema(
        summary="Get a team's quota",
        description="The team's admins (staff: any team). 403 for a member who is not an admin.",
        parameters=[TEAM_ID],
        responses={200: TeamQuotaSerializer},
    ),
    patch=extend_schema(
        summary="Change a team's quota",
        description=f"Operators with the permission `{CHANGE_QUOTA}` (superusers) only; a team's admins may not "
        "raise their own quota (403). Null sets a limit back to its default; fields left out keep their values. "
        "Audited as `quota.update`.",
        parameters=[TEAM_ID],
        request=TeamQuotaChangeSerializer,
        responses={200: TeamQuotaSerializer},
    ),
)
class TeamQuotaView(ApiViewMixin, generics.GenericAPIView):
    """``/api/v1/teams/{id}/quota``."""

    serializer_class = TeamQuotaSerializer
    queryset = Team.objects.all()
    pagination_class = None

    def team(self) -> Team:
        """The team of the path among the caller's (404 otherwise); only its admins (and staff) go on."""
        user = request_user(self.request)
        team = get_object_or_404(visible_teams(user), pk=self.kwargs["id"])
        if not sees_all(user) and not user.has_perm("tasks_app.view_teamquota"):
            held = role_in(user, team.pk)
            if not includes(held, TeamRole.ADMIN):
                raise PermissionDenied(f"Your role in this team is {held}: only its admins read its quota.")
        return team

    def get(self, request: Request, id: str) -> Response:
        return Response(quota_body(self.team()))

    def patch(self, request: Request, id: str) -> Response:
        team = self.team()
        if not request_user(request).has_perm(CHANGE_QUOTA):
            raise PermissionDenied(
                f"Only an operator with the permission {CHANGE_QUOTA} changes a team's quota: ask one to."
            )
        serializer = TeamQuotaChangeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        team_quota_set(team=team, **serializer.validated_data)
        return Response(quota_body(team))
