"""What the execution and worker API renders."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from executions.models import ArchiveIndex, Execution, ExecutionEvent, ExecutionStatus, Worker
from executions.runs import ExternalRun


class ExecutionEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = ExecutionEvent
        fields = ["id", "from_status", "to_status", "attempt", "at", "actor", "detail"]
        read_only_fields = fields


def _iso(value: datetime | None) -> str | None:
    """A date-time as DRF's DateTimeField renders it (ISO 8601 in the current zone, UTC as ``Z``)."""
    if value is None:
        return None
    text = timezone.localtime(value).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class ExecutionRowsSerializer(serializers.ListSerializer):
    """A list page of :class:`ExecutionSerializer` rows, built without DRF's per-field work.

    A page of 50 rows spent a third of the request in DRF's field machinery (bind, get_attribute,
    to_representation for each of 18 fields of each row): here each row is one dict built from
    the same attributes. The output is the same, to the character (tests/executions/
    test_list_queries.py compares them); the schema is the child's, unchanged.
    """

    def to_representation(self, data: Any) -> list[dict[str, Any]]:
        fields = [
            (name, str(field.source), _CONVERT.get(type(field)))
            for name, field in cast("serializers.Serializer", self.child).fields.items()
        ]
        return [
            {
                name: convert(value) if convert is not None and value is not None else value
                for name, source, convert in fields
                for value in (getattr(row, source),)
            }
            for row in data
        ]


#: How the lean rows render the field types DRF does not pass through as they are.
_CONVERT: dict[type, Any] = {serializers.DateTimeField: _iso, serializers.UUIDField: str}


@extend_schema_field({"type": "object", "additionalProperties": True})
class InputField(serializers.JSONField):
    """A run's input: a JSON object."""


class ExecutionSerializer(serializers.ModelSerializer):
    task = serializers.UUIDField(source="task_id", read_only=True)
    retry_of = serializers.IntegerField(
        source="retry_of_id", read_only=True, allow_null=True, help_text="The execution this one runs again."
    )
    workflow_run = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="The workflow run it belongs to: the id of the execution that started it (a root's own, once "
        "its end started a follower). Null: not part of a workflow run.",
    )
    upstream = serializers.ListField(
        child=serializers.IntegerField(),
        read_only=True,
        allow_null=True,
        help_text="A workflow step's upstream executions: the runs whose ends started it (several for a task that "
        "follows several). Null for any other run.",
    )
    input = InputField(
        read_only=True,
        allow_null=True,
        help_text="What the run was given: a workflow step's upstream output, as a JSON object if it was one, else "
        '`{"output": "<text>"}` (plus `"error"` after a failure); for a step that follows several, an object '
        "keyed by upstream task id. Null: nothing.",
    )

    class Meta:
        model = Execution
        fields = [
            "id",
            "task",
            "status",
            "waiting",
            "attempt",
            "origin",
            "retry_of",
            "workflow_run",
            "upstream",
            "input",
            "scheduled_for",
            "moved_from",
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
            # The number of the task's version it was created from (GET /tasks/{id}/versions).
            "task_version",
        ]
        read_only_fields = fields
        # Lists (many=True) render through the lean page serializer.
        list_serializer_class: type[serializers.ListSerializer] = ExecutionRowsSerializer


class ExecutionDetailSerializer(ExecutionSerializer):
    events = ExecutionEventSerializer(many=True, read_only=True, help_text="Every state change, oldest first.")

    class Meta(ExecutionSerializer.Meta):
        fields = [*ExecutionSerializer.Meta.fields, "events"]
        read_only_fields = fields
        list_serializer_class = serializers.ListSerializer


class CancelReportSerializer(serializers.Serializer):
    """What cancelling one execution did, including to its external run."""

    execution = serializers.IntegerField(source="execution_id")
    task = serializers.UUIDField(source="task_id")
    from_status = serializers.ChoiceField(choices=ExecutionStatus.choices, help_text="Its status before the cancel.")
    status = serializers.ChoiceField(choices=ExecutionStatus.choices, help_text="Its status now.")
    external_run = serializers.ChoiceField(
        choices=[(value.value, value.name.lower()) for value in ExternalRun],
        help_text=(
            "none: it had not started; stopped: the runner stopped the external run; unsupported: the runner "
            "cannot stop runs, so it may go on (its result is discarded); discarded: no external run was recorded "
            "yet, the worker's result is discarded; failed: the runner failed to stop the run."
        ),
    )
    detail = serializers.CharField(allow_blank=True)


class WorkerSerializer(serializers.ModelSerializer):
    seconds_since_heartbeat = serializers.SerializerMethodField()

    class Meta:
        model = Worker
        fields = [
            "id",
            "node_name",
            "hostname",
            "pid",
            "status",
            "started_at",
            "last_heartbeat",
            "seconds_since_heartbeat",
        ]
        read_only_fields = fields

    def get_seconds_since_heartbeat(self, worker: Worker) -> float:
        now: datetime = self.context["now"]
        return round(max(0.0, (now - worker.last_heartbeat).total_seconds()), 3)


class ArchiveIndexSerializer(serializers.ModelSerializer):
    """Where some of a task's pruned executions went."""

    task = serializers.UUIDField(source="task_id", read_only=True)

    class Meta:
        model = ArchiveIndex
        fields = [
            "id",
            "task",
            "period_from",
            "period_to",
            "executions",
            "events",
            "skipped",
            "file_name",
            "file_sha256",
            "ids_sha256",
            "created_at",
        ]
        read_only_fields = fields


class WorkflowCancelSerializer(serializers.Serializer):
    """What cancelling a workflow run did: each of its steps that was still to run or running."""

    workflow_run = serializers.IntegerField(help_text="The workflow run's id (its root execution's).")
    executions = CancelReportSerializer(many=True, help_text="Each step cancelled.")
