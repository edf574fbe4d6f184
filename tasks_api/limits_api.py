"""``/api/v1/limits``: named limits (concurrency caps and rate windows shared by tasks) and their
current use. A team's members read its limits and its editors manage them; staff also define
global limits (``"global": true``) that every team's task may reference."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.serializers import BaseSerializer

from executions.limits import limit_usage
from tasks_api.limits import limit_create, limit_delete, limit_update
from tasks_app.models import MAX_LIMIT_CONCURRENCY, MAX_WINDOWS, Limit, LimitScope
from tasks_app.teams import member_team_ids, sees_all
from teams_api.scope import TEAM_FILTER_HELP, TeamOwnedMixin, refuse_team_change, team_field
from tms_core.api.base import StrictInputMixin
from tms_core.auth import request_user
from tms_core.errors import InvalidInput
from tms_core.roles import may_act_for

#: ``?team=`` on the lists of what teams own.
TEAM_PARAMETER = OpenApiParameter("team", OpenApiTypes.STR, description=TEAM_FILTER_HELP)


class WindowSerializer(StrictInputMixin, serializers.Serializer):
    count = serializers.IntegerField(help_text="At most this many starts ...")
    seconds = serializers.FloatField(help_text="... in any window this many seconds long.")


class WindowUseSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    seconds = serializers.FloatField()
    starts = serializers.IntegerField(
        allow_null=True,
        help_text="Starts logged in the window ending now (every team's: null on a global limit read by a "
        "user who is not staff).",
    )


class BucketUseSerializer(serializers.Serializer):
    key = serializers.CharField(
        help_text="The budget: the limit's key, a runner alias or a target host. A user reading a global limit "
        "sees only the budgets their teams' runs hold or wait for, and only their teams' runs in them."
    )
    slots_held = serializers.IntegerField(help_text="Concurrency slots held by RUNNING executions (leases alive).")
    waiting = serializers.IntegerField(help_text="Executions waiting for this budget.")
    windows = WindowUseSerializer(many=True)


class LimitSerializer(StrictInputMixin, serializers.ModelSerializer):
    """A named limit. Numbers are checked by the service (a window that cannot be met, no window
    and no cap, a duplicate name): each a 400 on its field."""

    read_only_names = frozenset({"id", "owner", "usage", "created_at", "updated_at"})

    owner: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Who defined it (null: a global limit)."
    )
    team = team_field("the limit")
    is_global = serializers.BooleanField(
        required=False,
        default=False,
        source="global_",
        help_text="A global limit (staff only): no team, any team's task may reference it.",
    )
    name = serializers.CharField(max_length=100)
    scope = serializers.ChoiceField(
        choices=LimitScope.choices,
        required=False,
        default=LimitScope.KEY,
        help_text="key: one budget for every run that references it; runner: one per runner alias; "
        "host: one per target (the http host, the Lambda function, the Kubernetes namespace).",
    )
    key = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    max_concurrency = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        help_text=f"At most this many runs at once per budget (1 to {MAX_LIMIT_CONCURRENCY}; null: no cap).",
    )
    windows = WindowSerializer(
        many=True,
        required=False,
        default=list,
        help_text=f"Rate windows, all enforced at once (at most {MAX_WINDOWS}): "
        '[{"count": 10, "seconds": 1}, {"count": 1000, "seconds": 3600}].',
    )
    usage = serializers.SerializerMethodField(help_text="Current use of each budget (slots held, starts per window).")

    class Meta:
        model = Limit
        fields = [
            "id",
            "name",
            "owner",
            "team",
            "is_global",
            "scope",
            "key",
            "max_concurrency",
            "windows",
            "usage",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "owner", "usage", "created_at", "updated_at"]
        # The name's uniqueness in the team is the service's check (a 400 on ``name``); DRF's own
        # validator for the constraint would make ``team`` required.
        validators: list = []

    def to_representation(self, instance: Any) -> dict[str, Any]:
        instance.global_ = instance.team_id is None
        return super().to_representation(instance)

    @extend_schema_field(BucketUseSerializer(many=True))
    def get_usage(self, limit: Limit) -> list[dict[str, Any]]:
        request = self.context.get("request")
        user = getattr(request, "user", None)
        if limit.team_id is None and not (user is not None and sees_all(user)):
            # A global limit's budgets are shared by every team: each user sees their teams' use only.
            return limit_usage(limit=limit, team_ids=member_team_ids(user) if user is not None else [])
        return limit_usage(limit=limit)


@extend_schema_view(list=extend_schema(parameters=[TEAM_PARAMETER]))
class LimitViewSet(TeamOwnedMixin, viewsets.ModelViewSet):
    """Named limits: those of the requesting user's teams and the global ones (staff see all).
    Members read a team's limits, its editors create, change and delete them."""

    queryset = Limit.objects.select_related("owner").all()
    serializer_class = LimitSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def visible_rows(self, queryset: QuerySet, owner_field: str) -> QuerySet:
        user = self.request.user
        if sees_all(user):
            return queryset
        return queryset.filter(Q(team_id__in=member_team_ids(user)) | Q(team__isnull=True))

    def check_object_permissions(self, request: Any, obj: Any) -> None:
        if request.method not in ("GET", "HEAD", "OPTIONS") and obj.team_id is None:
            verb = "delete" if request.method == "DELETE" else "change"
            if not (sees_all(request.user) and may_act_for(request.user, None, f"tasks_app.{verb}_limit")):
                # Staff are read-only support unless given the permission (superusers have it).
                raise PermissionDenied("Only staff may change a global limit.")
            return
        super().check_object_permissions(request, obj)

    def perform_create(self, serializer: BaseSerializer) -> None:
        data = dict(serializer.validated_data)
        user = request_user(self.request)
        is_global = data.pop("global_", False)
        team = data.pop("team", None)
        if is_global and not (sees_all(user) and user.has_perm("tasks_app.add_limit")):
            raise PermissionDenied("Only staff may define a global limit.")
        if is_global and team is not None:
            raise InvalidInput.on("team", "A global limit belongs to no team: give team or global, not both.")
        owner = None if is_global else user
        serializer.instance = limit_create(owner=owner, team=team, **data)

    def perform_update(self, serializer: BaseSerializer) -> None:
        assert isinstance(serializer.instance, Limit)
        refuse_team_change(serializer.validated_data, "A limit")
        changes = {k: v for k, v in serializer.validated_data.items() if k != "global_"}
        serializer.instance = limit_update(limit=serializer.instance, changes=changes)

    def perform_destroy(self, instance: Limit) -> None:
        limit_delete(limit=instance)
