from __future__ import annotations

from rest_framework import mixins, viewsets

from executions.models import Execution
from executions.serializers import ExecutionDetailSerializer, ExecutionSerializer
from tms_project.api_base import OwnerScopedMixin


class ExecutionViewSet(OwnerScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Executions of your tasks, each with its event timeline."""

    owner_field = "task__owner"
    queryset = Execution.objects.all()
    filterset_fields = ["task", "status"]
    ordering_fields = ["scheduled_for", "id", "finished_at"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        queryset = super().get_queryset()
        if self.action == "retrieve":
            queryset = queryset.prefetch_related("events")
        return queryset

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        return ExecutionDetailSerializer if self.action == "retrieve" else ExecutionSerializer
