"""``GET /api/v1/tasks/{id}/versions``: a task's versions, newest first."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.generics import get_object_or_404

from tasks_app.models import Task, TaskStatus, TaskVersion
from tasks_app.team_scope import TeamScopedMixin
from tms_core.api.keyset import KeysetPagination, Segment


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
        return TaskVersion.objects.filter(task=task)

    def keyset_segments(self, queryset: QuerySet, state: dict) -> list[Segment]:
        return [Segment([queryset.order_by()], None, True)]
