"""The execution and worker API: ``/api/v1/executions`` and ``/api/v1/workers``."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db.models import Case, F, Q, QuerySet, Value, When
from django.db.models.functions import Now
from django_filters import rest_framework as filters
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import generics, mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.filters import OrderingFilter
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from executions.models import Execution, ExecutionOrigin, ExecutionStatus, Worker, WorkerStatus
from executions.serializers import (
    CancelReportSerializer,
    ExecutionDetailSerializer,
    ExecutionSerializer,
    WorkerSerializer,
)
from executions.services import execution_cancel_by_user, execution_retry_by_user
from tasks_app.models import Task, TaskStatus
from tasks_app.services import actor_for
from tms_core.clock import db_now
from tms_project.api.base import ApiViewMixin, OwnerScopedMixin, StrictFilterSet
from tms_project.api.schema import error_responses

EXECUTION_ORDERING_FIELDS = ["scheduled_for", "id", "started_at", "finished_at"]
#: Filters and ordering; no free-text search over executions.
FILTER_BACKENDS = [DjangoFilterBackend, OrderingFilter]
EXECUTION_ID = OpenApiParameter(
    "id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH, description="The execution's id."
)


def history_first(queryset: QuerySet) -> QuerySet:
    """The default order of execution lists: what ran before what will run.

    Executions scheduled for now or earlier come first, newest first (running, just finished,
    then older history), then the upcoming ones, soonest first. Newest first by scheduled time
    alone opened a recurring task's list on its pre-created future runs. ``?ordering=`` replaces
    this order.
    """
    upcoming = Q(scheduled_for__gt=Now())
    return queryset.annotate(
        upcoming=Case(When(upcoming, then=Value(1)), default=Value(0)),
        past_at=Case(When(upcoming, then=None), default=F("scheduled_for")),
        upcoming_at=Case(When(upcoming, then=F("scheduled_for")), default=None),
    ).order_by("upcoming", F("past_at").desc(nulls_last=True), F("upcoming_at").asc(nulls_last=True), "-id")


class HistoryFirstMixin:
    """Execution lists in :func:`history_first` order unless ``?ordering=`` is given."""

    ordering = None  # OrderingFilter's default: leave the queryset's own order

    def get_queryset(self) -> QuerySet:
        queryset = super().get_queryset()  # type: ignore[misc]
        if self.request.query_params.get("ordering"):  # type: ignore[attr-defined]
            return queryset
        return history_first(queryset)


class UtcDateTimeFilter(filters.IsoDateTimeFilter):
    """An RFC 3339 date-time filter that queries in UTC: Python accepts offsets PostgreSQL refuses."""

    def filter(self, qs: QuerySet, value: datetime | None) -> QuerySet:
        return super().filter(qs, value.astimezone(UTC) if value is not None else None)


class ExecutionFilter(StrictFilterSet):
    task = filters.UUIDFilter(field_name="task_id", help_text="Only executions of this task.")
    status = filters.ChoiceFilter(choices=ExecutionStatus.choices, help_text="Only executions in this status.")
    origin = filters.ChoiceFilter(choices=ExecutionOrigin.choices, help_text="Only executions with this origin.")
    scheduled_after = UtcDateTimeFilter(
        field_name="scheduled_for", lookup_expr="gte", help_text="Only executions scheduled at or after this time."
    )
    scheduled_before = UtcDateTimeFilter(
        field_name="scheduled_for", lookup_expr="lt", help_text="Only executions scheduled before this time."
    )

    class Meta:
        model = Execution
        fields = ["task", "status", "origin", "scheduled_after", "scheduled_before"]


@extend_schema_view(
    list=extend_schema(
        summary="List your executions",
        description=(
            "What ran before what will run: executions scheduled for now or earlier first, newest first, then "
            "upcoming ones, soonest first (`?ordering=` replaces this order). Filter by task, status, origin and "
            "scheduled time range."
        ),
    ),
    retrieve=extend_schema(summary="Get an execution with its event timeline", parameters=[EXECUTION_ID]),
)
class ExecutionViewSet(
    HistoryFirstMixin, OwnerScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Executions of your tasks, each with its event timeline; cancel and retry them."""

    owner_field = "task__owner"
    queryset = Execution.objects.all()
    lookup_value_regex = r"[0-9]{1,18}"
    filterset_class = ExecutionFilter
    filter_backends = FILTER_BACKENDS
    ordering_fields = EXECUTION_ORDERING_FIELDS

    def get_queryset(self) -> QuerySet:
        queryset = super().get_queryset()
        if self.action != "list":
            queryset = queryset.prefetch_related("events")
        return queryset

    def get_serializer_class(self) -> type[BaseSerializer]:
        return ExecutionSerializer if self.action == "list" else ExecutionDetailSerializer

    @extend_schema(
        summary="Cancel an execution",
        description=(
            "Cancels a SCHEDULED, PENDING or RUNNING execution. A running one's external run is stopped "
            "through its runner where the runner supports it: 200 when nothing can still be running, 202 when "
            "the external run may go on (`external_run` says why). 409 when it already finished."
        ),
        request=None,
        parameters=[EXECUTION_ID],
        responses={
            200: CancelReportSerializer,
            202: OpenApiResponse(CancelReportSerializer, description="Cancelled; the external run may go on."),
            **error_responses(409),
        },
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        report = execution_cancel_by_user(execution=self.get_object(), actor=actor_for(request.user))
        code = status.HTTP_202_ACCEPTED if report.may_still_run else status.HTTP_200_OK
        return Response(CancelReportSerializer(report).data, status=code)

    @extend_schema(
        summary="Retry a failed or cancelled execution",
        description=(
            "Runs a FAILED or CANCELLED execution again as a new execution of the same task, due now, with "
            "`retry_of` pointing at the old one and the next attempt number (one attempt; the old execution "
            "stays as it was). 409 when it is not FAILED or CANCELLED, was already retried (retry the retry), "
            "or its task was deleted."
        ),
        request=None,
        parameters=[EXECUTION_ID],
        responses={201: ExecutionDetailSerializer, **error_responses(409)},
    )
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        execution = execution_retry_by_user(execution=self.get_object(), actor=actor_for(request.user))
        execution = Execution.objects.prefetch_related("events").get(pk=execution.pk)
        headers = {"Location": f"/api/v1/executions/{execution.pk}"}
        return Response(ExecutionDetailSerializer(execution).data, status=status.HTTP_201_CREATED, headers=headers)


@extend_schema(
    summary="List a task's executions",
    description=(
        "What ran before what will run: executions scheduled for now or earlier first, newest first, then upcoming "
        "ones, soonest first (`?ordering=` replaces this order); the same filters as `/api/v1/executions`."
    ),
    tags=["tasks"],
)
class TaskExecutionListView(HistoryFirstMixin, OwnerScopedMixin, generics.ListAPIView):
    """``/api/v1/tasks/{task_id}/executions``: one of your tasks' executions."""

    owner_field = "task__owner"
    queryset = Execution.objects.all()
    serializer_class = ExecutionSerializer
    filterset_class = ExecutionFilter
    filter_backends = FILTER_BACKENDS
    ordering_fields = EXECUTION_ORDERING_FIELDS

    def get_queryset(self) -> QuerySet:
        tasks = self.owner_scope(Task.objects.exclude(status=TaskStatus.DELETED))
        task = get_object_or_404(tasks, pk=self.kwargs["task_id"])
        return super().get_queryset().filter(task=task)


class WorkerFilter(filters.FilterSet):
    status = filters.ChoiceFilter(choices=WorkerStatus.choices, help_text="Only workers in this state.")

    class Meta:
        model = Worker
        fields = ["status"]


@extend_schema_view(
    list=extend_schema(
        summary="List workers (staff only)", description="Every worker process, dead ones too, latest heartbeat first."
    ),
    retrieve=extend_schema(summary="Get a worker (staff only)"),
)
class WorkerViewSet(ApiViewMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Worker processes with their state and last heartbeat. Staff only."""

    queryset = Worker.objects.all()
    serializer_class = WorkerSerializer
    permission_classes = [permissions.IsAdminUser]
    lookup_value_regex = r"[^/]+"
    filterset_class = WorkerFilter
    filter_backends = FILTER_BACKENDS
    ordering_fields = ["last_heartbeat", "started_at", "id"]
    ordering = ["-last_heartbeat"]

    def get_serializer_context(self) -> dict:
        return {**super().get_serializer_context(), "now": db_now()}
