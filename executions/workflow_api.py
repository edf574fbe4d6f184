"""Workflows and workflow runs as objects (issue 48): ``/api/v1/workflows`` and
``/api/v1/workflow-runs``, with a workflow run's pause, resume, cancel and retry.

Reads are :mod:`executions.workflow_selectors` (lists in a constant number of queries) and
:mod:`executions.workflow_runs` (a run's steps and links, as its page draws them); writes are
:mod:`executions.workflow_control`'s. Both lists see the caller's teams' rows only (another
team's id is a 404), as every list does.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters import rest_framework as filters
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from executions.models import Execution
from executions.serializers import CancelReportSerializer, NewInputField, masked_input
from executions.workflow_control import (
    workflow_run_cancel,
    workflow_run_pause,
    workflow_run_resume,
    workflow_run_retry,
)
from executions.workflow_runs import workflow_run_read
from executions.workflow_selectors import (
    RUN_STATE_CHOICES,
    RunState,
    Workflow,
    workflow_roots,
    workflow_run_hold,
    workflow_run_state,
    workflow_runs_annotated,
    workflows_read,
)
from tasks_app.models import Task, TaskStatus
from teams_api.scope import TeamFilterSet, TeamScopedMixin
from tms_core.api.base import StrictInputMixin
from tms_core.api.keyset import KeysetPagination, Segment
from tms_core.api.schema import detail_post, error_responses
from tms_core.auth import actor_for, request_user

UUID_REGEX = r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"


# -- Serializers -------------------------------------------------------------------------------


class WorkflowNodeSerializer(serializers.Serializer):
    task = serializers.UUIDField(help_text="The task's id.")
    name = serializers.CharField(allow_blank=True)
    status = serializers.CharField(help_text="The task's status (a paused or deleted step does not run).")
    depth = serializers.IntegerField(help_text="The longest chain of links from the root (the root: 0).")


class WorkflowEdgeSerializer(serializers.Serializer):
    upstream = serializers.UUIDField(help_text="The task followed.")
    task = serializers.UUIDField(help_text="The task that follows it.")
    on = serializers.CharField(help_text="How the upstream's run must end: success, failure or completion.")


class WorkflowSerializer(serializers.Serializer):
    """A root task, the tasks reached from it by `after`, and the links among them."""

    root_task = serializers.UUIDField(help_text="The root task's id (the workflow's id).")
    name = serializers.CharField(allow_blank=True, help_text="The root task's name.")
    team = serializers.IntegerField()
    nodes = WorkflowNodeSerializer(many=True)
    edges = WorkflowEdgeSerializer(many=True)


def workflow_data(flow: Workflow) -> dict[str, Any]:
    return {
        "root_task": flow.root.pk,
        "name": flow.root.name,
        "team": flow.root.team_id,
        "nodes": [
            {"task": task.pk, "name": task.name, "status": task.status, "depth": depth} for task, depth in flow.nodes
        ],
        "edges": [{"upstream": upstream, "task": task, "on": on} for upstream, task, on in flow.edges],
    }


class WorkflowRunSerializer(serializers.Serializer):
    """A workflow run, as a list shows it."""

    id = serializers.IntegerField(source="pk", help_text="The workflow run's id: its root execution's.")
    workflow = serializers.UUIDField(source="task_id", help_text="Its root task (the workflow's id).")
    workflow_name = serializers.CharField(source="task.name", allow_blank=True)
    team = serializers.IntegerField(source="team_id")
    state = serializers.ChoiceField(choices=RUN_STATE_CHOICES)
    hold_reason = serializers.CharField(allow_blank=True, help_text="Who paused or cancelled it (empty: nobody).")
    steps = serializers.IntegerField(source="step_count", help_text="Runs of tasks in it, the root's included.")
    scheduled_for = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True, help_text="When its root started.")
    finished_at = serializers.DateTimeField(
        source="ended_at", allow_null=True, help_text="The latest end among its runs (while it runs too)."
    )


class WorkflowRunMapSerializer(serializers.Serializer):
    total = serializers.IntegerField(help_text="The items of its list.")
    items = serializers.DictField(
        child=serializers.IntegerField(), help_text="Its items' latest runs by status (items not started: not counted)."
    )


class WorkflowRunStepSerializer(serializers.Serializer):
    task = serializers.UUIDField()
    name = serializers.CharField(allow_blank=True)
    depth = serializers.IntegerField()
    state = serializers.CharField(
        help_text="The step's run's status, or WAITING (it may still run) or SKIPPED (it will not, in this run)."
    )
    note = serializers.CharField(allow_blank=True, help_text="Why it waits or was skipped, in words.")
    execution = serializers.IntegerField(allow_null=True, help_text="Its run (the latest: a retry replaces it).")
    runs = serializers.IntegerField(help_text="Its runs in this workflow run (more than one: retried).")
    attempt = serializers.IntegerField(allow_null=True)
    scheduled_for = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    input = serializers.JSONField(allow_null=True, help_text="The run's input.")
    map = WorkflowRunMapSerializer(
        allow_null=True, help_text="A map step's items (null: no map step): how many, and their runs by status."
    )


class WorkflowRunLinkSerializer(WorkflowEdgeSerializer):
    taken = serializers.BooleanField(allow_null=True, help_text="Its upstream ended as asked (null: not ended).")
    words = serializers.CharField(help_text="How it stands in this run, in words.")


class WorkflowRunDetailSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    workflow = serializers.UUIDField()
    workflow_name = serializers.CharField(allow_blank=True)
    team = serializers.IntegerField()
    state = serializers.ChoiceField(choices=RUN_STATE_CHOICES)
    state_words = serializers.CharField(help_text='Its state in words ("succeeded; extract failed, handled by alert").')
    hold_reason = serializers.CharField(allow_blank=True)
    input = serializers.JSONField(allow_null=True, help_text="The root run's input (the workflow run's).")
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True, help_text="Its last end, once nothing more runs.")
    steps = WorkflowRunStepSerializer(many=True)
    links = WorkflowRunLinkSerializer(many=True)


class WorkflowRunResumeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.ChoiceField(choices=RUN_STATE_CHOICES)
    started = serializers.ListField(
        child=serializers.IntegerField(), help_text="The steps started by the resume (held back while paused)."
    )


class WorkflowRunCancelResultSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.ChoiceField(choices=RUN_STATE_CHOICES)
    executions = CancelReportSerializer(many=True, help_text="Each step cancelled.")


class WorkflowRunRetryRequestSerializer(StrictInputMixin, serializers.Serializer):
    input = NewInputField(
        what="the retried steps' input",
        help_text="The retried steps' input, instead of the one each had (checked against each step's task).",
    )


class WorkflowRunRetryResultSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    retried = serializers.ListField(child=serializers.IntegerField(), help_text="The failed steps run again.")
    created = serializers.ListField(child=serializers.IntegerField(), help_text="Their new runs, in order.")


# -- Views ---------------------------------------------------------------------------------------

ROOT_TASK = OpenApiParameter("root_task_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The root task.")
RUN_ID = OpenApiParameter(
    "id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH, description="The workflow run's id."
)


@extend_schema_view(
    list=extend_schema(
        summary="List your workflows",
        description=(
            "Each root task (one that others follow and that follows none) with the tasks reached from it by "
            "`after`, as a graph: `nodes` (each task and its depth) and `edges` (upstream → task, with `on`). "
            "Paged by cursor, in the order of the root tasks' ids."
        ),
    ),
    retrieve=extend_schema(
        summary="Get a workflow",
        description="The graph below a task (any of yours: a step too, as the root of what follows it).",
        parameters=[ROOT_TASK],
    ),
)
class WorkflowViewSet(TeamScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Your teams' workflows: graphs of tasks linked by `after`."""

    queryset = Task.objects.exclude(status=TaskStatus.DELETED)
    serializer_class = WorkflowSerializer
    pagination_class = KeysetPagination
    filter_backends: list = []
    lookup_field = "pk"
    lookup_url_kwarg = "root_task_id"
    lookup_value_regex = UUID_REGEX

    def get_queryset(self) -> QuerySet:
        queryset = super().get_queryset()
        return workflow_roots(queryset) if self.action == "list" else queryset

    def keyset_segments(self, queryset: QuerySet, state: dict) -> list[Segment]:
        return [Segment([queryset.order_by()], None, False)]

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        flows = workflows_read(list(page or []))
        return self.get_paginated_response([WorkflowSerializer(workflow_data(flow)).data for flow in flows])

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        (flow,) = workflows_read([self.get_object()])
        return Response(WorkflowSerializer(workflow_data(flow)).data)


class WorkflowRunFilter(TeamFilterSet):
    workflow = filters.UUIDFilter(field_name="task_id", help_text="Only the runs of this workflow (its root task).")
    state = filters.ChoiceFilter(field_name="state", choices=RUN_STATE_CHOICES, help_text="Only runs in this state.")

    class Meta:
        model = Execution
        fields = ["workflow", "state", "team"]


def _run_detail(root: Execution) -> dict[str, Any]:
    run = workflow_run_read(root)
    hold = workflow_run_hold(root.pk)
    hold_value = hold.hold if hold is not None else "active"
    state = workflow_run_state(run.state, hold_value)
    steps = []
    for step in run.ordered():
        execution = step.execution
        steps.append(
            {
                "task": step.task.pk,
                "name": step.task.name,
                "depth": step.depth,
                "state": step.state,
                "note": step.note,
                "execution": execution.pk if execution else None,
                "runs": step.runs,
                "attempt": execution.attempt if execution else None,
                "scheduled_for": execution.scheduled_for if execution else None,
                "started_at": execution.started_at if execution else None,
                "finished_at": execution.finished_at if execution else None,
                "input": masked_input(execution.input) if execution else None,
                "map": {"total": step.map_total, "items": step.items} if step.map_total is not None else None,
            }
        )
    ends = [step.execution.finished_at for step in run.steps.values() if step.execution and step.execution.finished_at]
    return {
        "id": root.pk,
        "workflow": root.task_id,
        "workflow_name": root.task.name,
        "team": root.team_id,
        "state": state,
        "state_words": run.state_words if state == run.state else f"{state} ({run.state_words})",
        "hold_reason": hold.reason if hold is not None and hold_value != "active" else "",
        "input": masked_input(root.input),
        "started_at": root.started_at,
        "finished_at": max(ends) if ends and run.state != RunState.RUNNING else None,
        "steps": steps,
        "links": [
            {
                "upstream": link.upstream,
                "task": link.task,
                "on": link.on,
                "taken": link.taken,
                "words": run.link_words(link),
            }
            for link in run.links
        ],
    }


@extend_schema_view(
    list=extend_schema(
        summary="List your workflow runs",
        description=(
            "Runs of workflows, newest first: each run of a task that others follow, started otherwise than as a "
            "step (a schedule, a trigger, a replay), with its state (running, paused, succeeded, failed, "
            "cancelled). Filter by `workflow` (the root task), `state` and `team`. Paged by cursor."
        ),
    ),
    retrieve=extend_schema(
        summary="Get a workflow run",
        description="Its state, each step (a task of the workflow) with its run and timings, the links, the input.",
        parameters=[RUN_ID],
    ),
)
class WorkflowRunViewSet(TeamScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Your teams' workflow runs; pause, resume, cancel and retry them (an operator's acts)."""

    operator_actions = frozenset({"pause", "resume", "cancel", "retry"})
    queryset = Execution.objects.all()
    serializer_class = WorkflowRunSerializer
    pagination_class = KeysetPagination
    filterset_class = WorkflowRunFilter
    filter_backends = [DjangoFilterBackend]
    lookup_value_regex = r"[0-9]{1,18}"

    def get_queryset(self) -> QuerySet:
        return workflow_runs_annotated(super().get_queryset()).select_related("task")

    def keyset_segments(self, queryset: QuerySet, state: dict) -> list[Segment]:
        return [Segment([queryset.order_by()], None, True)]

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(WorkflowRunDetailSerializer(_run_detail(self.get_object())).data)

    def _answer(self, serializer: type[serializers.Serializer], data: dict[str, Any]) -> Response:
        return Response(serializer(data).data, status=status.HTTP_200_OK)

    def _state_now(self, pk: int) -> str:
        return str(self.get_queryset().filter(pk=pk).values_list("state", flat=True).first())

    @detail_post(
        RUN_ID,
        summary="Pause a workflow run",
        description=(
            "No further step starts: the running ones finish, and the steps their ends would start wait for "
            "`resume`. 409 unless the run is running."
        ),
        request=None,
        responses={200: WorkflowRunResumeSerializer, **error_responses(409)},
    )
    def pause(self, request: Request, pk: str | None = None) -> Response:
        root = self.get_object()
        workflow_run_pause(user=request_user(request), root=root, actor=actor_for(request_user(request)))
        return self._answer(
            WorkflowRunResumeSerializer, {"id": root.pk, "state": self._state_now(root.pk), "started": []}
        )

    @detail_post(
        RUN_ID,
        summary="Resume a paused workflow run",
        description=(
            "The steps whose upstreams ended while it was paused start now, each once; then it goes on as before. "
            "409 unless it is paused."
        ),
        request=None,
        responses={200: WorkflowRunResumeSerializer, **error_responses(409)},
    )
    def resume(self, request: Request, pk: str | None = None) -> Response:
        root = self.get_object()
        started = workflow_run_resume(user=request_user(request), root=root, actor=actor_for(request_user(request)))
        return self._answer(
            WorkflowRunResumeSerializer, {"id": root.pk, "state": self._state_now(root.pk), "started": started}
        )

    @detail_post(
        RUN_ID,
        summary="Cancel a workflow run",
        description=(
            "No step starts any more, and its scheduled and running steps are cancelled as `cancel` would each "
            "(a running one's external run is stopped where its runner can). 409 when it has ended or was "
            "cancelled already."
        ),
        request=None,
        responses={200: WorkflowRunCancelResultSerializer, **error_responses(409)},
    )
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        root = self.get_object()
        reports = workflow_run_cancel(user=request_user(request), root=root, actor=actor_for(request_user(request)))
        data = {"id": root.pk, "state": self._state_now(root.pk), "executions": reports}
        return self._answer(WorkflowRunCancelResultSerializer, data)

    @detail_post(
        RUN_ID,
        summary="Retry a failed workflow run from its failed steps",
        description=(
            "Each step that failed for good runs again in the same workflow run (`retry_of` it), with `input` "
            "instead of its own when given (400 on `input` when a step's task refuses it); what follows a retry's "
            "end runs as after a first end, and the steps that succeeded are not run again. An operator's act "
            "(`input` is not config). 409 unless the run failed; 429 past the team's hourly quota."
        ),
        request=WorkflowRunRetryRequestSerializer,
        responses={201: WorkflowRunRetryResultSerializer, **error_responses(409)},
    )
    def retry(self, request: Request, pk: str | None = None) -> Response:
        root = self.get_object()
        serializer = WorkflowRunRetryRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        report = workflow_run_retry(
            user=request_user(request),
            root=root,
            actor=actor_for(request_user(request)),
            run_input=serializer.validated_data["input"],
        )
        data = {"id": root.pk, "retried": report.retried, "created": report.created}
        return Response(WorkflowRunRetryResultSerializer(data).data, status=status.HTTP_201_CREATED)
