"""The API of named events: ``POST /api/v1/events/{name}`` (:func:`tasks_api.events.event_post`)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tasks_api.event_hooks import event_hook_delete, event_hook_fire, event_hook_set, event_hook_url
from tasks_api.events import EventPosted, event_post
from tasks_api.hooks_api import SIGNED_REQUEST_HEADERS, HookView
from tasks_api.idempotent_requests import IDEMPOTENCY_PARAMETER, REPLAYED_HEADER_PARAMETER, idempotent_create_response
from tasks_app.event_subscriptions import EVENT_NAME, EVENT_NAME_HELP
from tasks_app.idempotency import HEADER, REPLAYED_HEADER, idempotency_key_clean
from tasks_app.models import EventHook, Team, TeamRole
from tasks_app.teams import require, team_resolve, teams_with_role
from tasks_app.teams.services import default_team_of
from tms_core.api.base import ApiViewMixin
from tms_core.api.schema import error_responses
from tms_core.auth import actor_for, request_user
from tms_core.errors import InvalidInput, RoleRequired


@extend_schema_field({"type": "object", "additionalProperties": True})
class ErrorsField(serializers.JSONField):
    """Per-field messages, as a 400's ``errors``."""


NAME_PARAMETER = OpenApiParameter(
    "name", str, OpenApiParameter.PATH, pattern=EVENT_NAME.pattern, description=f"The event's name: {EVENT_NAME_HELP}"
)
TEAM_PARAMETER = OpenApiParameter("team", str, description="The team (slug or id; default: yours; 404: none of yours).")


def _resolve_team(user: Any, value: str) -> Team:
    """The caller's team ``value`` names; 404 (not a 400: a query parameter names a resource) if none."""
    try:
        return team_resolve(user, value, members_only=True)
    except InvalidInput as exc:
        raise NotFound(exc.errors["team"][0]) from None


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
            NAME_PARAMETER,
            OpenApiParameter("team", str, description="Only this team (its slug or id; 404: no team of yours)."),
            IDEMPOTENCY_PARAMETER,
            REPLAYED_HEADER_PARAMETER,
        ],
        responses={202: EventPostedSerializer, **error_responses(422)},
    )
    def post(self, request: Request, name: str) -> Response:
        user = request_user(request)
        team = request.query_params.get("team")
        if team:
            chosen = _resolve_team(user, team)
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


class EventUrlSerializer(serializers.Serializer):
    id = serializers.CharField(source="pk", help_text="The event URL's id (the last part of `url`).")
    name = serializers.CharField(help_text="The event it posts.")
    team = serializers.IntegerField(source="team_id")
    url = serializers.SerializerMethodField(help_text="Where the outside system POSTs.")
    created_at = serializers.DateTimeField()
    rotated_at = serializers.DateTimeField(allow_null=True)
    last_used_at = serializers.DateTimeField(allow_null=True)

    def get_url(self, hook: EventHook) -> str:
        return event_hook_url(hook, request=self.context.get("request"))


class EventUrlMadeSerializer(EventUrlSerializer):
    secret = serializers.CharField(help_text="Shown this once: store it now (sign requests with it).")


def _team(request: Request) -> Team:
    """The team of ``?team=`` (default: the caller's own), where the caller must be an editor."""
    user = request_user(request)
    value = request.query_params.get("team")
    team = _resolve_team(user, value) if value else default_team_of(user)
    require(user, team.pk, TeamRole.EDITOR, "tasks_app.change_task", what="this team's event URLs")
    return team


class EventUrlView(ApiViewMixin, APIView):
    """A team's signed event URL for one event name: its secret shown only when made or rotated."""

    def _hook(self, team: Team, name: str) -> EventHook:
        hook = EventHook.objects.filter(team=team, name=name).first()
        if hook is None:
            raise NotFound("This team has no event URL for this name.")
        return hook

    @extend_schema(
        summary="Get an event URL",
        description="Never shows the secret.",
        parameters=[NAME_PARAMETER, TEAM_PARAMETER],
        responses={200: EventUrlSerializer, **error_responses(400)},
    )
    def get(self, request: Request, name: str) -> Response:
        hook = self._hook(_team(request), name)
        return Response(EventUrlSerializer(hook, context={"request": request}).data)

    @extend_schema(
        summary="Make or rotate an event URL",
        description=(
            "Makes the team's signed URL for this event name (201), or gives it a new secret (200: same URL, the "
            "old secret refused from now on); the secret is in this answer only. An outside system then posts the "
            "event by POSTing to `url`, signed as a trigger URL's requests are (editor)."
        ),
        request=None,
        parameters=[NAME_PARAMETER, TEAM_PARAMETER],
        responses={201: EventUrlMadeSerializer, 200: EventUrlMadeSerializer, **error_responses(400)},
    )
    def post(self, request: Request, name: str) -> Response:
        made = event_hook_set(team=_team(request), name=name, owner=request_user(request))
        body = {**EventUrlSerializer(made.hook, context={"request": request}).data, "secret": made.secret}
        return Response(body, status=status.HTTP_200_OK if made.rotated else status.HTTP_201_CREATED)

    @extend_schema(
        summary="Remove an event URL",
        description="Its requests answer 404 from now on.",
        request=None,
        parameters=[NAME_PARAMETER, TEAM_PARAMETER],
        responses={204: None, **error_responses(400)},
    )
    def delete(self, request: Request, name: str) -> Response:
        if not event_hook_delete(team=_team(request), name=name, actor=request_user(request)):
            raise NotFound("This team has no event URL for this name.")
        return Response(status=status.HTTP_204_NO_CONTENT)


EVENT_URL_ACCEPTED = inline_serializer(
    "EventUrlPosted",
    {
        "name": serializers.CharField(),
        "events": serializers.ListField(child=serializers.IntegerField()),
        "tasks": serializers.ListField(child=serializers.DictField(), help_text="task, outcome, execution"),
        "waits_nudged": serializers.IntegerField(),
    },
)


class EventHookView(HookView):
    """``POST /hooks/v1/events/<id>``: posts the URL's event, authenticated by its secret."""

    what, realm = "event URL", "event-url"

    @extend_schema(
        summary="Post a named event from an outside system (event URL)",
        description=(
            "Authenticated by the event URL's secret, as a trigger URL's requests are (a signature over the "
            "timestamp and the body, each signed request accepted once, or `Authorization: Bearer <secret>`). "
            "Posts the URL's event in its team as `POST /api/v1/events/{name}` does; a body that is a JSON "
            "object is the payload (else `{}`). 401 when the request does not prove itself, 404 for an unknown "
            "URL, 409 when this signed request was already received."
        ),
        request={"application/json": OpenApiTypes.OBJECT},
        parameters=[
            *SIGNED_REQUEST_HEADERS,
            IDEMPOTENCY_PARAMETER,
            OpenApiParameter(REPLAYED_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER, response=[202]),
        ],
        responses={202: EVENT_URL_ACCEPTED, **error_responses(400, 401, 409, 413, 422)},
    )
    def post(self, request: Request, hook_id: str) -> Response:
        return self.fire(event_hook_fire, request, hook_id)
