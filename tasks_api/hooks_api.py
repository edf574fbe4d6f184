"""The API of trigger URLs: ``/api/v1/tasks/{id}/trigger-url`` (make, rotate, read, remove) and
the inbound endpoint ``/hooks/v1/<id>`` that outside systems call (no user, the URL's secret)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import generics, serializers, status
from rest_framework.exceptions import AuthenticationFailed, NotFound
from rest_framework.parsers import BaseParser
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tasks_api.hooks import HookNotFound, SignedRequest, hook_fire, hook_url, task_hook_delete, task_hook_set
from tasks_app.hooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, TOLERANCE, HookRefused
from tasks_app.idempotency import HEADER, REPLAYED_HEADER, StoredResponse, idempotency_key_clean
from tasks_app.models import Task, TaskHook, TaskStatus
from teams_api.scope import TeamScopedMixin
from tms_core.api.base import ApiViewMixin
from tms_core.api.schema import error_responses
from tms_core.api.throttling import SettingRateThrottle
from tms_core.client_address import client_address


class TriggerUrlSerializer(serializers.Serializer):
    id = serializers.CharField(source="pk", help_text="The trigger URL's id (the last part of `url`).")
    url = serializers.SerializerMethodField(help_text="Where the outside system POSTs.")
    created_at = serializers.DateTimeField()
    rotated_at = serializers.DateTimeField(allow_null=True, help_text="When the secret was last replaced.")
    last_used_at = serializers.DateTimeField(allow_null=True, help_text="When a request last started a run.")

    def get_url(self, hook: TaskHook) -> str:
        return hook_url(hook, request=self.context.get("request"))


class TriggerUrlMadeSerializer(TriggerUrlSerializer):
    secret = serializers.CharField(help_text="Shown this once: store it now (sign requests with it).")


class TaskTriggerUrlView(TeamScopedMixin, generics.GenericAPIView):
    """A task's trigger URL: one per task, its secret shown only when it is made or rotated."""

    queryset = Task.objects.exclude(status=TaskStatus.DELETED)
    serializer_class = TriggerUrlSerializer
    pagination_class = None

    def _hook(self, task: Task) -> TaskHook:
        hook = TaskHook.objects.filter(task=task).first()
        if hook is None:
            raise NotFound("This task has no trigger URL.")
        return hook

    @extend_schema(summary="Get a task's trigger URL", description="Never shows the secret.")
    def get(self, request: Request, pk: str) -> Response:
        return Response(self.get_serializer(self._hook(self.get_object())).data)

    @extend_schema(
        summary="Make or rotate a task's trigger URL",
        description=(
            "Makes the task's trigger URL (201), or gives the existing one a new secret (200: same URL, the old "
            "secret is refused from now on). The secret is in this answer only. An outside system then starts "
            "a run by POSTing to `url`, signed with the secret (`X-TMS-Timestamp` and `X-TMS-Signature`, as "
            "TMS's own webhooks are) or with `Authorization: Bearer <secret>`."
        ),
        request=None,
        responses={201: TriggerUrlMadeSerializer, 200: TriggerUrlMadeSerializer},
    )
    def post(self, request: Request, pk: str) -> Response:
        made = task_hook_set(task=self.get_object())
        body = {**self.get_serializer(made.hook).data, "secret": made.secret}
        return Response(body, status=status.HTTP_200_OK if made.rotated else status.HTTP_201_CREATED)

    @extend_schema(
        summary="Remove a task's trigger URL",
        description="Its requests answer 404 from now on.",
        request=None,
        responses={204: None},
    )
    def delete(self, request: Request, pk: str) -> Response:
        if not task_hook_delete(task=self.get_object()):
            raise NotFound("This task has no trigger URL.")
        return Response(status=status.HTTP_204_NO_CONTENT)


class HookRateThrottle(SettingRateThrottle):
    """Requests per client address, at ``TMS_HOOK_THROTTLE``."""

    scope = "hook"
    setting = "TMS_HOOK_THROTTLE"


class AnyBodyParser(BaseParser):
    """Accepts any content type: the body is signed as bytes, never parsed."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> dict[str, Any]:
        return {}  # pragma: no cover - the view reads request.body, never request.data


HOOK_ACCEPTED = inline_serializer(
    "TriggerUrlRun",
    {
        "execution": serializers.IntegerField(help_text="The run started (or joined)."),
        "task": serializers.UUIDField(),
        "status": serializers.CharField(),
        "due_at": serializers.DateTimeField(),
        "joined": serializers.BooleanField(help_text="True when the trigger joined the task's debounced run."),
    },
)


#: The headers a signed request (a trigger URL's, an event URL's) proves itself with.
SIGNED_REQUEST_HEADERS = [
    OpenApiParameter(TIMESTAMP_HEADER, str, OpenApiParameter.HEADER, required=False),
    OpenApiParameter(SIGNATURE_HEADER, str, OpenApiParameter.HEADER, required=False),
]


class HookView(ApiViewMixin, APIView):
    """``POST /hooks/v1/<id>``: authenticated by the trigger URL's secret, not by a user."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [HookRateThrottle]
    parser_classes = [AnyBodyParser]
    #: What a 404's message calls the URL, and the realm a 401 names.
    what, realm = "trigger URL", "trigger-url"

    def get_authenticate_header(self, request: Request) -> str:
        return f'TMS-Signature realm="{self.realm}"'

    @extend_schema(
        summary="Start a task's run from an outside system (trigger URL)",
        description=(
            f"Authenticated by the trigger URL's secret, not by a user: send `{TIMESTAMP_HEADER}` (Unix time in "
            f"seconds, within {TOLERANCE} s of the server's) and `{SIGNATURE_HEADER}` (hex HMAC-SHA256 of "
            '`"{timestamp}.{body}"` under the secret), or `Authorization: Bearer <secret>`. Starts a run as `POST '
            "/api/v1/tasks/{id}/trigger` does (quota, `trigger_debounce`, `Idempotency-Key`, whose keys are the "
            "trigger URL's own, apart from the owner's): 202 with the run, 200 when it joined the debounced run. "
            "401 when the request does not prove itself, 404 for an unknown URL, 409 when the task is paused or "
            "when this signed request was already received (`request_replayed`: each signed request starts at most "
            "one run; sign again with the current time to start another). The body is any content (at most "
            "`TMS_MAX_REQUEST_BYTES`), signed as "
            "bytes; when it is a JSON object it becomes the run's `input` (checked by the task's `input_schema`: "
            "400 on `input` when it does not satisfy it; filling the task's `input_fills`). Any other body starts "
            "a run without input."
        ),
        # Documented as the JSON object a webhook sender sends (any content type is accepted and
        # signed as bytes): a "*/*" body made clients generated from the schema skip the endpoint.
        request={"application/json": OpenApiTypes.OBJECT},
        parameters=[
            *SIGNED_REQUEST_HEADERS,
            OpenApiParameter(
                HEADER,
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                required=False,
                pattern=r"^[!-~](?:[ -~]{0,253}[!-~])?$",
                description="A trigger sent again with the same key (and body) answers the first run.",
            ),
            OpenApiParameter(REPLAYED_HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER, response=[202, 200]),
        ],
        responses={
            202: HOOK_ACCEPTED,
            200: OpenApiResponse(HOOK_ACCEPTED, description="Joined the task's debounced run."),
            **error_responses(400, 401, 409, 413, 422),
        },
    )
    def post(self, request: Request, hook_id: str) -> Response:
        return self.fire(hook_fire, request, hook_id)

    def fire(self, fire: Callable[..., StoredResponse], request: Request, hook_id: str) -> Response:
        """The answer of ``fire`` (:func:`~tasks_api.hooks.hook_fire` or an event URL's) to the
        request: the stored response (marked replayed for a repeated key), 404 for an unknown URL,
        401 when the request does not prove itself."""
        try:
            signed = SignedRequest(
                headers=request.headers,
                body=request.body,
                idempotency_key=idempotency_key_clean(request.headers.get(HEADER)),
                remote_addr=client_address(request),
            )
            stored = fire(hook_id=hook_id, request=signed)
        except HookNotFound:
            raise NotFound(f"No {self.what} has this id (it was never made, or was removed).") from None
        except HookRefused as exc:
            raise AuthenticationFailed(str(exc)) from None
        headers = {REPLAYED_HEADER: "true"} if stored.replayed else {}
        return Response(stored.body, status=stored.status, headers=headers)
