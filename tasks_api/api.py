"""The task API: ``/api/v1/tasks``. Each view validates with a serializer, calls one service and
renders with another serializer."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django_filters import rest_framework as filters
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.filters import OrderingFilter, SearchFilter
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from executions.models import Execution
from executions.serializers import ExecutionDetailSerializer
from executions.services import executions_materialise
from tasks_api.backfill import task_backfill
from tasks_api.checks import calendar_resolve
from tasks_api.creation import task_create
from tasks_api.editing import task_update
from tasks_api.idempotent_requests import IDEMPOTENCY_PARAMETER, REPLAYED_HEADER_PARAMETER, idempotent_create_response
from tasks_api.lifecycle import task_delete, task_pause, task_resume
from tasks_api.moving import task_move
from tasks_api.selector_serializers import (
    OccurrencesQuerySerializer,
    OccurrenceWindowSerializer,
    PreviewQuerySerializer,
    PreviewSerializer,
    SchedulePreviewSerializer,
    WhyQuerySerializer,
    WhySerializer,
)
from tasks_api.selectors import schedule_preview, task_occurrences, task_preview, task_why
from tasks_api.selectors.previews import calendar_marks
from tasks_api.serializers import (
    BackfillResultSerializer,
    BackfillSerializer,
    MaterialiseResultSerializer,
    MaterialiseSerializer,
    TaskCreatedSerializer,
    TaskCreateSerializer,
    TaskDeleteSerializer,
    TaskSerializer,
    TaskUpdateSerializer,
    TriggerSerializer,
)
from tasks_api.states import with_state
from tasks_api.triggers import task_check_input, task_trigger
from tasks_app.calendars import CalendarRules
from tasks_app.models import Task, TaskStatus
from tasks_app.schedule_words import schedule_description, schedule_words
from tasks_app.schedules import Schedule, ScheduleError
from tasks_app.teams.services import default_team_of
from teams_api.scope import TeamFilterSet, TeamScopedMixin
from tms_core.api.base import ApiViewMixin
from tms_core.api.keyset import KeysetPagination, Segment
from tms_core.api.schema import error_responses
from tms_core.api.stops import stop_response, stop_responses
from tms_core.auth import actor_for, request_user
from tms_core.clock import db_now

#: The orders the task list pages in (one at a time; ties by id the same way), and the column or
#: annotation each reads: ``next_run_at`` is when the task next runs (the ``next_run`` annotation
#: of :func:`tasks_api.states.with_state`), as the field reads, not the materialisation cursor.
TASK_ORDERINGS = {"created_at": "created_at", "name": "name", "next_run_at": "next_run", "priority": "priority"}


class TaskOrdering(OrderingFilter):
    """Only names ``?ordering=`` in the schema and checks it: the keyset pages order the rows."""

    def filter_queryset(self, request: Request, queryset: QuerySet, view: Any) -> QuerySet:
        return queryset


class TaskFilter(TeamFilterSet):
    status = filters.ChoiceFilter(
        choices=[(s.value, s.label) for s in TaskStatus if s != TaskStatus.DELETED], help_text="Only tasks in it."
    )
    runner = filters.CharFilter(help_text="Only tasks on this runner alias.")

    class Meta:
        model = Task
        fields = ["status", "runner", "team"]


@extend_schema_view(
    list=extend_schema(
        summary="List your tasks",
        description="Newest first; filter, search by name, order by one field, page by cursor "
        "(follow `next` and `previous`; no count, no offset).",
    ),
    retrieve=extend_schema(summary="Get a task"),
)
class TaskViewSet(
    TeamScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Register tasks, change, pause, resume, run and delete them, and look at their executions."""

    queryset = Task.objects.exclude(status=TaskStatus.DELETED)
    serializer_class = TaskSerializer
    filter_backends = [DjangoFilterBackend, TaskOrdering, SearchFilter]
    filterset_class = TaskFilter
    search_fields = ["name"]
    ordering_fields = list(TASK_ORDERINGS)
    ordering = ["-created_at"]
    pagination_class = KeysetPagination
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    #: What an operator may do (tasks_app.teams); every other write needs an editor.
    operator_actions = frozenset({"pause", "resume", "trigger", "materialise", "backfill"})

    def get_queryset(self) -> QuerySet:
        queryset = super().get_queryset()
        return with_state(queryset).select_related("calendar") if self.action in ("list", "retrieve") else queryset

    def keyset_segments(self, queryset: QuerySet, state: dict) -> list[Segment]:
        """Pages by cursor (:mod:`tms_core.api.keyset`), newest first unless ``?ordering=`` names
        one of :data:`TASK_ORDERINGS` (``-`` for descending). Tasks that will not run again come
        after the others when ordered by ``next_run_at``."""
        queryset = queryset.order_by()
        ordering = [value for value in self.request.query_params.getlist("ordering") if value] or ["-created_at"]
        if len(ordering) > 1 or ordering[0].lstrip("-") not in TASK_ORDERINGS:
            choices = ", ".join(f"{name}, -{name}" for name in TASK_ORDERINGS)
            raise ValidationError({"ordering": [f"One of: {choices} (ties are ordered by id the same way)."]})
        column = TASK_ORDERINGS[ordering[0].lstrip("-")]
        descending = ordering[0].startswith("-")
        if column != "next_run":
            return [Segment([queryset], column, descending)]
        return [
            Segment([queryset.filter(next_run__isnull=False)], column, descending),
            Segment([queryset.filter(next_run__isnull=True)], None, descending),
        ]

    @extend_schema(
        summary="Create a task",
        description=(
            "A task runs once at `start_at` (default: now) or repeatedly, every `interval` or on a `cron` "
            "expression. Its first executions are created at once when they are due soon."
        ),
        request=TaskCreateSerializer,
        parameters=[IDEMPOTENCY_PARAMETER, REPLAYED_HEADER_PARAMETER],
        responses={201: TaskCreatedSerializer, **error_responses(422)},
    )
    def create(self, request: Request) -> Response:
        serializer = TaskCreateSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)

        def create() -> tuple[int, Any]:
            task = task_create(owner=request_user(request), **serializer.validated_data)
            return status.HTTP_201_CREATED, TaskCreatedSerializer(task).data

        return idempotent_create_response(request, create)

    @extend_schema(
        summary="Change a task",
        description=(
            "Changes only the fields given. A change to the schedule (`start_at`, `interval`, `cron`, `timezone`, "
            "`end_at`, `max_runs`, `jitter`), the `runner`, its `config` or the `priority` replaces the task's "
            "future: its executions that have not started are cancelled (their events say why) and created "
            "again from the new settings. Running executions and history are kept."
        ),
        request=TaskUpdateSerializer,
        responses={200: TaskSerializer},
    )
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        task = self.get_object()
        # The request in the context limits artifacts to the caller's own: another owner's id is
        # "does not exist", as a missing one, never a hint that it exists.
        serializer = TaskUpdateSerializer(task, data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        changes = dict(serializer.validated_data)
        team = changes.pop("team", None)
        user = request_user(request)
        with transaction.atomic():  # a move and the other changes, or neither
            if team is not None:
                task = task_move(task=task, team=team, user=user, replacing=set(changes))
            if changes or team is None:
                task = task_update(task=task, actor=actor_for(user), changes=changes)
        return Response(TaskSerializer(task).data)

    @extend_schema(
        summary="Delete a task",
        description=(
            "Stops all further runs: the task is deleted (its history stays, it no longer appears) and its "
            "scheduled, pending and running executions are cancelled. A running one's external run is stopped "
            "through its runner where the runner supports it. 200 when nothing can still be running; 202 when "
            "an external run may go on (see each execution's `external_run`)."
        ),
        responses={
            **stop_responses(TaskDeleteSerializer, "Deleted"),
        },
    )
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        report = task_delete(task=self.get_object(), actor=actor_for(request_user(request)))
        return stop_response(report, TaskDeleteSerializer)

    @extend_schema(
        summary="Pause a task",
        description=(
            "No new executions are created, and its scheduled executions that are not yet published are "
            "cancelled. Pausing a paused task changes nothing."
        ),
        request=None,
        responses={200: TaskSerializer},
    )
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str | None = None) -> Response:
        task = task_pause(task=self.get_object(), actor=actor_for(request_user(request)))
        return Response(TaskSerializer(task).data)

    @extend_schema(
        summary="Resume a paused task",
        description=(
            "It runs on its schedule again; occurrences missed while paused follow its `misfire_policy`. "
            "Resuming a task that is not paused changes nothing."
        ),
        request=None,
        responses={200: TaskSerializer},
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        task = task_resume(task=self.get_object(), actor=actor_for(request_user(request)))
        return Response(TaskSerializer(task).data)

    @extend_schema(
        summary="Run a task now",
        description=(
            "Creates one execution due now, outside the schedule, whatever the task's status. It counts against "
            "the owner's hourly quota of executions created on request: 429 with `Retry-After` when used up. "
            "With an `Idempotency-Key`, a trigger sent again (a retry, a duplicate event) answers the first "
            "run and creates no other. A task with `trigger_debounce` runs the first trigger's run that long "
            "later; a trigger while it waits with the same input joins it: 200 with that run, nothing created or "
            "counted. The body may give the run an `input` (checked by the task's `input_schema`, filling its "
            "`input_fills`): 400 on `input` when it is not a JSON object, too large, or does not satisfy the schema."
        ),
        request=TriggerSerializer,
        parameters=[IDEMPOTENCY_PARAMETER, REPLAYED_HEADER_PARAMETER],
        responses={
            201: ExecutionDetailSerializer,
            200: OpenApiResponse(ExecutionDetailSerializer, description="Joined the task's debounced run."),
            **error_responses(422),
        },
    )
    @action(detail=True, methods=["post"])
    def trigger(self, request: Request, pk: str | None = None) -> Response:
        task = self.get_object()
        serializer = TriggerSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run_input = serializer.validated_data["input"]
        task_check_input(task=task, run_input=run_input)  # a 400 is never stored for the Idempotency-Key

        def create() -> tuple[int, Any]:
            trigger = task_trigger(task=task, actor=actor_for(request_user(request)), run_input=run_input)
            execution = Execution.objects.prefetch_related("events").get(pk=trigger.execution.pk)
            code = status.HTTP_200_OK if trigger.joined else status.HTTP_201_CREATED
            return code, ExecutionDetailSerializer(execution).data

        response = idempotent_create_response(request, create)
        response["Location"] = f"/api/v1/executions/{response.data['id']}"
        return response

    @extend_schema(
        summary="Create a task's executions up to a time",
        description=(
            "Materialises the task's occurrences due up to `until` now, instead of waiting for the scheduler "
            "(the original design's `create_task_executions(task_id, until)`), and returns the ids of the "
            "executions created. Idempotent: existing ones are not created again. The executions it creates "
            "count against your hourly quota of executions created on request (429 when they do not fit now, "
            "400 on `until` when they never can in one request; nothing is created then)."
        ),
        request=MaterialiseSerializer,
        responses={200: MaterialiseResultSerializer, **error_responses(409)},
    )
    @action(detail=True, methods=["post"])
    def materialise(self, request: Request, pk: str | None = None) -> Response:
        task = self.get_object()
        serializer = MaterialiseSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        until = serializer.validated_data["until"]
        ids = executions_materialise(task=task, until=until)
        return Response(MaterialiseResultSerializer({"task": task.pk, "until": until, "execution_ids": ids}).data)

    @extend_schema(
        summary="Preview a task's next fire times",
        description="The next `count` (at most 1000) fire times at or after `after` (default: now), in UTC and "
        "in the task's time zone, as the schedule calculator computes them (DST rules included).",
        parameters=[PreviewQuerySerializer],
        responses={200: PreviewSerializer, **error_responses(400)},
    )
    @action(detail=True, methods=["get"])
    def preview(self, request: Request, pk: str | None = None) -> Response:
        task = self.get_object()
        query = PreviewQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        times = task_preview(task=task, **query.validated_data)
        preview = {"timezone": task.timezone, "description": schedule_words(task), "fire_times": times}
        return Response(PreviewSerializer(preview).data)

    @extend_schema(
        summary="Why did this task (not) run at a time?",
        description=(
            "Finds the fire time at or before `at` nearest to it and says what became of it: `ran`, `running`, "
            "`failed`, `cancelled`, `skipped` (with the recorded reason: missed, coalesced, paused, overlap), "
            "`upcoming`, `paused`, or that `at` is `not_a_fire_time`, `before_start` or `after_end`. An `at` "
            "given to the whole second (no fraction) means that second: a fire time within it is the one "
            "answered (fire times keep their start's microseconds)."
        ),
        parameters=[WhyQuerySerializer],
        responses={200: WhySerializer, **error_responses(400)},
    )
    @action(detail=True, methods=["get"])
    def why(self, request: Request, pk: str | None = None) -> Response:
        task = self.get_object()
        query = WhyQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        return Response(WhySerializer(task_why(task=task, at=query.validated_data["at"])).data)

    @extend_schema(
        summary="A task's occurrence timeline over a window",
        description=(
            "Every fire time of the task's schedule in [`from`, `to`) (up to its last run: `end_at`, `max_runs`) "
            "and what became of it, in time order, with the executions and skipped occurrences in the window that "
            "no fire time accounts for (triggered runs, retries, superseded executions, records of an earlier "
            "schedule); every execution and skipped occurrence in the window appears in exactly one item. "
            "`state` is `executed` (its execution started or ended: SUCCEEDED, FAILED, RUNNING, CANCELLED), "
            "`scheduled` (its execution waits: SCHEDULED or PENDING), `skipped` (with the recorded reason "
            "`missed`, `coalesced`, `paused` or `overlap` and its detail, also where a summary row stands for it; "
            "`recorded: false` for a fire time passed while the task is still paused), `upcoming` (not "
            "materialised yet: in the future, or past but not yet reached by the scheduler), `superseded` "
            "(replaced before it started by a schedule change or a pause) or `missing` (past, with no execution "
            "and no recorded reason: should not happen, shown rather than hidden). `reason` says it in words, "
            "as `why` does. Default window: 2 days, around now, or from `from`, or up to `to`, halved until it "
            "holds at most 1000 fire times (`from` and `to` in the answer say what it was). A window given in "
            "full may span at most 366 days and hold at most 1000 fire times and 2000 executions and 2000 "
            "skipped occurrences, else 400 on `to` (naming a `to` that fits): the answer is never paged, ask "
            "for the next window instead."
        ),
        parameters=[OccurrencesQuerySerializer],
        responses={200: OccurrenceWindowSerializer, **error_responses(400)},
    )
    @action(detail=True, methods=["get"])
    def occurrences(self, request: Request, pk: str | None = None) -> Response:
        task = self.get_object()
        query = OccurrencesQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        window = task_occurrences(task=task, start=query.validated_data.get("from"), end=query.validated_data.get("to"))
        return Response(OccurrenceWindowSerializer(window).data)

    @extend_schema(
        summary="Backfill a past time range",
        description=(
            "Creates one execution, due now, for each fire time in [`start`, `end`] that has none yet (at most "
            "`TMS_BACKFILL_MAX` fire times, 500 by default, else 400). They count against the owner's hourly "
            "quota of executions created on request: 429 with `Retry-After` when it is used up. They run under "
            "the task's overlap policy. `existing` counts the fire "
            "times that already had an execution."
        ),
        request=BackfillSerializer,
        responses={201: BackfillResultSerializer},
    )
    @action(detail=True, methods=["post"])
    def backfill(self, request: Request, pk: str | None = None) -> Response:
        task = self.get_object()
        serializer = BackfillSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        report = task_backfill(task=task, actor=actor_for(request_user(request)), **serializer.validated_data)
        return Response(BackfillResultSerializer(report).data, status=status.HTTP_201_CREATED)


class SchedulePreviewView(ApiViewMixin, APIView):
    """``POST /api/v1/schedules/preview``: a schedule's fire times before a task is created."""

    @extend_schema(
        summary="Preview a schedule",
        description=(
            "The first `count` (at most 1000) fire times of a schedule given as a task's schedule fields "
            "(`start_at` default now, `interval` or `cron`, `timezone`, `end_at`, `max_runs`), in UTC and local time, "
            "and the schedule in words (`description`: a six-field cron is read seconds first)."
        ),
        request=SchedulePreviewSerializer,
        responses={200: PreviewSerializer, **error_responses(400)},
    )
    def post(self, request: Request) -> Response:
        serializer = SchedulePreviewSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            schedule = Schedule(
                start_at=data["start_at"] or db_now(),
                interval=data["interval"],
                cron=data["cron"],
                timezone=data["timezone"],
                end_at=data["end_at"],
                dst_gap=data["dst_gap"],
                dst_fold=data["dst_fold"],
            )
            times = schedule_preview(schedule, count=data["count"], max_runs=data["max_runs"])
        except ScheduleError as exc:
            raise ValidationError({"schedule": [str(exc)]}) from None
        team = data.get("team") or default_team_of(request_user(request))
        calendar = calendar_resolve(team_id=team.pk, calendar=data["calendar"])
        if calendar is not None:
            times = calendar_marks(
                times,
                CalendarRules.of(calendar),
                data["calendar_policy"],
                timezone=data["timezone"],
                dst_gap=data["dst_gap"],
                dst_fold=data["dst_fold"],
            )
        description = schedule_description(cron=data["cron"], interval=data["interval"], timezone=data["timezone"])
        return Response(
            PreviewSerializer({"timezone": data["timezone"], "description": description, "fire_times": times}).data
        )
