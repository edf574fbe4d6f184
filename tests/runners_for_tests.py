"""Runner backends whose cancel behaviour tests can observe."""

from __future__ import annotations

from runners.base import BaseRunner, RunHandle, RunnerError, RunResult, RunSpec

#: (runner alias, external run id, handle data) of every cancel call.
CANCELLED: list[tuple[str, str, dict]] = []


def reset() -> None:
    CANCELLED.clear()


class _AsyncRunner(BaseRunner):
    def start(self, spec: RunSpec) -> RunHandle:
        return RunHandle(f"run-{spec.idempotency_key}", data={"started": True})

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        return RunResult.running()


class CancellableRunner(_AsyncRunner):
    supports_cancel = True

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        CANCELLED.append((self.alias, handle.external_run_id, dict(handle.data)))


class UncancellableRunner(_AsyncRunner):
    supports_cancel = False

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:  # pragma: no cover - never called
        raise AssertionError("cancel() called on a runner that does not support it")


class BrokenCancelRunner(_AsyncRunner):
    supports_cancel = True

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        raise RunnerError("executor unreachable")


RUNNERS = {
    "cancellable": {"BACKEND": "tests.runners_for_tests.CancellableRunner"},
    "uncancellable": {"BACKEND": "tests.runners_for_tests.UncancellableRunner"},
    "broken-cancel": {"BACKEND": "tests.runners_for_tests.BrokenCancelRunner"},
}
