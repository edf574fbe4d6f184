"""``/api/v1/notification-channels``, ``/notification-rules`` and ``/notification-deliveries``."""

from __future__ import annotations

from typing import cast

from django import forms
from django.db.models import QuerySet
from django_filters import rest_framework as filters
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from notifications import services
from notifications.models import Channel, Delivery, DeliveryStatus, Rule
from notifications.serializers import ChannelSerializer, DeliverySerializer, RuleSerializer
from tasks_app.models import TeamRole
from tasks_app.teams import has_role
from teams_api.scope import TEAM_FILTER_HELP, TeamOwnedMixin, filter_by_team, refuse_team_change
from tms_core.api.base import StrictFilterSet
from tms_core.api.keyset import KeysetPagination, Segment
from tms_core.auth import request_user

TEAM_PARAMETER = OpenApiParameter("team", OpenApiTypes.STR, description=TEAM_FILTER_HELP)


@extend_schema_view(list=extend_schema(parameters=[TEAM_PARAMETER]))
class ChannelViewSet(TeamOwnedMixin, viewsets.ModelViewSet):
    """Notification channels (webhook, Slack-compatible webhook, e-mail) of the requesting user's
    teams: members read them, editors create, change, test and delete them."""

    queryset = Channel.objects.all()
    serializer_class = ChannelSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def perform_create(self, serializer: BaseSerializer) -> None:
        data = dict(serializer.validated_data)
        team = data.pop("team", None)
        serializer.instance = services.channel_create(owner=request_user(self.request), data=data, team=team)
        # The signing secret is handed out in this answer only (stored encrypted, masked after).
        cast(dict, serializer.context)["reveal_secret"] = True  # a dict at run time; typed as a Mapping

    def perform_update(self, serializer: BaseSerializer) -> None:
        assert isinstance(serializer.instance, Channel)
        refuse_team_change(serializer.validated_data, "A channel")
        serializer.instance = services.channel_update(channel=serializer.instance, data=serializer.validated_data)

    def perform_destroy(self, instance: Channel) -> None:
        services.channel_delete(channel=instance)

    @extend_schema(
        summary="Regenerate the webhook signing secret",
        description="A new signing secret for a webhook channel, shown in this answer only (masked in "
        "every other); the old one stops verifying at once. 400 for a channel without a secret (not a webhook).",
        request=None,
        responses={200: ChannelSerializer},
    )
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request: Request, pk: str | None = None) -> Response:
        channel = self.get_object()
        if not has_role(request_user(request), channel.team_id, TeamRole.EDITOR):
            # The new secret is shown in the answer: to the team's editors only, never to staff
            # (whatever permission they hold: it would hand them a credential).
            raise PermissionDenied("Only the editors of the channel's team may regenerate its signing secret.")
        channel = services.channel_rotate_secret(channel=channel)
        context = {**self.get_serializer_context(), "reveal_secret": True}
        return Response(ChannelSerializer(channel, context=context).data)

    @extend_schema(
        summary="Send a test message",
        description="Queues a test notification through the channel and answers at once (202) with its "
        "delivery, still `pending`: a sender on the notification queue sends it within TMS_NOTIFY_TIMEOUT. "
        "Follow it at GET /api/v1/notification-deliveries/{id} (`delivered`, or `pending` with `last_error` "
        "while it is retried, or `failed`).",
        request=None,
        responses={202: DeliverySerializer},
    )
    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: str | None = None) -> Response:
        delivery = services.channel_send_test(channel=self.get_object())
        return Response(DeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)


@extend_schema_field(OpenApiTypes.INT)
class IntegerFilter(filters.NumberFilter):
    """An id filter: whole numbers only (django-filter's NumberFilter takes decimals)."""

    field_class = forms.IntegerField


class TeamFilterMixin:
    """``?team=`` of a filter set (each declares its ``team`` filter with this method): one of the
    caller's teams (400 on ``team`` otherwise)."""

    team_field = "team_id"

    def filter_team(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return filter_by_team(queryset, getattr(self, "request", None), value, self.team_field)


class RuleFilter(TeamFilterMixin, StrictFilterSet):
    # Plain value filters: an id that is not yours (or no id) is an empty list, not a 400.
    channel = IntegerFilter()
    task = filters.UUIDFilter()
    team = filters.CharFilter(method="filter_team", help_text=TEAM_FILTER_HELP)

    class Meta:
        model = Rule
        fields = ["channel", "task", "team"]


class RuleViewSet(TeamOwnedMixin, viewsets.ModelViewSet):
    """Notification rules of the requesting user's teams: per task, or team-wide defaults (``task``
    null). Members read them, editors create, change and delete them."""

    queryset = Rule.objects.all()
    serializer_class = RuleSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    filter_backends = [DjangoFilterBackend]
    filterset_class = RuleFilter

    def perform_create(self, serializer: BaseSerializer) -> None:
        data = dict(serializer.validated_data)
        team = data.pop("team", None)
        serializer.instance = services.rule_create(owner=request_user(self.request), data=data, team=team)

    def perform_update(self, serializer: BaseSerializer) -> None:
        assert isinstance(serializer.instance, Rule)
        refuse_team_change(serializer.validated_data, "A rule")
        serializer.instance = services.rule_update(rule=serializer.instance, data=serializer.validated_data)

    def perform_destroy(self, instance: Rule) -> None:
        services.rule_delete(rule=instance)


class DeliveryFilter(TeamFilterMixin, StrictFilterSet):
    channel = IntegerFilter()
    task = filters.UUIDFilter()
    status = filters.ChoiceFilter(choices=DeliveryStatus.choices)
    team = filters.CharFilter(method="filter_team", help_text=TEAM_FILTER_HELP)
    team_field = "channel__team_id"

    class Meta:
        model = Delivery
        fields = ["channel", "task", "status", "team"]


class DeliveryViewSet(TeamOwnedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The delivery log of the requesting user's teams' channels: every notification, its status,
    attempts and last error."""

    queryset = Delivery.objects.all()
    serializer_class = DeliverySerializer
    team_field = "channel__team_id"
    #: Newest first, keyset pages on id as the execution lists (``?limit=``, ``?cursor=`` from the
    #: ``next``/``previous`` links, no count): as fast on the thousandth page as on the first.
    pagination_class = KeysetPagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = DeliveryFilter

    def get_queryset(self) -> QuerySet:
        if "before" in self.request.query_params:
            # The log's earlier cursor: refused with a pointer rather than silently ignored.
            raise ValidationError({"before": ["The delivery log is paged by cursor: follow the `next` link."]})
        return super().get_queryset().order_by("-id")

    def keyset_segments(self, queryset: QuerySet, state: dict) -> list[Segment]:
        """One segment: every delivery, by id descending (delivery_channel_idx and
        delivery_task_idx serve the filtered lists, the primary key the rest)."""
        return [Segment([queryset.order_by()], None, True)]
