"""Approval steps in the API (issue 48): ``/api/v1/approvals`` lists the runs waiting for a
decision in your teams; ``POST /api/v1/executions/{id}/approve`` and ``/reject`` (in
:mod:`executions.api`) decide, through :mod:`executions.approvals`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from executions.approvals import MAX_COMMENT, approvals_pending
from executions.models import Approval, Execution
from executions.serializers import MaskedInputField
from runners.approval import approvers_of
from tms_core.api.base import ApiViewMixin, StrictInputMixin
from tms_core.api.schema import error_responses


class DecisionSerializer(StrictInputMixin, serializers.Serializer):
    comment = serializers.CharField(
        required=False, allow_blank=True, max_length=MAX_COMMENT, default="", help_text="Why, kept with the decision."
    )


class ApprovalSerializer(serializers.ModelSerializer):
    execution = serializers.IntegerField(source="execution_id", read_only=True)
    task = serializers.UUIDField(source="task_id", read_only=True)
    decided_by = serializers.CharField(source="decided_by_name", read_only=True, help_text="The approver's username.")

    class Meta:
        model = Approval
        fields = [
            "id",
            "execution",
            "attempt",
            "task",
            "requested_at",
            "decision",
            "decided_by",
            "decided_at",
            "comment",
        ]
        read_only_fields = fields


def _config(execution: Execution) -> dict[str, Any]:
    config = execution.config_override if execution.config_override is not None else execution.task.config
    return config if isinstance(config, dict) else {}


class PendingApprovalSerializer(serializers.Serializer):
    execution = serializers.IntegerField(source="pk", help_text="The run waiting: approve or reject it by this id.")
    attempt = serializers.IntegerField()
    task = serializers.UUIDField(source="task_id")
    task_name = serializers.CharField(source="task.name")
    team = serializers.IntegerField(source="team_id")
    workflow_run = serializers.IntegerField(allow_null=True)
    requested_at = serializers.DateTimeField(source="started_at", allow_null=True, help_text="When it began waiting.")
    deadline = serializers.SerializerMethodField(help_text="When the task's timeout ends the wait (`on_timeout`).")
    message = serializers.SerializerMethodField(help_text="What the approvers are asked (the config's `message`).")
    approvers = serializers.SerializerMethodField(help_text="A role, or the usernames who may decide.")
    on_timeout = serializers.SerializerMethodField()
    input = MaskedInputField(allow_null=True)

    def get_deadline(self, execution: Execution) -> str | None:
        if execution.started_at is None:
            return None
        return (execution.started_at + timedelta(seconds=execution.task.timeout.total_seconds())).isoformat()

    def get_message(self, execution: Execution) -> str:
        return str(_config(execution).get("message") or "")

    def get_approvers(self, execution: Execution) -> Any:
        return approvers_of(_config(execution))

    def get_on_timeout(self, execution: Execution) -> str:
        return str(_config(execution).get("on_timeout") or "reject")


@extend_schema(
    summary="List the approvals waiting for a decision",
    description=(
        "The runs of `approval` steps in your teams that wait for a person's decision, oldest first (`state=pending`, "
        "the only state listed here: a decision is in the run's output and the audit log). Approve or reject one "
        "with `POST /api/v1/executions/{execution}/approve` or `/reject`."
    ),
    parameters=[OpenApiParameter("state", str, OpenApiParameter.QUERY, enum=["pending"], description="pending")],
    responses={200: PendingApprovalSerializer(many=True), **error_responses(400)},
    tags=["executions"],
)
class ApprovalListView(ApiViewMixin, generics.ListAPIView):
    serializer_class = PendingApprovalSerializer

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):
            return Execution.objects.none()
        return approvals_pending(self.request.user)

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        state = request.query_params.get("state", "pending")
        if state not in ("", "pending"):
            raise ValidationError({"state": ['Only "pending" is listed.']})
        return super().list(request, *args, **kwargs)
