"""``/api/v1/teams`` and ``/api/v1/teams/{id}/members``: the caller's teams and who is in them.

A user lists the teams they are a member of, with their role in each; staff list every team
(read-only, as everywhere). Anyone may create a team (they become its admin); its admins rename
it, delete it when it holds no task, and add, change and remove members by username. The last
admin cannot be removed or demoted (400). A team the caller is not in answers 404; a write by a
member who is not an admin, 403. The rules are :mod:`tasks_app.teams`.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from tasks_app.models import Membership, Team, TeamRole
from tasks_app.teams import people, require, visible_teams
from tasks_app.teams.services import member_remove, member_set, team_create, team_delete, team_rename
from tms_core.api.base import ApiViewMixin, StrictInputMixin
from tms_core.api.keyset import KeysetPagination, Segment
from tms_core.api.schema import error_responses
from tms_core.auth import request_user

ROLE_HELP = (
    "viewer (reads), operator (also runs now, pauses, resumes, cancels, retries, backfills, triggers, replays), "
    "editor (also creates, changes, moves and deletes tasks), admin (also manages members)."
)


class TeamCreateSerializer(StrictInputMixin, serializers.Serializer):
    """What a new team is made from."""

    read_only_names = frozenset({"id", "personal", "role", "created_at"})

    name = serializers.CharField(max_length=100, help_text="What people call the team.")
    slug = serializers.SlugField(
        max_length=60,
        required=False,
        help_text="Its unique short name (letters, digits, hyphens, underscores), used by `?team=` and "
        "a task's `team`. Default: made from the name. Fixed once the team exists.",
    )


class TeamSerializer(serializers.ModelSerializer):
    """A team as a member sees it, with the caller's own role in it."""

    personal = serializers.BooleanField(read_only=True, help_text="Its user's own team: one member, never deleted.")
    role = serializers.SerializerMethodField(help_text=f"Your role in it (null: not a member; staff). {ROLE_HELP}")

    class Meta:
        model = Team
        fields = ["id", "name", "slug", "personal", "role", "created_at"]
        read_only_fields = fields

    @staticmethod
    def get_role(team: Team) -> str | None:
        return getattr(team, "caller_role", None)


class TeamRenameSerializer(StrictInputMixin, serializers.Serializer):
    read_only_names = frozenset({"id", "slug", "personal", "role", "created_at"})

    name = serializers.CharField(max_length=100, help_text="The new name (the slug stays).")


class MemberSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role", "sso", "created_at"]
        read_only_fields = ["sso"]
        extra_kwargs = {
            "sso": {
                "help_text": "Granted by single sign-on (TMS_OIDC_GROUPS): each sign-in of the user sets or "
                "removes it from the provider's groups. Changing the role here takes it over (false from then on)."
            }
        }


class MemberSetSerializer(StrictInputMixin, serializers.Serializer):
    username = serializers.CharField(max_length=150, help_text="The user to add, or whose role to change.")
    role = serializers.ChoiceField(choices=TeamRole.choices, help_text=ROLE_HELP)


class MemberRoleSerializer(StrictInputMixin, serializers.Serializer):
    role = serializers.ChoiceField(choices=TeamRole.choices, help_text=ROLE_HELP)


TEAM_ID = OpenApiParameter("id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH, description="The team's id.")
USERNAME = OpenApiParameter(
    "username", {"type": "string", "pattern": r"^[\w.@+-]{1,150}$"}, OpenApiParameter.PATH, description="A member."
)


def _teams(user: Any) -> QuerySet[Team]:
    return visible_teams(user)


class _TeamScoped(ApiViewMixin):
    pagination_class: type[KeysetPagination] | None = KeysetPagination
    filter_backends: list = []  # oldest first (by id), no filters: a few teams, a team's members

    def team(self) -> Team:
        """The team of the path among the caller's (404 otherwise), with their role."""
        return get_object_or_404(_teams(request_user(self.request)), pk=self.kwargs["id"])

    def require_admin(self, team: Team) -> None:
        require(request_user(self.request), team.pk, TeamRole.ADMIN, "tasks_app.change_team", what="this team")

    def keyset_segments(self, queryset: QuerySet, state: dict) -> list[Segment]:
        return [Segment([queryset.order_by()], None, False)]


@extend_schema_view(
    list=extend_schema(summary="List your teams", description="The teams you are a member of, with your role."),
    retrieve=extend_schema(summary="Get one of your teams", parameters=[TEAM_ID]),
    create=extend_schema(
        summary="Create a team",
        description="You become its admin. 400 on `slug` when it is taken.",
        request=TeamCreateSerializer,
        responses={201: TeamSerializer},
    ),
    partial_update=extend_schema(
        summary="Rename a team", description="Admins only.", request=TeamRenameSerializer, parameters=[TEAM_ID]
    ),
    destroy=extend_schema(
        summary="Delete a team",
        description="Admins only. 400 for a personal team, and for a team that still holds tasks (deleted ones "
        "included: their history is the team's).",
        parameters=[TEAM_ID],
        responses={204: None, **error_responses(400)},
    ),
)
class TeamViewSet(
    _TeamScoped,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """The caller's teams."""

    serializer_class = TeamSerializer
    queryset = Team.objects.all()
    lookup_value_regex = r"[0-9]{1,9}"
    lookup_url_kwarg = "id"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def visible_rows(self, queryset: QuerySet, owner_field: str) -> QuerySet:
        return _teams(request_user(self.request))

    def get_object(self) -> Team:
        return self.team()

    def create(self, request: Request) -> Response:
        serializer = TeamCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = request_user(request)
        team = team_create(creator=user, **serializer.validated_data)
        return Response(TeamSerializer(self._with_role(team)).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request: Request, id: str | None = None) -> Response:
        team = self.team()
        self.require_admin(team)
        serializer = TeamRenameSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        team = team_rename(team=team, name=serializer.validated_data["name"])
        return Response(TeamSerializer(self._with_role(team)).data)

    def destroy(self, request: Request, id: str | None = None) -> Response:
        team = self.team()
        self.require_admin(team)
        team_delete(team=team)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _with_role(self, team: Team) -> Team:
        return _teams(request_user(self.request)).get(pk=team.pk)


@extend_schema_view(
    get=extend_schema(summary="List a team's members", parameters=[TEAM_ID], responses={200: MemberSerializer}),
    post=extend_schema(
        summary="Add a member, or change a member's role",
        description="Admins only. 201 when the user is added, 200 when their role changed (or was already that). "
        "400 on `role` when it would demote the team's last admin, on `username` for a user that does not exist "
        "or for a personal team (it has one member).",
        parameters=[TEAM_ID],
        request=MemberSetSerializer,
        responses={201: MemberSerializer, 200: MemberSerializer},
    ),
)
class TeamMemberListView(_TeamScoped, generics.ListAPIView):
    """``/api/v1/teams/{id}/members``."""

    serializer_class = MemberSerializer
    queryset = Membership.objects.all()

    def visible_rows(self, queryset: QuerySet, owner_field: str) -> QuerySet:
        # People only: the team's service accounts are listed at /teams/{id}/service-accounts.
        return people(queryset.filter(team=self.team())).select_related("user")

    def post(self, request: Request, id: str) -> Response:
        team = self.team()
        self.require_admin(team)
        serializer = MemberSetSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        existed = Membership.objects.filter(team=team, user__username=serializer.validated_data["username"]).exists()
        membership = member_set(team=team, **serializer.validated_data)
        code = status.HTTP_200_OK if existed else status.HTTP_201_CREATED
        return Response(MemberSerializer(membership).data, status=code)


@extend_schema_view(
    get=extend_schema(summary="Get a team's member", parameters=[TEAM_ID, USERNAME]),
    patch=extend_schema(
        summary="Change a member's role",
        description="Admins only. 400 on `role` when it would demote the team's last admin.",
        parameters=[TEAM_ID, USERNAME],
        request=MemberRoleSerializer,
    ),
    delete=extend_schema(
        summary="Remove a member",
        description="Admins only (or the member themselves). 400 when it is the team's last admin.",
        parameters=[TEAM_ID, USERNAME],
        responses={204: None, **error_responses(400)},
    ),
)
class TeamMemberView(_TeamScoped, generics.GenericAPIView):
    """``/api/v1/teams/{id}/members/{username}``."""

    serializer_class = MemberSerializer
    queryset = Membership.objects.all()
    pagination_class = None

    def membership(self, team: Team) -> Membership:
        return get_object_or_404(
            people(Membership.objects.select_related("user")), team=team, user__username=self.kwargs["username"]
        )

    def get(self, request: Request, id: str, username: str) -> Response:
        return Response(MemberSerializer(self.membership(self.team())).data)

    def patch(self, request: Request, id: str, username: str) -> Response:
        team = self.team()
        self.require_admin(team)
        current = self.membership(team)
        serializer = MemberRoleSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        membership = member_set(team=team, username=current.user.username, role=serializer.validated_data["role"])
        return Response(MemberSerializer(membership).data)

    def delete(self, request: Request, id: str, username: str) -> Response:
        team = self.team()
        current = self.membership(team)
        if current.user_id != request_user(request).pk:  # leaving a team needs no role
            self.require_admin(team)
        member_remove(team=team, username=current.user.username)
        return Response(status=status.HTTP_204_NO_CONTENT)
