"""The ``noop`` and ``sleep`` runners: no external executor.

``noop`` and ``sleep`` with ``duration`` stand in for work (demos and benchmarks); ``sleep`` with
``for`` or ``until`` is a workflow's pause (issue 48): it holds no worker while it waits, is polled
once, at its wake-up time, and passes its input on to the next step.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

from django.utils.dateparse import parse_datetime
from rest_framework import serializers

from runners.base import BaseRunner, RunHandle, RunResult, RunSpec
from tms_core.durations import MAX_DURATION, DurationField


class NoopRunner(BaseRunner):
    """Succeeds at once."""

    supports_cancel = True

    def start(self, spec: RunSpec) -> RunHandle:
        return RunHandle(spec.idempotency_key, result=RunResult.succeeded())

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        return RunResult.succeeded()

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        return None


#: ``$.key``, ``$.a.b``, ``$.items[0]``: a path into the run's input (``until``).
_INPUT_PATH = re.compile(r"^\$((?:\.[A-Za-z_][A-Za-z0-9_\-]*|\[\d{1,6}\])+)$")
_PATH_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_\-]*)|\[(\d{1,6})\]")


def _instant(value: Any) -> datetime | None:
    """An ISO 8601 date-time with its offset (``2026-12-08T09:00:00Z``) as an aware datetime."""
    if not isinstance(value, str):
        return None
    try:
        parsed = parse_datetime(value.strip())
    except ValueError:
        return None
    if parsed is None or parsed.tzinfo is None:
        return None
    return parsed.astimezone(UTC)


def _read_path(document: Any, path: str) -> Any:
    """The value at ``path`` (``$.a.b[0]``) in ``document``, or None."""
    value = document
    for key, index in _PATH_STEP.findall(path[1:]):
        if key and isinstance(value, Mapping):
            value = value.get(key)
        elif index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return None
    return value


class SleepConfigSerializer(serializers.Serializer):
    duration = DurationField(
        required=False, help_text='How long to simulate work, e.g. "5s", "250ms" or 1.5 (seconds).'
    )
    # The config key is "fail": DRF's serializer metaclass moves declared fields out of the class
    # body, so Field.fail (the error helper) is not shadowed at run time, only in the stubs' view.
    fail = serializers.BooleanField(  # type: ignore[assignment]
        default=False, help_text="End the run as failed after sleeping."
    )
    until = serializers.CharField(
        required=False,
        max_length=200,
        help_text="A workflow's pause until a time: an ISO 8601 date-time with its offset "
        '("2026-12-08T09:00:00Z"), or a path into the run\'s input that holds one ("$.send_at").',
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # "for" is a Python keyword: declared here rather than in the class body.
        fields["for"] = DurationField(
            required=False,
            min_value=None,
            help_text='A workflow\'s pause for a duration: seconds or "10m", "1h30m", "2d".',
        )
        return fields

    def validate_until(self, value: str) -> str:
        value = value.strip()
        if value.startswith("$"):
            if not _INPUT_PATH.match(value):
                raise serializers.ValidationError('A path into the run\'s input looks like "$.send_at" or "$.a.b[0]".')
            return value
        if _instant(value) is None:
            raise serializers.ValidationError(
                'Expected an ISO 8601 date-time with its offset, e.g. "2026-12-08T09:00:00Z", or a path such as '
                '"$.send_at".'
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = [name for name in ("duration", "for", "until") if name in attrs]
        if not given:
            raise serializers.ValidationError(
                {"for": ['Give exactly one of "for" (a pause), "until" (a pause) or "duration" (simulated work).']}
            )
        if len(given) > 1:
            raise serializers.ValidationError({name: [f"Give only one of {', '.join(given)}."] for name in given[1:]})
        if attrs.get("fail") and "duration" not in attrs:
            raise serializers.ValidationError({"fail": ['Only with "duration" (simulated work).']})
        return attrs


class SleepRunner(BaseRunner):
    """With ``duration``: simulates work by sleeping in the worker, as the original design's
    ``command`` did. Runs of up to ``max_inline_seconds`` sleep inside ``start``; longer ones are
    tracked by their deadline and polled, so no message is held while they "run".

    With ``for`` or ``until``: a workflow's pause. ``start`` computes the wake-up time and returns
    at once, asking to be polled then (:attr:`RunHandle.poll_at`): no worker slot is held, and the
    one poll at the wake-up time ends the run. Its output is the run's input (an object: its keys;
    anything else: as ``input``) with ``slept: {from, until}`` added, so the next step gets what
    this one got. The task's timeout must be longer than the pause (past it, the run times out).
    """

    option_defaults: ClassVar[dict[str, Any]] = {"max_inline_seconds": 30.0}
    config_serializer_class = SleepConfigSerializer
    supports_cancel = True

    def timeout_problems(self, config: Mapping[str, Any], timeout: float) -> dict[str, list[str]]:
        pause = config.get("for")
        if pause is not None and pause.total_seconds() >= timeout:
            return {
                "for": [
                    f"The pause ({pause.total_seconds():g}s) is not shorter than the task's timeout "
                    f"({timeout:g}s): the run would time out. Set a longer timeout."
                ]
            }
        return {}

    def start(self, spec: RunSpec) -> RunHandle:
        if "duration" not in spec.config:
            return self._start_pause(spec)
        seconds = spec.config["duration"].total_seconds()
        if seconds > float(self.options["max_inline_seconds"]):
            return RunHandle(spec.idempotency_key, data={"deadline": time.time() + seconds})
        if seconds > spec.timeout:
            time.sleep(spec.timeout)
            return RunHandle(spec.idempotency_key, result=RunResult.failed(f"timed out after {spec.timeout:g}s"))
        time.sleep(seconds)
        return RunHandle(spec.idempotency_key, result=self._outcome(spec, seconds))

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        if "wake_at" in handle.data:
            wake_at = float(handle.data["wake_at"])
            if time.time() < wake_at:
                return RunResult.running(poll_at=wake_at)
            return self._woken(spec, float(handle.data["from"]), wake_at)
        if time.time() < float(handle.data["deadline"]):
            return RunResult.running()
        return self._outcome(spec, spec.config["duration"].total_seconds())

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        return None

    def _start_pause(self, spec: RunSpec) -> RunHandle:
        now = time.time()
        if "for" in spec.config:
            wake_at = now + spec.config["for"].total_seconds()
        else:
            until = str(spec.config["until"])
            value = _read_path(spec.input, until) if until.startswith("$") else until
            instant = _instant(value)
            if instant is None:
                error = (
                    f"until: the run's input has no ISO 8601 date-time with its offset at {until} (found {value!r})"
                    if until.startswith("$")
                    else f"until: {until!r} is not an ISO 8601 date-time with its offset"
                )
                return RunHandle(spec.idempotency_key, result=RunResult.failed(error, retryable=False))
            wake_at = min(instant.timestamp(), now + MAX_DURATION.total_seconds())
        if wake_at <= now:
            return RunHandle(spec.idempotency_key, result=self._woken(spec, now, now))
        return RunHandle(spec.idempotency_key, data={"from": now, "wake_at": wake_at}, poll_at=wake_at)

    @staticmethod
    def _woken(spec: RunSpec, slept_from: float, wake_at: float) -> RunResult:
        slept = {
            "from": datetime.fromtimestamp(slept_from, UTC).isoformat(),
            "until": datetime.fromtimestamp(wake_at, UTC).isoformat(),
        }
        passed = dict(spec.input) if isinstance(spec.input, Mapping) else {"input": spec.input}
        return RunResult.succeeded(json.dumps({**passed, "slept": slept}))

    @staticmethod
    def _outcome(spec: RunSpec, seconds: float) -> RunResult:
        if spec.config.get("fail"):
            return RunResult.failed(f"slept {seconds:g}s, then failed as configured")
        return RunResult.succeeded(f"slept {seconds:g}s")
