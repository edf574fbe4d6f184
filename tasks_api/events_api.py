"""The API of named events: ``POST /api/v1/events/{name}`` (:func:`tasks_api.events.event_post`)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tasks_api.events import EventPosted, event_post
from tasks_api.idempotent_requests import IDEMPOTENCY_PARAMETER, REPLAYED_HEADER_PARAMETER, idempotent_create_response
from tasks_app.idempotency import HEADER, idempotency_key_clean
from tasks_app.models import TeamRole
from tasks_app.teams import require, team_resolve, teams_with_role
from tms_core.api.base import ApiViewMixin
from tms_core.api.schema import error_responses
from tms_core.auth import actor_for, request_user
from tms_core.errors import RoleRequired


@extend_schema_field({"type": "object", "additionalProperties": True})
class ErrorsField(serializers.JSONField):
    """Per-field messages, as a 400's ``errors``."""


class EventTaskSerializer(serializers.Serializer):
    task = serializers.UUIDField(source="task.pk", help_text="The subscribed task.")
    task_name = serializers.CharField(source="task.name")
    outcome = serializers.ChoiceField(
        choices=["created", "joined", "refused"],
        help_text="created: a run was created; joined: a debounced run still waiting took this event "
        "(its due time moved on); refused: the task refused the payload or its team's quota is used up.",
    )
    execution = serializers.IntegerField(source="execution_id", allow_null=True, help_text="The run (null: refused).")
    due_at = serializers.DateTimeField(allow_null=True)
    errors = ErrorsField(  # type: ignore[assignment]
        allow_null=True, help_text="Why the task refused the event, per field."
    )


class EventPostedSerializer(serializers.Serializer):
    name = serializers.CharField()
    events = serializers.ListField(
        child=serializers.IntegerField(), source="event_ids", help_text="The event recorded in each team."
    )
    tasks = EventTaskSerializer(many=True, help_text="Each subscribed active task and what the event did for it.")
    waits_nudged = serializers.IntegerField(
        source="nudged", help_text="Wait-for-event runs waiting for this name that look at it now."
    )


class EventPayloadField(serializers.JSONField):
    """Any JSON object: the event's payload."""


class EventView(ApiViewMixin, APIView):
    """Post a named event."""

    @extend_schema(
        summary="Post a named event",
        description=(
            "Records the event in each of your teams where you are operator or more (`?team=` one of them) "
            "and, in one transaction, starts a run of every active task of those teams subscribed to the name "
            "(`on_events`), the body (a JSON object) as the run's input. A task whose `input_schema` refuses "
            "the payload, or whose team's hourly quota is used up, gets no run (`refused`, with the errors): "
            "the others still start. A subscription with a `debounce` makes one run of the events of the same "
            "key. Wait-for-event steps (`wait_event` runner) waiting for the name are nudged to look at it. "
            "With an `Idempotency-Key`, the same event sent again answers the first answer and starts nothing."
        ),
        request={"application/json": {"type": "object", "additionalProperties": True}},
        parameters=[
            OpenApiParameter("team", str, description="Only this team (its slug or id)."),
            IDEMPOTENCY_PARAMETER,
            REPLAYED_HEADER_PARAMETER,
        ],
        responses={202: EventPostedSerializer, **error_responses(422)},
    )
    def post(self, request: Request, name: str) -> Response:
        user = request_user(request)
        team = request.query_params.get("team")
        if team:
            chosen = team_resolve(user, team, members_only=True)
            require(user, chosen.pk, TeamRole.OPERATOR, "tasks_app.change_task", what="this team's tasks")
            team_ids = [chosen.pk]
        else:
            team_ids = list(teams_with_role(user, TeamRole.OPERATOR).values_list("pk", flat=True))
            if not team_ids:
                raise RoleRequired(
                    "To post events you need operator or higher in a team.", role=TeamRole.OPERATOR, held=None
                )
        payload: Any = request.data if request.body else {}
        key = idempotency_key_clean(request.headers.get(HEADER)) or ""

        def create() -> tuple[int, Any]:
            posted: EventPosted = event_post(
                team_ids=team_ids, name=name, payload=payload, actor=actor_for(user), key=key
            )
            return status.HTTP_202_ACCEPTED, EventPostedSerializer(posted).data

        return idempotent_create_response(request, create)
