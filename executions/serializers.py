from __future__ import annotations

from rest_framework import serializers

from executions.models import Execution, ExecutionEvent, Worker


class ExecutionEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ExecutionEvent
        fields = ["id", "from_status", "to_status", "attempt", "at", "actor", "detail"]
        read_only_fields = fields


class ExecutionSerializer(serializers.ModelSerializer):
    task = serializers.UUIDField(source="task_id", read_only=True)

    class Meta:
        model = Execution
        fields = [
            "id",
            "task",
            "status",
            "attempt",
            "scheduled_for",
            "due_at",
            "priority",
            "external_run_id",
            "lease_owner",
            "created_at",
            "enqueued_at",
            "started_at",
            "finished_at",
            "output",
            "error",
        ]
        read_only_fields = fields


class ExecutionDetailSerializer(ExecutionSerializer):
    events = ExecutionEventSerializer(many=True, read_only=True)

    class Meta(ExecutionSerializer.Meta):
        fields = [*ExecutionSerializer.Meta.fields, "events"]
        read_only_fields = fields


class WorkerSerializer(serializers.ModelSerializer):
    class Meta:
        model = Worker
        fields = ["id", "hostname", "pid", "status", "started_at", "last_heartbeat"]
        read_only_fields = fields
