"""What the execution and worker API renders."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from executions.models import ArchiveIndex, Execution, ExecutionEvent, ExecutionStatus, Worker
from executions.runs import ExternalRun
from tasks_app.masking import mask_config
from tasks_app.secrets import config_masked
from tms_core.api.base import BoundedDateTimeField, StrictInputMixin


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


@extend_schema_field({"type": "object", "additionalProperties": True})
class InputField(serializers.JSONField):
    """A run's input: a JSON object."""


class NewInputField(InputField):
    """An input given for new runs instead of the one they would have (a replay's, a retry's):
    optional, null by default, and a JSON object, else "A JSON object: ``what``." on the field."""

    def __init__(self, *, what: str, **kwargs: Any) -> None:
        super().__init__(required=False, allow_null=True, default=None, **kwargs)
        self.what = what

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            raise serializers.ValidationError(f"A JSON object: {self.what}.")
        return value


def masked_input(value: Any) -> Any:
    """A run's input as people see it: secret-looking values masked as configs are."""
    return mask_config(value)


def masked_run_config(value: Any) -> Any:
    """A run's own config (stored sealed) as people see it: every secret value masked."""
    return config_masked("", value)


class MaskedInputField(InputField):
    """A run's input, shown: secret-looking values (a ``token``, a ``password``, an environment's
    values, a URL's password) read ``********``, as in a task's config."""

    def to_representation(self, value: Any) -> Any:
        return masked_input(value)


@extend_schema_field({"type": "object", "additionalProperties": True})
class RunConfigField(serializers.JSONField):
    """A run's own runner config (a replay's), secrets masked."""

    def to_representation(self, value: Any) -> Any:
        return masked_run_config(value)


#: How the lean rows render the field types DRF does not pass through as they are.
_CONVERT: dict[type, Any] = {
    serializers.DateTimeField: _iso,
    serializers.UUIDField: str,
    MaskedInputField: masked_input,
    RunConfigField: masked_run_config,
}


class ExecutionSerializer(serializers.ModelSerializer):
    task = serializers.UUIDField(source="task_id", read_only=True)
    team = serializers.IntegerField(
        source="team_id", read_only=True, help_text="The id of its task's team (GET /api/v1/teams): who sees it."
    )
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
    map_index = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="A map step's item (its task's `map_over`): its place in the list (0 first). Null for any other run.",
    )
    input = MaskedInputField(
        read_only=True,
        allow_null=True,
        help_text="What the run was given: the `input` of its trigger, its trigger URL's JSON body, a replay's "
        "input, or a workflow step's upstream output (as a JSON object if it was one, else "
        '`{"output": "<text>"}` plus `"error"` after a failure; for a step that follows several, an object '
        "keyed by upstream task id). Its values fill the task's `input_fills`. Secret-looking values are "
        "masked as in a config. Null: nothing.",
    )
    replay_of = serializers.IntegerField(
        source="replay_of_id",
        read_only=True,
        allow_null=True,
        help_text="The execution this one replays (POST /api/v1/executions/replay). Null: not a replay.",
    )
    config = RunConfigField(
        source="config_override",
        read_only=True,
        allow_null=True,
        help_text="The runner config this run uses instead of its task's (a replay's `config` laid over the "
        "task's), every secret masked. Null: the task's config.",
    )

    class Meta:
        model = Execution
        fields = [
            "id",
            "task",
            "team",
            "status",
            "waiting",
            "attempt",
            "origin",
            "retry_of",
            "workflow_run",
            "upstream",
            "map_index",
            "input",
            "replay_of",
            "config",
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


#: The statuses a replay selects from (finished runs), in the order the API lists them.
REPLAY_STATUSES = [ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED]


class ReplaySerializer(StrictInputMixin, serializers.Serializer):
    """A replay's selection of finished executions, and what their new runs are given."""

    task = serializers.UUIDField(required=False, help_text="The task whose executions to replay (or `tasks`).")
    tasks = serializers.ListField(
        child=serializers.UUIDField(),
        required=False,
        min_length=1,
        max_length=100,
        help_text="Several tasks whose executions to replay (instead of `task`).",
    )
    status = serializers.ListField(
        child=serializers.ChoiceField(choices=REPLAY_STATUSES),
        required=False,
        min_length=1,
        help_text="The statuses to replay (default: all three finished ones).",
    )
    since = BoundedDateTimeField(
        required=False, help_text="Executions that finished at or after this time (their `finished_at`)."
    )
    until = BoundedDateTimeField(required=False, help_text="Executions that finished before this time.")
    input = InputField(
        required=False,
        allow_null=True,
        default=None,
        help_text="The new runs' input, instead of each replayed execution's (checked as a trigger's is).",
    )
    config = serializers.JSONField(
        required=False,
        default=None,
        help_text="A partial runner config laid over each task's config for the new runs only (mappings merge, "
        "other values replace), validated by the runner as a change of the task's config would be. A secret "
        "sent as its mask keeps the task's value; when it sends the runs elsewhere (another URL, host, "
        "command ...) the task's secrets it does not send again are left out. It changes what the runs do: "
        "it needs the editor role in each task's team (an operator may replay, and give `input`, without it).",
    )
    dry_run = serializers.BooleanField(
        required=False, default=False, help_text="Check everything and say what would be replayed; create nothing."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("task" in attrs) == ("tasks" in attrs):
            raise serializers.ValidationError({"task": ["Give either task (one id) or tasks (a list of ids)."]})
        return attrs


class SingleReplaySerializer(StrictInputMixin, serializers.Serializer):
    """A single run's replay: its input, and which version of its task runs."""

    input = NewInputField(
        what="the new run's input",
        help_text="The new run's input, instead of the replayed execution's (checked as a trigger's is).",
    )
    version = serializers.ChoiceField(
        choices=["current", "original"],
        default="current",
        help_text="current: the task as it is now; original: the task's version the execution was created from.",
    )


class ReplayResultSerializer(serializers.Serializer):
    """What a replay did, or would do (``dry_run``)."""

    dry_run = serializers.BooleanField()
    count = serializers.IntegerField(help_text="How many executions are (or would be) replayed.")
    replayed = serializers.ListField(
        child=serializers.IntegerField(), help_text="The executions replayed, oldest end first."
    )
    created = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="The new executions, in the same order (each with `replay_of`); empty for a dry run.",
    )
    dropped_secrets = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        help_text="Per task id, the secrets of its config left out of the new runs' config (the override sends "
        "the runs elsewhere).",
    )
