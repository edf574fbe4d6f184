"""The ``wait_event`` runner: a workflow step that waits for a named event (``POST
/api/v1/events/{name}``) whose payload matches its run's input, without holding a worker.

It is asynchronous: ``start`` records what the run waits for, and the platform polls it with
backoff like any asynchronous run (resuming it after a crash); each poll asks the platform, through
:attr:`~runners.base.RunSpec.event_lookup` (a runner never reads the database), for a matching event
received since the run started. An event also nudges the runs that wait for its name, so they end
at once rather than at their next backed-off poll. The run's output is the event's payload. The
task's ``timeout`` is the wait's: past it the run ends as ``on_timeout`` says."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from rest_framework import serializers

from runners.base import BaseRunner, RunHandle, RunResult, RunSpec
from tms_core.json_paths import json_path_parse

#: The key of the run's handle that names the event (executions.transitions.WAIT_EVENT_HANDLE_KEY,
#: by which an event's arrival finds the runs to nudge).
HANDLE_KEY = "wait_event"
#: The run ends as timed out this much before the task's timeout, so that its own ``on_timeout``
#: decides, not the platform's timeout check that follows a poll answered "still running".
TIMEOUT_MARGIN = 1.0
#: The longest output kept from an event's payload.
MAX_OUTPUT_CHARS = 64 * 1024
_EVENT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"


def _path(value: str) -> None:
    if value:
        try:
            json_path_parse(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


def _path_field(help_text: str) -> serializers.CharField:
    """An optional JSON path (empty: none), checked when the task is saved."""
    return serializers.CharField(
        required=False, allow_blank=True, default="", max_length=500, validators=[_path], help_text=help_text
    )


class WaitEventConfigSerializer(serializers.Serializer):
    event = serializers.RegexField(
        _EVENT_NAME, max_length=200, help_text="The event's name, e.g. order.paid (letters, digits, . _ - :)."
    )
    input_path = _path_field('A JSON path into the run\'s input whose value the event must carry, e.g. "$.order_id".')
    event_path = _path_field(
        'The JSON path in the event\'s payload compared with it, e.g. "$.id" (default: input_path).'
    )
    on_timeout = serializers.ChoiceField(
        choices=["fail", "succeed"],
        default="fail",
        help_text=(
            "How the run ends when no event came within the task's timeout: fail, or succeed "
            'with the output {"timed_out": true}.'
        ),
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("event_path") and not attrs.get("input_path"):
            raise serializers.ValidationError({"input_path": ["Set input_path to use event_path."]})
        if attrs.get("input_path") and not attrs.get("event_path"):
            attrs["event_path"] = attrs["input_path"]
        return attrs


class WaitEventRunner(BaseRunner):
    """Waits for a named event matching the run's input; asynchronous, polled by the platform."""

    config_serializer_class = WaitEventConfigSerializer
    supports_cancel = True
    destination_config_fields: ClassVar[tuple[str, ...] | None] = ("event",)

    def start(self, spec: RunSpec) -> RunHandle:
        return RunHandle(spec.idempotency_key, data={HANDLE_KEY: spec.config["event"]})

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        if spec.event_lookup is None:
            return RunResult.failed("this worker cannot look up events", retryable=False)
        config = spec.config
        check = spec.event_lookup(config["event"], config.get("input_path", ""), config.get("event_path", ""))
        if check.problem:
            return RunResult.failed(check.problem, retryable=False)
        if check.payload is not None:
            return RunResult.succeeded(json.dumps(check.payload, separators=(",", ":"))[:MAX_OUTPUT_CHARS])
        if check.waited >= spec.timeout - TIMEOUT_MARGIN:
            what = f"no event {config['event']!r} came within {spec.timeout:g}s"
            if config.get("on_timeout") == "succeed":
                return RunResult.succeeded(json.dumps({"timed_out": True}))
            return RunResult.failed(f"timed out: {what}", retryable=False)
        return RunResult.running()

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        return None
