from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from executions.models import Execution
from executions.serializers import ExecutionSerializer
from tasks_app.models import Task
from tasks_app.serializers import TaskCreateSerializer, TaskSerializer
from tasks_app.services import task_create
from tms_project.api_base import OwnerScopedMixin


class TaskViewSet(OwnerScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Register tasks and look at them and their executions."""

    queryset = Task.objects.all()
    serializer_class = TaskSerializer
    filterset_fields = ["status", "runner"]
    search_fields = ["name"]
    ordering_fields = ["created_at", "name", "next_run_at", "priority"]

    @extend_schema(request=TaskCreateSerializer, responses={201: TaskSerializer})
    def create(self, request: Request) -> Response:
        serializer = TaskCreateSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        task = task_create(owner=request.user, **serializer.validated_data)
        return Response(TaskSerializer(task).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=ExecutionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def executions(self, request: Request, pk: str | None = None) -> Response:
        task = self.get_object()
        queryset = Execution.objects.filter(task=task).order_by("-scheduled_for", "-id")
        page = self.paginate_queryset(queryset)
        data = ExecutionSerializer(page if page is not None else queryset, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)
