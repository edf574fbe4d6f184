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
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer
from rest_framework.utils.urls import replace_query_param

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


class DeliveryPagination(BasePagination):
    """Newest first, keyset on id (``?before=<id>``, the ``next`` link carries it): no count, as
    fast on the thousandth page as on the first. A bad ``limit`` or ``before`` is a 400."""

    page_size = 50
    max_page_size = 500

    def _whole(self, request: Request, name: str) -> int | None:
        values = request.query_params.getlist(name)
        for value in values:
            if not value.isdigit() or int(value) < 1:
                raise ValidationError({name: ["A whole number of at least 1 is required."]})
        return int(values[-1]) if values else None

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any]:
        limit = min(self._whole(request, "limit") or self.page_size, self.max_page_size)
        before = self._whole(request, "before")
        if before is not None:
            queryset = queryset.filter(id__lt=before)
        rows = list(queryset.order_by("-id")[: limit + 1])
        self.request = request
        self.next_before = rows[limit - 1].pk if len(rows) > limit else None
        return rows[:limit]

    def get_paginated_response(self, data: Any) -> Response:
        link = None
        if self.next_before is not None:
            link = replace_query_param(self.request.build_absolute_uri(), "before", self.next_before)
        return Response({"next": link, "results": data})

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "required": ["next", "results"],
            "properties": {"next": {"type": "string", "format": "uri", "nullable": True}, "results": schema},
        }

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {"name": "limit", "required": False, "in": "query", "schema": {"type": "integer", "minimum": 1},
             "description": "Results per page (default 50, at most 500)."},
            {"name": "before", "required": False, "in": "query", "schema": {"type": "integer", "minimum": 1},
             "description": "Only deliveries with a smaller id (the next link sets it)."},
        ]  # fmt: skip


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
