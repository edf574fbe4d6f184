"""The execution and worker API: ``/api/v1/executions`` and ``/api/v1/workers``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django import forms
from django.db.models import Q, QuerySet
from django.http import StreamingHttpResponse
from django.utils.dateparse import parse_datetime
from django_filters import rest_framework as filters
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import generics, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.filters import OrderingFilter
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from executions.approval_api import ApprovalSerializer, DecisionSerializer
from executions.approvals import approval_decide
from executions.models import ArchiveIndex, Execution, ExecutionOrigin, ExecutionStatus, Worker, WorkerStatus
from executions.replay import MAX_REPLAY, execution_replay_one, executions_replay_by_user, replay_select
from executions.retention import archive_read
from executions.serializers import (
    REPLAY_STATUSES,
    ArchiveIndexSerializer,
    CancelReportSerializer,
    ExecutionDetailSerializer,
    ExecutionSerializer,
    ReplayResultSerializer,
    ReplaySerializer,
    SingleReplaySerializer,
    WorkerSerializer,
    WorkflowCancelSerializer,
)
from executions.services import execution_cancel_by_user, execution_retry_by_user, workflow_run_cancel_by_user
from tasks_app.models import Task, TaskStatus
from tasks_app.teams import scope_to_teams
from teams_api.scope import TeamFilterSet, TeamScopedMixin
from tms_core.api.base import ApiViewMixin, IsSupportStaff, StrictFilterSet
from tms_core.api.keyset import KeysetPagination, Segment
from tms_core.api.schema import detail_post, error_responses
from tms_core.api.stops import stop_response, stop_responses
from tms_core.auth import actor_for, request_user
from tms_core.clock import db_now

EXECUTION_ORDERING_FIELDS = ["scheduled_for", "id", "started_at", "finished_at"]
#: Filters and ordering; no free-text search over executions.
FILTER_BACKENDS = [DjangoFilterBackend, OrderingFilter]
EXECUTION_ID = OpenApiParameter(
    "id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH, description="The execution's id."
)


#: ``?ordering=`` values of the execution lists: one column, ties broken by id in the same direction.
ORDERINGS = frozenset(f"{sign}{name}" for name in EXECUTION_ORDERING_FIELDS for sign in ("", "-"))
_BAD_CURSOR = "Invalid cursor: use the next or previous link of a page as it is."
ORDERING_PARAMETER = OpenApiParameter(
    "ordering",
    str,
    OpenApiParameter.QUERY,
    # The empty value is the default order, as in every other list (a form that sends an empty
    # field): part of the enum, so a client generated from the schema may send it too.
    enum=["", *sorted(ORDERINGS)],
    description="Replaces the history-first order: by this column (`-` for descending), ties by id the same way; "
    "rows without a value (not started, not finished) come last. Empty: the history-first order.",
)

# ExecutionKeysetMixin is only ever combined with DRF's GenericAPIView: let the type checker see that base.
if TYPE_CHECKING:
    _ViewBase = generics.GenericAPIView
else:
    _ViewBase = object


class ExecutionKeysetMixin(_ViewBase):
    """Execution lists paged by cursor (:mod:`tms_core.api.keyset`), in history-first order.

    The default order is what ran before what will run: executions scheduled for the first
    page's instant or earlier, newest first (running, just finished, then older history), then
    the upcoming ones, soonest first (newest first alone opened a recurring task's list on its
    pre-created future runs). That instant travels in the cursor, so a walk through the pages
    cuts the list at one place however long it takes. Each part reads two index ranges, merged:
    execution_ran_idx (every status but SCHEDULED) and execution_waiting_idx (SCHEDULED).

    ``?ordering=`` (one of :data:`ORDERINGS`) replaces that order: by the column, then id; rows
    where the column is empty (not started or not finished yet) come after the others.
    """

    pagination_class = KeysetPagination
    ordering = None  # OrderingFilter's default: the pagination orders

    def keyset_segments(self, queryset: QuerySet, state: dict) -> list[Segment]:
        queryset = queryset.order_by()
        # An empty ?ordering= reads as none, as in every other list.
        ordering = [value for value in self.request.query_params.getlist("ordering") if value]
        if ordering:
            if len(ordering) > 1 or ordering[0] not in ORDERINGS:
                raise ValidationError(
                    {"ordering": [f"One of: {', '.join(sorted(ORDERINGS))} (ties are ordered by id the same way)."]}
                )
            name = ordering[0].lstrip("-")
            descending = ordering[0].startswith("-")
            if name == "id":
                return [Segment([queryset], None, descending)]
            if name == "scheduled_for":
                return [Segment([queryset], name, descending)]
            return [
                Segment([queryset.filter(**{f"{name}__isnull": False})], name, descending),
                Segment([queryset.filter(**{f"{name}__isnull": True})], None, descending),
            ]
        split = _state_instant(state)
        waiting = Q(status=ExecutionStatus.SCHEDULED)
        past, upcoming = queryset.filter(scheduled_for__lte=split), queryset.filter(scheduled_for__gt=split)
        return [
            Segment([past.exclude(waiting), past.filter(waiting)], "scheduled_for", descending=True),
            Segment([upcoming.exclude(waiting), upcoming.filter(waiting)], "scheduled_for", descending=False),
        ]


def _state_instant(state: dict) -> datetime:
    """The instant splitting past from upcoming: the first page's (kept in ``state``), else now."""
    if "t" not in state:
        now = db_now()
        state["t"] = now.isoformat()
        return now
    when = parse_datetime(state["t"]) if isinstance(state["t"], str) else None
    if when is None or when.tzinfo is None:
        raise ValidationError({"cursor": [_BAD_CURSOR]})
    return when


class UtcDateTimeFilter(filters.IsoDateTimeFilter):
    """An RFC 3339 date-time filter that queries in UTC: Python accepts offsets PostgreSQL refuses."""

    def filter(self, qs: QuerySet, value: datetime | None) -> QuerySet:
        return super().filter(qs, value.astimezone(UTC) if value is not None else None)


class WholeNumberFilter(filters.NumberFilter):
    """A number filter that takes whole numbers only (``1.5`` or ``x`` is a 400 on the filter)."""

    field_class = forms.IntegerField


class ExecutionFilter(TeamFilterSet):
    task = filters.UUIDFilter(field_name="task_id", help_text="Only executions of this task.")
    status = filters.ChoiceFilter(choices=ExecutionStatus.choices, help_text="Only executions in this status.")
    origin = filters.ChoiceFilter(choices=ExecutionOrigin.choices, help_text="Only executions with this origin.")
    scheduled_after = UtcDateTimeFilter(
        field_name="scheduled_for", lookup_expr="gte", help_text="Only executions scheduled at or after this time."
    )
    scheduled_before = UtcDateTimeFilter(
        field_name="scheduled_for", lookup_expr="lt", help_text="Only executions scheduled before this time."
    )
    workflow_run = WholeNumberFilter(
        field_name="workflow_run",
        min_value=1,
        max_value=2**63 - 1,  # a bigint: a larger value is a 400, not a database error
        help_text="Only the runs of this workflow run (the id of its root execution): the root and its steps.",
    )

    class Meta:
        model = Execution
        fields = ["task", "status", "origin", "scheduled_after", "scheduled_before", "team", "workflow_run"]


@extend_schema_view(
    list=extend_schema(
        summary="List your executions",
        description=(
            "What ran before what will run: executions scheduled for now or earlier first, newest first, then "
            "upcoming ones, soonest first (`?ordering=` replaces this order). Filter by task, status, origin and "
            "scheduled time range. Paged by cursor: follow `next` and `previous`; there is no total count and "
            "`?offset=` is refused (400)."
        ),
        parameters=[ORDERING_PARAMETER],
    ),
    retrieve=extend_schema(summary="Get an execution with its event timeline", parameters=[EXECUTION_ID]),
)
class ExecutionViewSet(
    ExecutionKeysetMixin, TeamScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Executions of your teams' tasks, each with its event timeline; cancel and retry them."""

    #: Every write here is an operator's (tasks_app.teams).
    operator_actions = frozenset({"cancel", "cancel_workflow", "retry", "approve", "reject"})
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

    @detail_post(
        EXECUTION_ID,
        summary="Cancel an execution",
        description=(
            "Cancels a SCHEDULED, PENDING or RUNNING execution. A running one's external run is stopped "
            "through its runner where the runner supports it: 200 when nothing can still be running, 202 when "
            "the external run may go on (`external_run` says why). 409 when it already finished."
        ),
        request=None,
        responses={
            **stop_responses(CancelReportSerializer, "Cancelled"),
            **error_responses(409),
        },
    )
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        report = execution_cancel_by_user(execution=self.get_object(), actor=actor_for(request_user(request)))
        return stop_response(report, CancelReportSerializer)

    @detail_post(
        EXECUTION_ID,
        url_path="cancel-workflow",
        summary="Cancel the workflow run of an execution",
        description=(
            "Cancels every step still to run or running of the workflow run this execution belongs to (see "
            "`workflow_run`; an execution outside any is cancelled alone, as its own root), as `cancel` would each. "
            "A cancelled step starts none of its followers, so the workflow run stops. 200 with each step cancelled "
            "(none if nothing was active)."
        ),
        request=None,
        responses={200: WorkflowCancelSerializer},
    )
    def cancel_workflow(self, request: Request, pk: str | None = None) -> Response:
        workflow_run, reports = workflow_run_cancel_by_user(
            execution=self.get_object(), actor=actor_for(request_user(request))
        )
        data = {"workflow_run": workflow_run, "executions": reports}
        return Response(WorkflowCancelSerializer(data).data, status=status.HTTP_200_OK)

    @extend_schema(
        summary="Replay executions",
        description=(
            "Runs a selection of your finished executions again: `task` (or `tasks`), optionally narrowed by "
            "`status` (default: SUCCEEDED, FAILED and CANCELLED) and by when they finished (`since` inclusive, "
            "`until` exclusive, on `finished_at`). Each gets a new execution due now, `origin` replay, "
            "`replay_of` the old one, attempt 1, with the old one's input unless `input` replaces it, and the "
            f"task's config unless `config` overrides part of it for these runs. At most {MAX_REPLAY} a request "
            "(400 beyond: narrow the selection). All or nothing: the new runs count against your hourly quota "
            "of executions created on request (429, nothing created). `dry_run` checks it all, the quota "
            "included, and creates and counts nothing. "
            "Replaying needs the operator role in each task's team; a `config` changes what the runs do and "
            "needs the editor role there (403 naming the role, nothing created): an operator gives `input` only. "
            "404 for a task that is not yours."
        ),
        request=ReplaySerializer,
        responses={
            201: ReplayResultSerializer,
            200: OpenApiResponse(ReplayResultSerializer, description="Dry run, or a selection that matched nothing."),
            **error_responses(404, 409),
        },
    )
    @action(detail=False, methods=["post"])
    def replay(self, request: Request) -> Response:
        serializer = ReplaySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        user = request_user(request)
        task_ids = data["tasks"] if "tasks" in data else [data["task"]]
        statuses = data.get("status") or REPLAY_STATUSES
        ids = replay_select(
            user=user,
            task_ids=task_ids,
            statuses=statuses,
            since=data.get("since"),
            until=data.get("until"),
            changes_config=data["config"] is not None,
        )
        selection = {
            "tasks": [str(task_id) for task_id in task_ids],
            "status": list(statuses),
            **{key: data[key].isoformat() for key in ("since", "until") if key in data},
        }
        report = executions_replay_by_user(
            user=user,
            owner_id=user.pk,
            execution_ids=ids,
            actor=actor_for(user),
            run_input=data["input"],
            config=data["config"],
            dry_run=data["dry_run"],
            selection=selection,
            visible=scope_to_teams(Execution.objects.all(), user),
        )
        body = {
            "dry_run": report.dry_run,
            "count": report.count,
            "replayed": report.replayed,
            "created": report.created,
            "dropped_secrets": report.dropped_secrets,
        }
        # 201 only when runs were created: a dry run, or a selection that matched nothing, is a 200.
        code = status.HTTP_201_CREATED if report.created else status.HTTP_200_OK
        return Response(ReplayResultSerializer(body).data, status=code)

    @detail_post(
        EXECUTION_ID,
        url_path="replay",
        url_name="replay-one",
        summary="Replay one execution",
        operation_id="executions_replay_one",
        description=(
            "Runs one finished execution again: a new execution due now, `origin` replay, `replay_of` it, with "
            "`input` instead of its own when given (a value still reading `********`, as the execution shows a "
            "secret, keeps the stored one). `version`: `current` (default) runs the task as it is now; "
            "`original` runs the config of the task's version the execution was created from (its "
            "`task_version`), each secret at its current value (400 on `version` when that version had a "
            "secret the task no longer holds; 409 when it ran another runner: restore the version instead). "
            "An operator's act; `original` when it differs from the current version changes what runs, and "
            "needs the editor role (403 naming it). 404 for an execution that is not yours."
        ),
        request=SingleReplaySerializer,
        responses={201: ReplayResultSerializer, **error_responses(404, 409)},
    )
    def replay_one(self, request: Request, pk: str | None = None) -> Response:
        serializer = SingleReplaySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        user = request_user(request)
        report = execution_replay_one(
            user=user,
            execution_id=int(pk or 0),
            actor=actor_for(user),
            run_input=data["input"],
            version=data["version"],
        )
        body = {
            "dry_run": False,
            "count": report.count,
            "replayed": report.replayed,
            "created": report.created,
            "dropped_secrets": report.dropped_secrets,
        }
        return Response(ReplayResultSerializer(body).data, status=status.HTTP_201_CREATED)

    @detail_post(
        EXECUTION_ID,
        summary="Retry a failed or cancelled execution",
        description=(
            "Runs a FAILED or CANCELLED execution again as a new execution of the same task, due now, with "
            "`retry_of` pointing at the old one and the next attempt number (one attempt; the old execution "
            "stays as it was). 409 when it is not FAILED or CANCELLED, was already retried (retry the retry), "
            "or its task was deleted."
        ),
        request=None,
        responses={201: ExecutionDetailSerializer, **error_responses(409)},
    )
    def retry(self, request: Request, pk: str | None = None) -> Response:
        execution = execution_retry_by_user(execution=self.get_object(), actor=actor_for(request_user(request)))
        execution = Execution.objects.prefetch_related("events").get(pk=execution.pk)
        headers = {"Location": f"/api/v1/executions/{execution.pk}"}
        return Response(ExecutionDetailSerializer(execution).data, status=status.HTTP_201_CREATED, headers=headers)

    @detail_post(
        EXECUTION_ID,
        summary="Approve a run waiting for approval",
        description=(
            "Ends a run of an `approval` step that waits for a decision as SUCCEEDED, its output "
            "`{approved: true, by, at, comment, input}` (what the next step gets). Needs the operator role in the "
            "task's team, and to be among the step's `approvers` (403). Recorded with who and when, and audited. "
            "409 when the run does not wait for a decision: not an approval step, not yet started, ended, or "
            "decided already (of two decisions at once exactly one wins)."
        ),
        request=DecisionSerializer,
        responses={200: ApprovalSerializer, **error_responses(404, 409)},
    )
    def approve(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, approve=True)

    @detail_post(
        EXECUTION_ID,
        summary="Reject a run waiting for approval",
        description=(
            "Ends a run of an `approval` step that waits for a decision as FAILED (not retried), its error naming "
            "who rejected it and why; its output `{approved: false, by, at, comment, input}` is what an "
            "`on: failure` step gets. The same rules as `approve`."
        ),
        request=DecisionSerializer,
        responses={200: ApprovalSerializer, **error_responses(404, 409)},
    )
    def reject(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, approve=False)

    def _decide(self, request: Request, *, approve: bool) -> Response:
        execution = self.get_object()
        serializer = DecisionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        approval = approval_decide(
            user=request_user(request),
            execution_id=execution.pk,
            approve=approve,
            comment=serializer.validated_data["comment"],
        )
        return Response(ApprovalSerializer(approval).data, status=status.HTTP_200_OK)


@extend_schema(
    summary="List a task's executions",
    description=(
        "What ran before what will run: executions scheduled for now or earlier first, newest first, then upcoming "
        "ones, soonest first (`?ordering=` replaces this order); the same filters and cursor pages as "
        "`/api/v1/executions`."
    ),
    parameters=[ORDERING_PARAMETER],
    tags=["tasks"],
)
class TaskExecutionListView(ExecutionKeysetMixin, TeamScopedMixin, generics.ListAPIView):
    """``/api/v1/tasks/{task_id}/executions``: one of your teams' tasks' executions."""

    queryset = Execution.objects.all()
    serializer_class = ExecutionSerializer
    filterset_class = ExecutionFilter
    filter_backends = FILTER_BACKENDS
    ordering_fields = EXECUTION_ORDERING_FIELDS

    def get_queryset(self) -> QuerySet:
        tasks = self.owner_scope(Task.objects.exclude(status=TaskStatus.DELETED))
        task = get_object_or_404(tasks, pk=self.kwargs["task_id"])
        return super().get_queryset().filter(task=task)


class WorkerFilter(StrictFilterSet):
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
    permission_classes = [IsSupportStaff]  # staff, not through a team-scoped token
    lookup_value_regex = r"[^/]+"
    filterset_class = WorkerFilter
    filter_backends = FILTER_BACKENDS
    ordering_fields = ["last_heartbeat", "started_at", "id"]
    ordering = ["-last_heartbeat"]

    def get_serializer_context(self) -> dict:
        return {**super().get_serializer_context(), "now": db_now()}


@extend_schema(
    summary="List a task's archive",
    description=(
        "Where the task's pruned executions went (retention: `keep_last`, `keep_for`): one entry per archive file "
        "holding some of them, newest first, with the span of their scheduled times, counts and checksums. "
        "`GET .../archive/{archive_id}` gives the executions themselves."
    ),
    tags=["tasks"],
)
class TaskArchiveListView(TeamScopedMixin, generics.ListAPIView):
    """``/api/v1/tasks/{task_id}/archive``: the archive index entries of one of your tasks."""

    serializer_class = ArchiveIndexSerializer
    queryset = ArchiveIndex.objects.all()
    filter_backends: list = []

    def get_queryset(self) -> QuerySet:
        task = get_object_or_404(
            self.owner_scope(Task.objects.exclude(status=TaskStatus.DELETED)), pk=self.kwargs["task_id"]
        )
        return ArchiveIndex.objects.filter(task=task).order_by("-period_to", "-id")


ARCHIVE_ID = OpenApiParameter(
    "archive_id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH, description="The archive entry's id."
)


@extend_schema(
    summary="Get a task's archived executions",
    description=(
        "The executions of one archive entry as JSON Lines (`application/x-ndjson`): one execution per line, "
        "as it was when pruned, with its `events`, `skipped_occurrences` and `approvals`. Streamed from the "
        "archive storage."
    ),
    parameters=[ARCHIVE_ID],
    responses={
        (200, "application/x-ndjson"): OpenApiResponse(description="One JSON object per line."),
        **error_responses(404),
    },
    tags=["tasks"],
)
class TaskArchiveFileView(TeamScopedMixin, generics.GenericAPIView):
    """``/api/v1/tasks/{task_id}/archive/{archive_id}``: the archived executions, streamed."""

    queryset = ArchiveIndex.objects.all()
    filter_backends: list = []
    pagination_class = None

    def get_queryset(self) -> QuerySet:
        tasks = self.owner_scope(Task.objects.exclude(status=TaskStatus.DELETED))
        task = get_object_or_404(tasks, pk=self.kwargs["task_id"])
        return ArchiveIndex.objects.filter(task=task)

    def get(self, request: Request, task_id: str, archive_id: str) -> StreamingHttpResponse:
        entry = get_object_or_404(self.get_queryset(), pk=archive_id)
        response = StreamingHttpResponse(archive_read(entry), content_type="application/x-ndjson")
        response["Content-Disposition"] = f'inline; filename="task-{entry.task_id}-archive-{entry.pk}.jsonl"'
        return response
