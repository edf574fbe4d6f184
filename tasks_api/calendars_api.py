"""``/api/v1/calendars``: business calendars (public holidays of a country, extra dates, weekends)
that tasks name with a ``calendar_policy``; ``/days`` lists a calendar's closed days."""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from tasks_api.calendars import calendar_closed_days, calendar_create, calendar_delete, calendar_update
from tasks_app.calendars import MAX_CLOSED_RUN, MAX_EXTRA_DATES
from tasks_app.models import Calendar
from teams_api.scope import TEAM_FILTER_HELP, TeamOwnedMixin, refuse_team_change, team_field
from tms_core.api.base import StrictInputMixin
from tms_core.api.schema import error_responses
from tms_core.auth import request_user
from tms_core.errors import InvalidInput


class ExtraDateSerializer(StrictInputMixin, serializers.Serializer):
    start = serializers.DateField(help_text="First closed day (YYYY-MM-DD).")
    end = serializers.DateField(required=False, allow_null=True, help_text="Last closed day (default: start).")
    # DRF's serializer metaclass moves declared fields off the class: Field.label is not shadowed.
    label = serializers.CharField(  # type: ignore[assignment]
        required=False, allow_blank=True, default="", max_length=100, help_text="Why it is closed."
    )

    def to_representation(self, instance: Any) -> dict[str, Any]:
        return {"start": instance["start"], "end": instance["end"], "label": instance.get("label", "")}


class CalendarSerializer(StrictInputMixin, serializers.ModelSerializer):
    """A business calendar. Countries and subdivisions are checked by the service against the
    pinned ``holidays`` package; each error a 400 on its field."""

    read_only_names = frozenset({"id", "owner", "tasks", "created_at", "updated_at"})

    owner: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="username", read_only=True, help_text="Who defined it."
    )
    team = team_field("the calendar")
    name = serializers.CharField(max_length=100)
    country = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=3,
        help_text="ISO 3166 code whose public holidays close (holidays package, pinned), e.g. DE, US. Empty: none.",
    )
    subdivision = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=10,
        help_text="A subdivision of the country whose own holidays close too, e.g. BY (Bavaria) for DE.",
    )
    weekends_closed = serializers.BooleanField(required=False, default=False, help_text="Close the weekend days.")
    weekend_days = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=7),
        required=False,
        default=None,
        allow_null=True,
        max_length=6,
        help_text="ISO weekdays of the weekend, 1 Monday ... 7 Sunday (default [6, 7]).",
    )
    extra_dates = ExtraDateSerializer(  # type: ignore[call-arg]  # max_length goes to the ListSerializer
        many=True,
        required=False,
        default=list,
        max_length=MAX_EXTRA_DATES,
        help_text=f"More closed dates and ranges, each with a label (a range at most {MAX_CLOSED_RUN} days).",
    )
    tasks = serializers.SerializerMethodField(help_text="How many tasks (not deleted) use it.")

    class Meta:
        model = Calendar
        fields = [
            "id",
            "name",
            "owner",
            "team",
            "country",
            "subdivision",
            "weekends_closed",
            "weekend_days",
            "extra_dates",
            "tasks",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "owner", "tasks", "created_at", "updated_at"]
        # The name's uniqueness in the team is the service's check (a 400 on ``name``); DRF's own
        # validator for the constraint would make ``team`` required.
        validators: list = []

    def get_tasks(self, calendar: Calendar) -> int:
        return calendar.tasks.exclude(status="DELETED").count()


class ClosedDaySerializer(serializers.Serializer):
    date = serializers.DateField()
    reason = serializers.CharField(help_text="The holiday's name, an extra date's label, or `weekend`.")


_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _date_param(request: Request, name: str, default: date) -> date:
    """A query parameter's date (RFC 3339 full-date); absent: ``default``; empty or another form: 400."""
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        if not _DATE.fullmatch(text):
            raise ValueError(text)
        return date.fromisoformat(text)
    except ValueError:
        raise InvalidInput.on(name, "A date, YYYY-MM-DD.") from None


def _changes(data: dict[str, Any]) -> dict[str, Any]:
    """Validated input as the services take it (extra dates as ISO text)."""
    if "extra_dates" in data:
        data["extra_dates"] = [
            {"start": item["start"], "end": item.get("end") or item["start"], "label": item.get("label", "")}
            for item in data["extra_dates"]
        ]
    return data


@extend_schema_view(
    list=extend_schema(
        summary="List your teams' business calendars",
        parameters=[OpenApiParameter("team", OpenApiTypes.STR, description=TEAM_FILTER_HELP)],
    ),
    retrieve=extend_schema(summary="Get a business calendar"),
    create=extend_schema(summary="Define a business calendar"),
    partial_update=extend_schema(
        summary="Change a business calendar",
        description="A change of what it closes re-plans the tasks using it: their SCHEDULED runs not yet "
        "started are replaced.",
    ),
    destroy=extend_schema(summary="Delete a business calendar", responses={204: None, **error_responses(409)}),
)
class CalendarViewSet(TeamOwnedMixin, viewsets.ModelViewSet):
    """Business calendars of the requesting user's teams (staff read every team's): members read
    them, editors create, change and delete them."""

    queryset = Calendar.objects.select_related("owner").all()
    serializer_class = CalendarSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def perform_create(self, serializer: BaseSerializer) -> None:
        serializer.instance = calendar_create(
            owner=request_user(self.request), **_changes(dict(serializer.validated_data))
        )

    def perform_update(self, serializer: BaseSerializer) -> None:
        assert isinstance(serializer.instance, Calendar)
        refuse_team_change(serializer.validated_data, "A calendar")
        serializer.instance = calendar_update(
            calendar=serializer.instance,
            changes=_changes(dict(serializer.validated_data)),
            actor=request_user(self.request).get_username(),
        )

    def perform_destroy(self, instance: Calendar) -> None:
        calendar_delete(calendar=instance)

    @extend_schema(
        summary="A calendar's closed days",
        parameters=[
            OpenApiParameter("from", OpenApiTypes.DATE, description="First day (YYYY-MM-DD; default today)."),
            OpenApiParameter(
                "to", OpenApiTypes.DATE, description="Last day (YYYY-MM-DD; default from + 30 days; at most 366 days)."
            ),
        ],
        responses={200: ClosedDaySerializer(many=True)},
    )
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def days(self, request: Request, pk: str | None = None) -> Response:
        calendar = self.get_object()
        start = _date_param(request, "from", date.today())
        end = _date_param(request, "to", min(start, date.max - timedelta(days=30)) + timedelta(days=30))
        days = calendar_closed_days(calendar=calendar, start=start, end=end)
        return Response(ClosedDaySerializer([{"date": day, "reason": why} for day, why in days], many=True).data)
