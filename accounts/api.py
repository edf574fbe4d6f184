"""``/api/v1/tokens``: a user's personal access tokens.

Each user sees and revokes their own tokens only (staff included: a token is personal; the admin
lists everyone's for revocation). The key is in the answer to the POST that creates the token,
and never again. A request authenticated by a personal access token may not create another one:
a leaked key must not be able to outlive its own expiry.

What a token made that outlives it (trigger URLs, memberships below admin: a token cannot grant
the admin role) is listed at ``/tokens/{id}/made`` and removed by ``POST /tokens/{id}/made/revoke``.

A token may name one ``team`` of its user's (a member at creation: 400 on ``team`` otherwise);
requests with it see and act in that team only (:mod:`tasks_app.teams`). A request with a
team-scoped token lists and revokes only the tokens scoped to that same team.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.models import AccessToken, TokenScope
from accounts.tokens import normalise_scopes, token_create, token_made, token_made_revoke, token_revoke
from tasks_app.models import Team
from tasks_app.teams import team_resolve
from tms_core.api.base import ApiViewMixin, BoundedDateTimeField, StrictInputMixin
from tms_core.auth import request_user, token_team_id
from tms_core.conf import tms_settings
from tms_core.durations import DurationField, format_duration
from tms_core.errors import InvalidInput


@extend_schema_field(
    {"oneOf": [{"type": "string", "maxLength": 60}, {"type": "integer", "minimum": 1}], "nullable": True}
)
class TokenTeamField(serializers.Field):
    """The team a token is scoped to: given as a slug or an id of a team its user is a member of
    (staff too: a token never reaches a team its user is not in); shown as the team's id."""

    default_error_messages = {"invalid": "The slug or id of a team you are a member of."}

    def to_internal_value(self, data: Any) -> Team:
        if isinstance(data, bool) or not isinstance(data, str | int) or len(str(data)) > 60:
            self.fail("invalid")
        user = self.context.get("user")
        if user is None:
            request = self.context.get("request")
            user = request.user if request is not None else None
        if user is None:  # pragma: no cover - the views always pass the user or the request
            self.fail("invalid")
        try:
            return team_resolve(user, data, members_only=True)
        except InvalidInput as exc:
            raise serializers.ValidationError(exc.errors["team"]) from None

    def to_representation(self, value: Any) -> Any:
        return getattr(value, "pk", value)


class AccessTokenSerializer(StrictInputMixin, serializers.ModelSerializer):
    """A token as its owner sees it; ``key`` only in the answer that creates it."""

    read_only_names = frozenset({"id", "prefix", "created_at", "last_used_at", "revoked_at", "active", "key"})

    name = serializers.CharField(max_length=100, help_text="What the token is for, e.g. 'CI deploys'.")
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=TokenScope.choices),
        min_length=1,
        max_length=2,
        help_text="`read` (GET only) and/or `write` (every method; implies read).",
    )
    expires_at = BoundedDateTimeField(
        required=False,
        allow_null=True,
        help_text="When the token stops working. Default: now plus TMS_ACCESS_TOKEN_DEFAULT_AGE (90 days). "
        "Null (never) only where TMS_ACCESS_TOKEN_MAX_AGE is 0.",
    )
    expires_in = DurationField(
        required=False,
        write_only=True,
        min_value=timedelta(minutes=1),
        help_text='Instead of expires_at: "30d", "12h".',
    )
    team = TokenTeamField(
        required=False,
        allow_null=True,
        help_text="Scope the token to one of your teams (its slug or id): requests with it see and act in "
        "that team only, with your role there. Null or absent: all your teams. Shown as the team's id.",
    )
    prefix = serializers.CharField(read_only=True, help_text="The start of the key, to recognise it.")
    active = serializers.SerializerMethodField(help_text="Neither revoked nor expired.")

    class Meta:
        model = AccessToken
        fields = [
            "id", "name", "scopes", "team", "prefix", "expires_at", "expires_in", "created_at", "last_used_at",
            "revoked_at", "active",
        ]  # fmt: skip
        read_only_fields = ["id", "created_at", "last_used_at", "revoked_at"]

    def get_active(self, token: AccessToken) -> bool:
        return token.revoked_at is None and (token.expires_at is None or token.expires_at > timezone.now())

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        settings = tms_settings()
        now = timezone.now()
        longest = timedelta(seconds=settings.ACCESS_TOKEN_MAX_AGE) if settings.ACCESS_TOKEN_MAX_AGE else None
        if "expires_at" in attrs and "expires_in" in attrs:
            raise serializers.ValidationError({"expires_in": ["Give expires_at or expires_in, not both."]})
        if "expires_in" in attrs:
            attrs["expires_at"] = now + attrs.pop("expires_in")
        elif "expires_at" not in attrs:
            attrs["expires_at"] = now + timedelta(seconds=settings.ACCESS_TOKEN_DEFAULT_AGE)
        expires_at = attrs["expires_at"]
        if expires_at is None and longest is not None:
            raise serializers.ValidationError(
                {"expires_at": [f"Tokens must expire: at most {format_duration(longest)} from now."]}
            )
        if expires_at is not None:
            if expires_at <= now:
                raise serializers.ValidationError({"expires_at": ["Must be in the future."]})
            if longest is not None and expires_at > now + longest:
                raise serializers.ValidationError(
                    {"expires_at": [f"Must be at most {format_duration(longest)} from now (TMS_ACCESS_TOKEN_MAX_AGE)."]}
                )
        attrs["scopes"] = normalise_scopes(attrs["scopes"])
        return attrs


def token_create_validated(*, user: Any, data: Mapping[str, Any]) -> tuple[AccessToken, str]:
    """:func:`accounts.tokens.token_create` with what :class:`AccessTokenSerializer` accepted
    (``POST /api/v1/tokens`` and the back office's token form)."""
    return token_create(
        user=user, name=data["name"], scopes=data["scopes"], expires_at=data["expires_at"], team=data.get("team")
    )


class NewAccessTokenSerializer(AccessTokenSerializer):
    """The answer to a create: the token and, this once, its key."""

    key = serializers.CharField(read_only=True, help_text="The key. Shown once: store it now.")

    class Meta(AccessTokenSerializer.Meta):
        fields = [*AccessTokenSerializer.Meta.fields, "key"]


class MadeTriggerUrlSerializer(serializers.Serializer):
    task = serializers.UUIDField(source="task_id", help_text="The task whose trigger URL the token made or rotated.")
    made_at = serializers.DateTimeField(source="created_at")
    rotated_at = serializers.DateTimeField(allow_null=True)


class MadeMembershipSerializer(serializers.Serializer):
    team = serializers.IntegerField(source="team_id")
    team_slug = serializers.CharField(source="team.slug")
    username = serializers.CharField(source="user.username")
    role = serializers.CharField()


class TokenMadeSerializer(serializers.Serializer):
    """What a token made that outlives it and is still its own."""

    trigger_urls = MadeTriggerUrlSerializer(many=True)
    memberships = MadeMembershipSerializer(many=True)


class TokenMadeRevokedSerializer(serializers.Serializer):
    trigger_urls = serializers.IntegerField(help_text="Trigger URLs deleted.")
    memberships = serializers.IntegerField(help_text="Memberships removed.")
    kept = serializers.ListField(child=serializers.CharField(), help_text="What a rule kept, and why.")


@extend_schema_view(
    list=extend_schema(summary="List your personal access tokens", description="Revoked and expired ones too."),
    retrieve=extend_schema(summary="Get one of your personal access tokens"),
    create=extend_schema(
        summary="Create a personal access token",
        description="The answer holds the key, once. Send it as `Authorization: Bearer <key>`. "
        "Not allowed when the request itself uses a personal access token.",
        responses={201: NewAccessTokenSerializer},
    ),
    destroy=extend_schema(summary="Revoke a personal access token", description="It stops working at once."),
)
class AccessTokenViewSet(
    ApiViewMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """The requesting user's personal access tokens."""

    serializer_class = AccessTokenSerializer
    queryset = AccessToken.objects.all()

    def visible_rows(self, queryset: QuerySet, owner_field: str) -> QuerySet:
        tokens = queryset.filter(user=request_user(self.request))
        restricted = token_team_id(self.request.user)
        return tokens if restricted is None else tokens.filter(team_id=restricted)

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        if isinstance(request.auth, AccessToken):
            raise PermissionDenied(
                "A personal access token cannot create tokens: sign in, or use your account key (tms_create_user)."
            )
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token, key = token_create_validated(user=request_user(request), data=serializer.validated_data)
        token.key = key  # type: ignore[attr-defined]  # shown in this answer only
        return Response(NewAccessTokenSerializer(token).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: AccessToken) -> None:
        token_revoke(token=instance)

    @extend_schema(
        summary="What a token made that outlives it",
        description="The trigger URLs it made (or last rotated) and the team memberships it granted (or last "
        "changed), as long as they exist and nobody changed them since. Revoking the token leaves them: "
        "`POST .../made/revoke` removes them.",
        responses={200: TokenMadeSerializer},
    )
    @action(detail=True, methods=["get"], url_path="made")
    def made(self, request: Request, pk: str | None = None) -> Response:
        return Response(TokenMadeSerializer(token_made(token=self.get_object())).data)

    @extend_schema(
        summary="Remove what a token made",
        description="Deletes the trigger URLs it made and removes the memberships it granted (audited); a "
        "membership a rule keeps (the team's last admin) is named in `kept`.",
        request=None,
        responses={200: TokenMadeRevokedSerializer},
    )
    @action(detail=True, methods=["post"], url_path="made/revoke")
    def made_revoke(self, request: Request, pk: str | None = None) -> Response:
        return Response(TokenMadeRevokedSerializer(token_made_revoke(token=self.get_object())).data)
