"""``/api/v1/teams/{id}/service-accounts``: a team's identities for machines, and their tokens.

The team's members list its service accounts; its admins create them (a name and a role:
viewer, operator or editor), delete them (their tokens stop working at once), and create, list
and revoke their tokens. Every token of a service account is scoped to its team; its key is in
the answer to the POST that creates it, and never again. As for personal tokens, a request
authenticated by an access token may not create a token. A team the caller is not in answers
404, a write by a member who is not an admin 403. The rules are :mod:`accounts.service_accounts`.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.api import AccessTokenSerializer
from accounts.models import AccessToken, ServiceAccount
from accounts.service_accounts import (
    ROLE_CHOICES,
    live_accounts,
    service_account_create,
    service_account_delete,
    service_account_token_create,
)
from accounts.tokens import token_revoke
from tasks_app.models import Team
from teams_api.api import TEAM_ID, _TeamScoped
from tms_core.api.base import StrictInputMixin
from tms_core.auth import request_user

SA_ROLE_HELP = (
    "Its role in the team: viewer (reads), operator (also runs now, pauses, resumes, cancels, retries, "
    "backfills, triggers, replays) or editor (also creates, changes, moves and deletes tasks). Never admin."
)
SA_ID = OpenApiParameter(
    "sa_id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH, description="The service account's id."
)
TOKEN_ID = OpenApiParameter(
    "token_id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH, description="The token's id."
)


class ServiceAccountSerializer(serializers.ModelSerializer):
    """A service account as its team sees it."""

    username = serializers.CharField(
        source="user.username", read_only=True, help_text="Its user name: the owner of the tasks it creates."
    )
    role = serializers.CharField(read_only=True, help_text=SA_ROLE_HELP)
    team = serializers.IntegerField(source="team_id", read_only=True, help_text="Its team's id.")
    created_by = serializers.SerializerMethodField(help_text="The admin who made it (null once they are deleted).")

    class Meta:
        model = ServiceAccount
        fields = ["id", "name", "username", "role", "team", "created_by", "created_at"]
        read_only_fields = fields

    @staticmethod
    def get_created_by(account: ServiceAccount) -> str | None:
        return account.created_by.get_username() if account.created_by is not None else None


class ServiceAccountCreateSerializer(StrictInputMixin, serializers.Serializer):
    """What a new service account is made from."""

    read_only_names = frozenset({"id", "username", "team", "created_by", "created_at"})

    name = serializers.RegexField(
        r"^[-\w .]{1,100}$",
        max_length=100,
        help_text="What it is for, e.g. 'deploy-ci': unique among the team's service accounts.",
        error_messages={"invalid": "Use at most 100 letters, digits, spaces, dots, hyphens or underscores."},
    )
    role = serializers.ChoiceField(choices=ROLE_CHOICES, help_text=SA_ROLE_HELP)


class ServiceAccountTokenSerializer(AccessTokenSerializer):
    """A service account's token: always scoped to the account's team (``team`` is not an input)."""

    read_only_names = AccessTokenSerializer.read_only_names | {"team"}

    team = serializers.IntegerField(  # type: ignore[assignment]
        source="team_id", read_only=True, help_text="The service account's team: the token's one team."
    )

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and "team" in data:
            errors: dict[str, Any] = {"team": ["This field cannot be changed: the token's team is its account's."]}
            try:
                super().to_internal_value({key: value for key, value in data.items() if key != "team"})
            except serializers.ValidationError as exc:
                if isinstance(exc.detail, dict):
                    errors = {**exc.detail, **errors}
            raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


class NewServiceAccountTokenSerializer(ServiceAccountTokenSerializer):
    """The answer to a create: the token and, this once, its key."""

    key = serializers.CharField(read_only=True, help_text="The key. Shown once: store it now.")

    class Meta(ServiceAccountTokenSerializer.Meta):
        fields = [*ServiceAccountTokenSerializer.Meta.fields, "key"]


class _AccountScoped(_TeamScoped):
    def account(self, team: Team) -> ServiceAccount:
        """The live service account of the path in ``team`` (404 otherwise), with its role."""
        return get_object_or_404(live_accounts(team), pk=self.kwargs["sa_id"])


@extend_schema_view(
    get=extend_schema(
        summary="List a team's service accounts",
        description="Members of the team may list them.",
        parameters=[TEAM_ID],
        responses={200: ServiceAccountSerializer},
    ),
    post=extend_schema(
        summary="Create a service account",
        description="Admins only. A service account is an identity for machines (CI): it cannot sign in, holds "
        "access tokens scoped to this team, and acts with its role (never admin). 400 on `name` when the team has "
        "one of that name, on `role` for admin, on `team` for a personal team.",
        parameters=[TEAM_ID],
        request=ServiceAccountCreateSerializer,
        responses={201: ServiceAccountSerializer},
    ),
)
class ServiceAccountListView(_AccountScoped, generics.ListAPIView):
    """``/api/v1/teams/{id}/service-accounts``."""

    serializer_class = ServiceAccountSerializer
    queryset = ServiceAccount.objects.all()

    def visible_rows(self, queryset: QuerySet, owner_field: str) -> QuerySet:
        return live_accounts(self.team()).select_related("created_by")

    def post(self, request: Request, id: str) -> Response:
        team = self.team()
        self.require_admin(team)
        serializer = ServiceAccountCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        account = service_account_create(team=team, creator=request_user(request), **serializer.validated_data)
        shown = ServiceAccountSerializer(self.account_by_pk(team, account.pk)).data
        return Response(shown, status=status.HTTP_201_CREATED)

    def account_by_pk(self, team: Team, pk: int) -> ServiceAccount:
        return live_accounts(team).select_related("created_by").get(pk=pk)


@extend_schema_view(
    get=extend_schema(summary="Get a team's service account", parameters=[TEAM_ID, SA_ID]),
    delete=extend_schema(
        summary="Delete a service account",
        description="Admins only. Its tokens are revoked at once and it leaves the team; the tasks it created "
        "stay (their owner is its user, now inactive). Audited as `service_account.delete`.",
        parameters=[TEAM_ID, SA_ID],
        responses={204: None},
    ),
)
class ServiceAccountView(_AccountScoped, generics.GenericAPIView):
    """``/api/v1/teams/{id}/service-accounts/{sa_id}``."""

    serializer_class = ServiceAccountSerializer
    queryset = ServiceAccount.objects.all()
    pagination_class = None

    def get(self, request: Request, id: str, sa_id: str) -> Response:
        return Response(ServiceAccountSerializer(self.account(self.team())).data)

    def delete(self, request: Request, id: str, sa_id: str) -> Response:
        team = self.team()
        account = self.account(team)
        self.require_admin(team)
        service_account_delete(account=account, actor=request_user(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    get=extend_schema(
        summary="List a service account's tokens",
        description="Admins only. Revoked and expired ones too; never their keys.",
        parameters=[TEAM_ID, SA_ID],
        responses={200: ServiceAccountTokenSerializer},
    ),
    post=extend_schema(
        summary="Create a service account's token",
        description="Admins only. The token is scoped to the team. The answer holds the key, once: send it as "
        "`Authorization: Bearer <key>`. Not allowed when the request itself uses an access token.",
        parameters=[TEAM_ID, SA_ID],
        request=ServiceAccountTokenSerializer,
        responses={201: NewServiceAccountTokenSerializer},
    ),
)
class ServiceAccountTokenListView(_AccountScoped, generics.ListAPIView):
    """``/api/v1/teams/{id}/service-accounts/{sa_id}/tokens``."""

    serializer_class = ServiceAccountTokenSerializer
    queryset = AccessToken.objects.all()

    def visible_rows(self, queryset: QuerySet, owner_field: str) -> QuerySet:
        team = self.team()
        account = self.account(team)
        self.require_admin(team)
        return queryset.filter(user_id=account.user_id)

    def post(self, request: Request, id: str, sa_id: str) -> Response:
        team = self.team()
        account = self.account(team)
        self.require_admin(team)
        if isinstance(request.auth, AccessToken):
            raise PermissionDenied(
                "An access token cannot create tokens: sign in, or use your account key (tms_create_user)."
            )
        serializer = ServiceAccountTokenSerializer(data=request.data, context={"user": request_user(request)})
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        token, key = service_account_token_create(
            account=account, name=data["name"], scopes=data["scopes"], expires_at=data["expires_at"]
        )
        token.key = key  # type: ignore[attr-defined]  # shown in this answer only
        return Response(NewServiceAccountTokenSerializer(token).data, status=status.HTTP_201_CREATED)


@extend_schema_view(
    get=extend_schema(summary="Get a service account's token", parameters=[TEAM_ID, SA_ID, TOKEN_ID]),
    delete=extend_schema(
        summary="Revoke a service account's token",
        description="Admins only. It stops working at once.",
        parameters=[TEAM_ID, SA_ID, TOKEN_ID],
        responses={204: None},
    ),
)
class ServiceAccountTokenView(_AccountScoped, generics.GenericAPIView):
    """``/api/v1/teams/{id}/service-accounts/{sa_id}/tokens/{token_id}``."""

    serializer_class = ServiceAccountTokenSerializer
    queryset = AccessToken.objects.all()
    pagination_class = None

    def token(self) -> AccessToken:
        team = self.team()
        account = self.account(team)
        self.require_admin(team)
        return get_object_or_404(AccessToken, pk=self.kwargs["token_id"], user_id=account.user_id)

    def get(self, request: Request, id: str, sa_id: str, token_id: str) -> Response:
        return Response(ServiceAccountTokenSerializer(self.token()).data)

    def delete(self, request: Request, id: str, sa_id: str, token_id: str) -> Response:
        token_revoke(token=self.token())
        return Response(status=status.HTTP_204_NO_CONTENT)
