"""The ``noop`` and ``sleep`` runners: no external executor, for demos and benchmarks."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from rest_framework import serializers

from runners.base import BaseRunner, RunHandle, RunResult, RunSpec
from tms_core.durations import DurationField


class NoopRunner(BaseRunner):
    """Succeeds at once."""

    supports_cancel = True

    def start(self, spec: RunSpec) -> RunHandle:
        return RunHandle(spec.idempotency_key, result=RunResult.succeeded())

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        return RunResult.succeeded()

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        return None


class SleepConfigSerializer(serializers.Serializer):
    duration = DurationField(help_text='How long to simulate work, e.g. "5s", "250ms" or 1.5 (seconds).')
    # The config key is "fail": DRF's serializer metaclass moves declared fields out of the class
    # body, so Field.fail (the error helper) is not shadowed at run time, only in the stubs' view.
    fail = serializers.BooleanField(  # type: ignore[assignment]
        default=False, help_text="End the run as failed after sleeping."
    )


class SleepRunner(BaseRunner):
    """Simulates work by sleeping in the worker, as the original design's ``command`` did.

    Runs of up to ``max_inline_seconds`` sleep inside ``start``; longer ones are tracked by
    their deadline and polled, so no message is held while they "run".
    """

    option_defaults: ClassVar[dict[str, Any]] = {"max_inline_seconds": 30.0}
    config_serializer_class = SleepConfigSerializer
    supports_cancel = True

    def start(self, spec: RunSpec) -> RunHandle:
        seconds = spec.config["duration"].total_seconds()
        if seconds > float(self.options["max_inline_seconds"]):
            return RunHandle(spec.idempotency_key, data={"deadline": time.time() + seconds})
        if seconds > spec.timeout:
            time.sleep(spec.timeout)
            return RunHandle(spec.idempotency_key, result=RunResult.failed(f"timed out after {spec.timeout:g}s"))
        time.sleep(seconds)
        return RunHandle(spec.idempotency_key, result=self._outcome(spec, seconds))

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        if time.time() < float(handle.data["deadline"]):
            return RunResult.running()
        return self._outcome(spec, spec.config["duration"].total_seconds())

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        return None

    @staticmethod
    def _outcome(spec: RunSpec, seconds: float) -> RunResult:
        if spec.config.get("fail"):
            return RunResult.failed(f"slept {seconds:g}s, then failed as configured")
        return RunResult.succeeded(f"slept {seconds:g}s")
