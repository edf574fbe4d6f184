"""The original service's API, kept for its clients: ``POST /tasks``, ``GET /tasks``, ``GET /tasks/<id>``.

A task there is a ``command`` (a sleep duration, the original's simulated work), an optional
``start_at`` and an optional ``recurring`` interval; it answers one of four statuses. Here such a
task is a ``sleep`` runner task, and its status is derived from its executions. Same
authentication, owner scoping and error shape as the rest of the API.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict, cast

from django.db.models import Exists, OuterRef, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from executions.models import Execution, ExecutionStatus
from tasks_api.creation import task_create
from tasks_api.idempotent_requests import IDEMPOTENCY_PARAMETER, REPLAYED_HEADER_PARAMETER, idempotent_create_response
from tasks_app.models import Task, TaskStatus
from teams_api.scope import TeamScopedMixin
from tms_core.api.base import BlankIsNone, BoundedDateTimeField, StrictInputMixin
from tms_core.api.conf import api_settings
from tms_core.api.schema import error_responses
from tms_core.auth import request_user
from tms_core.conf import tms_settings
from tms_core.durations import DurationField, format_duration, parse_duration

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

RUNNER = "sleep"
#: A sleep may take its whole duration; the task's timeout leaves this much on top.
TIMEOUT_MARGIN = timedelta(seconds=60)


class CompatStatus:
    SCHEDULED = "SCHEDULED"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    choices = [SCHEDULED, PENDING, RUNNING, FINISHED]


class _OptionalDuration(BlankIsNone, DurationField):
    pass


class _OptionalDateTime(BlankIsNone, BoundedDateTimeField):
    pass


class CompatScheduleTaskSerializer(StrictInputMixin, serializers.Serializer):
    """``ScheduleTaskRequest`` of the original service."""

    command = DurationField(help_text='Sleep duration, the simulated work: "3s", "10ms", ...')
    start_at = _OptionalDateTime(
        required=False, allow_null=True, default=None, help_text="When to start (RFC 3339); default: now."
    )
    recurring = _OptionalDuration(
        required=False,
        allow_null=True,
        default=None,
        min_value=timedelta(milliseconds=100),
        help_text='Repeat after this interval ("3s", "10ms", ...); default: run once.',
    )


class CompatTaskSerializer(serializers.Serializer):
    """``TaskResponse`` of the original service."""

    id = serializers.UUIDField()
    status = serializers.ChoiceField(
        choices=CompatStatus.choices,
        help_text=(
            "SCHEDULED: waiting for its time (or its next run); PENDING: waiting for a worker; RUNNING: running; "
            "FINISHED: done, nothing more will run."
        ),
    )
    start_at = serializers.DateTimeField()
    recurring = serializers.CharField(allow_blank=True, help_text='The interval ("3s"), or "" for a one-shot task.')
    command = serializers.CharField(help_text='The sleep duration ("5s"); for tasks on other runners, the runner.')

    def to_representation(self, task: Task) -> dict[str, Any]:
        return {
            "id": str(task.pk),
            "status": compat_status(task),
            "start_at": serializers.DateTimeField().to_representation(task.start_at),
            "recurring": format_duration(task.interval) if task.interval else task.cron,
            "command": _command(task),
        }


def _command(task: Task) -> str:
    if task.runner == RUNNER and isinstance(task.config, dict) and "duration" in task.config:
        try:
            return format_duration(parse_duration(task.config["duration"]))
        except ValueError:
            return str(task.config["duration"])
    return task.runner


class ExecutionStates(TypedDict):
    """The columns :func:`with_execution_states` adds to each task."""

    has_running: bool
    has_pending: bool
    has_scheduled: bool


def with_execution_states(queryset: QuerySet[Task]) -> QuerySet[WithAnnotations[Task, ExecutionStates]]:
    """Annotate tasks with whether they have RUNNING, PENDING and SCHEDULED executions."""
    mine = Execution.objects.filter(task=OuterRef("pk"))
    return queryset.annotate(
        has_running=Exists(mine.filter(status=ExecutionStatus.RUNNING)),
        has_pending=Exists(mine.filter(status=ExecutionStatus.PENDING)),
        has_scheduled=Exists(mine.filter(status=ExecutionStatus.SCHEDULED)),
    )


def compat_status(task: Task) -> str:
    """The original's one status per task, from the task's executions (see ``with_execution_states``).

    The furthest-along active execution wins (RUNNING, then PENDING, then SCHEDULED). With none
    active, a task whose schedule is used up is FINISHED (a one-shot task after its run, a
    recurring one after its end); any other (a recurring task between runs, a paused one) is
    SCHEDULED.
    """
    states: WithAnnotations[Task, ExecutionStates]
    if getattr(task, "has_running", None) is None:
        states = with_execution_states(Task.objects.filter(pk=task.pk)).get()
    else:
        states = cast("WithAnnotations[Task, ExecutionStates]", task)  # it came from with_execution_states
    if states.has_running:
        return CompatStatus.RUNNING
    if states.has_pending:
        return CompatStatus.PENDING
    if states.has_scheduled:
        return CompatStatus.SCHEDULED
    return CompatStatus.FINISHED if task.status == TaskStatus.COMPLETED else CompatStatus.SCHEDULED


class _CompatView(TeamScopedMixin, generics.GenericAPIView):
    queryset = Task.objects.exclude(status=TaskStatus.DELETED)
    serializer_class = CompatTaskSerializer
    pagination_class = None
    filter_backends: list = []

    def get_queryset(self) -> QuerySet:
        return with_execution_states(super().get_queryset()).order_by("-created_at")


class CompatTaskListView(_CompatView):
    """``/tasks``: schedule a task, or list yours."""

    @extend_schema(
        tags=["compat"],
        operation_id="compat_tasks_list",
        summary="List tasks (original API)",
        description="Your tasks, newest first (at most 1000; page through more with `/api/v1/tasks`).",
        responses={200: CompatTaskSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        tasks = self.get_queryset()[: api_settings().COMPAT_LIST_MAX]
        return Response(CompatTaskSerializer(tasks, many=True).data)

    @extend_schema(
        tags=["compat"],
        operation_id="compat_tasks_create",
        summary="Schedule a task (original API)",
        description=(
            "Schedules a sleep of `command` at `start_at` (default: now), once or every `recurring`. Answers 200 "
            "with the task, as the original service did."
        ),
        request=CompatScheduleTaskSerializer,
        parameters=[IDEMPOTENCY_PARAMETER, REPLAYED_HEADER_PARAMETER],
        responses={200: CompatTaskSerializer, **error_responses(422)},
    )
    def post(self, request: Request) -> Response:
        serializer = CompatScheduleTaskSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        command: timedelta = data["command"]
        default_timeout = timedelta(seconds=tms_settings().DEFAULT_TIMEOUT)

        def create() -> tuple[int, Any]:
            task = task_create(
                owner=request_user(request),
                runner=RUNNER,
                config={"duration": format_duration(command)},
                name=f"sleep {format_duration(command)}",
                start_at=data["start_at"],
                interval=data["recurring"],
                timeout=max(default_timeout, command + TIMEOUT_MARGIN),
            )
            return status.HTTP_200_OK, CompatTaskSerializer(task).data

        return idempotent_create_response(request, create)


class CompatTaskDetailView(_CompatView):
    """``/tasks/<id>``: one of your tasks."""

    lookup_url_kwarg = "pk"

    @extend_schema(
        tags=["compat"],
        operation_id="compat_tasks_retrieve",
        summary="Get a task (original API)",
        responses={200: CompatTaskSerializer},
    )
    def get(self, request: Request, pk: str) -> Response:
        return Response(CompatTaskSerializer(self.get_object()).data)
