"""``GET /api/v1/tasks/{id}/versions``: a task's versions, newest first; ``POST
/api/v1/tasks/{id}/versions/{number}/restore``: give the task one's settings again."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response

from tasks_api.restore import task_version_restore
from tasks_app.models import Task, TaskStatus, TaskVersion
from tasks_app.versions import version_first_ensure
from teams_api.scope import TeamScopedMixin
from tms_core.api.keyset import KeysetPagination, Segment
from tms_core.auth import actor_for, request_user


class TaskVersionSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name", help_text="Who made the change (a user, a command, system).")
    changed = serializers.ListField(
        child=serializers.CharField(), help_text="The settings that differ from the version before."
    )
    settings = serializers.JSONField(
        source="snapshot", help_text="The task's settings in this version; secrets read ********."
    )

    class Meta:
        model = TaskVersion
        fields = ["number", "created_at", "actor", "source", "changed", "settings"]
        read_only_fields = fields


@extend_schema_view(
    get=extend_schema(
        summary="List a task's versions",
        description=(
            "Every change of a task (API, admin, back office) makes a new version; each execution names the one it "
            "was created from (`task_version`). Newest first, paged by cursor. Secrets are masked."
        ),
    )
)
class TaskVersionListView(TeamScopedMixin, generics.ListAPIView):
    queryset = TaskVersion.objects.all()
    serializer_class = TaskVersionSerializer
    pagination_class = KeysetPagination

    def get_queryset(self) -> QuerySet:
        tasks = self.owner_scope(Task.objects.exclude(status=TaskStatus.DELETED))
        task = get_object_or_404(tasks, pk=self.kwargs["task_id"])
        if task.version == 1:
            version_first_ensure(task.pk)  # written lazily (tasks_app.versions)
        return TaskVersion.objects.filter(task=task)

    def keyset_segments(self, queryset: QuerySet, state: dict) -> list[Segment]:
        return [Segment([queryset.order_by()], None, True)]


class TaskVersionRestoreResultSerializer(serializers.Serializer):
    restored = serializers.IntegerField(help_text="The version whose settings the task has again.")
    changed = serializers.ListField(
        child=serializers.CharField(), help_text="The settings the restore changed (empty: it had them already)."
    )
    version = serializers.IntegerField(help_text="The task's version now (a new one when anything changed).")


class TaskVersionRestoreView(TeamScopedMixin, generics.GenericAPIView):
    queryset = Task.objects.exclude(status=TaskStatus.DELETED)
    serializer_class = TaskVersionRestoreResultSerializer

    @extend_schema(
        summary="Restore a task's earlier version",
        description=(
            "Gives the task the settings of one of its versions again, as a PATCH of those settings would: "
            "audited, a new version, and the runs that have not started replaced where the schedule, runner, "
            "config or priority change. Versions never hold secrets: each secret the version's config had is "
            "kept at the task's current value; a version with a secret the task no longer holds is a 400 on "
            "`config`. The team is left as it is. Needs the editor role in the task's team (403); 404 for a "
            "task that is not yours or a version it does not have; 400 per field when those settings are no "
            "longer valid (a calendar or upstream task deleted since)."
        ),
        request=None,
        parameters=[
            OpenApiParameter("task_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The task's id."),
            OpenApiParameter("number", OpenApiTypes.INT, OpenApiParameter.PATH, description="The version to restore."),
        ],
        responses={200: TaskVersionRestoreResultSerializer},
    )
    def post(self, request: Request, task_id: str, number: str) -> Response:
        tasks = self.owner_scope(Task.objects.exclude(status=TaskStatus.DELETED))
        task = get_object_or_404(tasks, pk=task_id)
        report = task_version_restore(
            task=task,
            number=int(number),
            user=request_user(request),
            actor=actor_for(request_user(request)),
            request=request,
        )
        body = {"restored": report.restored, "changed": report.changed, "version": report.version}
        return Response(TaskVersionRestoreResultSerializer(body).data, status=status.HTTP_200_OK)
