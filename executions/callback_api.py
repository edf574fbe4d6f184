"""The callback endpoint a job POSTs its heartbeat, progress or outcome to."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from executions.callbacks import TOKEN_HEADER, CallbackRefused, callback_verify
from executions.reports import execution_report
from tms_core import tracing
from tms_core.api.base import StrictInputMixin
from tms_core.api.throttling import SettingRateThrottle


class CallbackSerializer(StrictInputMixin, serializers.Serializer):
    status = serializers.ChoiceField(choices=["heartbeat", "progress", "succeeded", "failed"])
    output = serializers.CharField(required=False, allow_blank=True, default="", max_length=1_000_000)
    error = serializers.CharField(required=False, allow_blank=True, default="", max_length=1_000_000)
    progress = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
    retryable = serializers.BooleanField(required=False, default=True)


class CallbackRateThrottle(SettingRateThrottle):
    """Reports per client address, at ``TMS_CALLBACK_THROTTLE``."""

    scope = "callback"
    setting = "TMS_CALLBACK_THROTTLE"


def _token(request: Request) -> str:
    """The token from ``X-TMS-Callback-Token`` or ``Authorization: Bearer``; never from the URL."""
    token = request.headers.get(TOKEN_HEADER, "").strip()
    if token:
        return token
    scheme, _, value = request.headers.get("Authorization", "").strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


class ExecutionCallbackView(APIView):
    """Authenticated by the signed token the job was given (in a header), not by a user.

    The token is checked before anything else, the execution's existence included: without a
    valid token every id gets the same 403. A ``token`` query parameter is refused (403) rather
    than read: URLs end up in access logs.
    """

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [CallbackRateThrottle]

    @extend_schema(
        request=CallbackSerializer,
        parameters=[
            OpenApiParameter(
                TOKEN_HEADER,
                str,
                OpenApiParameter.HEADER,
                required=False,
                description="The attempt's callback token (or send `Authorization: Bearer <token>`).",
            )
        ],
        responses={
            202: inline_serializer(
                "CallbackAccepted",
                {
                    "result": serializers.CharField(),
                    "token": serializers.CharField(
                        required=False, help_text="A renewed token for the next reports (after heartbeat/progress)."
                    ),
                },
            )
        },
        summary="Report heartbeat, progress or outcome of the current attempt (for jobs)",
    )
    def post(self, request: Request, pk: int) -> Response:
        if "token" in request.query_params:
            raise PermissionDenied(
                f"Send the callback token in the {TOKEN_HEADER} header (or Authorization: Bearer), not in the URL."
            )
        token = _token(request)
        try:
            callback_verify(token=token, execution_id=pk)
        except CallbackRefused as exc:
            raise PermissionDenied(str(exc)) from None
        serializer = CallbackSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            with tracing.continued(request.headers):
                answer = execution_report(
                    execution_id=pk,
                    token=token,
                    state=data["status"],
                    output=data["output"],
                    error=data["error"],
                    progress=data["progress"],
                    retryable=data["retryable"],
                )
        except CallbackRefused as exc:
            raise PermissionDenied(str(exc)) from None
        except LookupError:
            raise NotFound() from None
        body = {"result": answer.result}
        if answer.token is not None:
            body["token"] = answer.token
        return Response(body, status=status.HTTP_202_ACCEPTED)
