"""The callback endpoint a job POSTs its heartbeat, progress or outcome to."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from executions.callbacks import CallbackRefused
from executions.reports import execution_report
from tms_project.api.base import StrictInputMixin


class CallbackSerializer(StrictInputMixin, serializers.Serializer):
    status = serializers.ChoiceField(choices=["heartbeat", "progress", "succeeded", "failed"])
    output = serializers.CharField(required=False, allow_blank=True, default="", max_length=1_000_000)
    error = serializers.CharField(required=False, allow_blank=True, default="", max_length=1_000_000)
    progress = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
    retryable = serializers.BooleanField(required=False, default=True)


class ExecutionCallbackView(APIView):
    """Authenticated by the signed token in the URL the job was given, not by a user."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes: list = []

    @extend_schema(
        request=CallbackSerializer,
        parameters=[OpenApiParameter("token", str, OpenApiParameter.QUERY, required=True)],
        responses={202: inline_serializer("CallbackAccepted", {"result": serializers.CharField()})},
        summary="Report heartbeat, progress or outcome of the current attempt (for jobs)",
    )
    def post(self, request: Request, pk: int) -> Response:
        serializer = CallbackSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            result = execution_report(
                execution_id=pk,
                token=request.query_params.get("token", ""),
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
        return Response({"result": result}, status=status.HTTP_202_ACCEPTED)
