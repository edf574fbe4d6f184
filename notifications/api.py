"""``/api/v1/notification-channels``, ``/notification-rules`` and ``/notification-deliveries``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet
from django_filters import rest_framework as filters
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from notifications import services
from notifications.models import Channel, Delivery, DeliveryStatus, Rule
from notifications.serializers import ChannelSerializer, DeliverySerializer, RuleSerializer
from tms_core.auth import request_user
from tms_project.api.base import OwnerScopedMixin, StrictFilterSet


class ChannelViewSet(OwnerScopedMixin, viewsets.ModelViewSet):
    """Notification channels (webhook, Slack-compatible webhook, e-mail) of the requesting owner."""

    queryset = Channel.objects.all()
    serializer_class = ChannelSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def perform_create(self, serializer: BaseSerializer) -> None:
        serializer.instance = services.channel_create(owner=request_user(self.request), data=serializer.validated_data)

    def perform_update(self, serializer: BaseSerializer) -> None:
        assert isinstance(serializer.instance, Channel)
        serializer.instance = services.channel_update(channel=serializer.instance, data=serializer.validated_data)

    def perform_destroy(self, instance: Channel) -> None:
        services.channel_delete(channel=instance)

    @extend_schema(
        summary="Send a test message",
        description="Sends a test notification through the channel now and returns its delivery "
        "(`status` delivered, or pending with `last_error` when it will be retried, or failed).",
        request=None,
        responses={201: DeliverySerializer},
    )
    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: str | None = None) -> Response:
        delivery = services.channel_send_test(channel=self.get_object())
        return Response(DeliverySerializer(delivery).data, status=status.HTTP_201_CREATED)


@extend_schema_field(OpenApiTypes.INT)
class IntegerFilter(filters.NumberFilter):
    """An id filter: whole numbers only (django-filter's NumberFilter takes decimals)."""

    field_class = forms.IntegerField


class RuleFilter(StrictFilterSet):
    # Plain value filters: an id that is not yours (or no id) is an empty list, not a 400.
    channel = IntegerFilter()
    task = filters.UUIDFilter()

    class Meta:
        model = Rule
        fields = ["channel", "task"]


class RuleViewSet(OwnerScopedMixin, viewsets.ModelViewSet):
    """Notification rules: per task, or owner-wide defaults (``task`` null)."""

    queryset = Rule.objects.all()
    serializer_class = RuleSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    filter_backends = [DjangoFilterBackend]
    filterset_class = RuleFilter

    def perform_create(self, serializer: BaseSerializer) -> None:
        serializer.instance = services.rule_create(owner=request_user(self.request), data=serializer.validated_data)

    def perform_update(self, serializer: BaseSerializer) -> None:
        assert isinstance(serializer.instance, Rule)
        serializer.instance = services.rule_update(rule=serializer.instance, data=serializer.validated_data)

    def perform_destroy(self, instance: Rule) -> None:
        services.rule_delete(rule=instance)


class DeliveryPagination(CursorPagination):
    """Newest first, by id: keyset pages, no count, as fast on page 1000 as on page 1."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int:
        # DRF falls back to the default on a bad value; a bad ?limit= is a 400, as everywhere.
        values = request.query_params.getlist("limit")
        if not values:
            return self.page_size
        for value in values:
            if not value.isdigit() or int(value) < 1:
                raise ValidationError({"limit": ["A whole number of at least 1 is required."]})
        return min(int(values[-1]), self.max_page_size)

    def decode_cursor(self, request: Request) -> Any:
        # A cursor that is not one of ours is bad input (400), not a missing page (DRF's 404).
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError({"cursor": ["Invalid cursor: follow the next/previous links."]}) from None

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == "limit":
                parameter["schema"] = {"type": "integer", "minimum": 1}
        return parameters


class DeliveryFilter(StrictFilterSet):
    channel = IntegerFilter()
    task = filters.UUIDFilter()
    status = filters.ChoiceFilter(choices=DeliveryStatus.choices)

    class Meta:
        model = Delivery
        fields = ["channel", "task", "status"]


class DeliveryViewSet(OwnerScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The delivery log: every notification, its status, attempts and last error."""

    queryset = Delivery.objects.all()
    serializer_class = DeliverySerializer
    owner_field = "channel__owner"
    pagination_class = DeliveryPagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = DeliveryFilter

    def get_queryset(self) -> QuerySet:
        return super().get_queryset().order_by("-id")
