"""Runner backends for tests only.

``CrashRunner`` is configured in the test settings (as ``crash``), so the worker processes the
poison-work tests start have it too. The runners whose cancel behaviour tests observe are added
per test by the ``test_runners`` fixture (``RUNNERS``).
"""

from __future__ import annotations

import os
import signal

from runners.base import BaseRunner, RunHandle, RunnerError, RunResult, RunSpec

#: (runner alias, external run id, handle data) of every cancel call.
CANCELLED: list[tuple[str, str, dict]] = []


def reset() -> None:
    CANCELLED.clear()


class CrashRunner(BaseRunner):
    """Kills the process running it, like native code that segfaults its worker."""

    def start(self, spec: RunSpec) -> RunHandle:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")  # pragma: no cover

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:  # pragma: no cover - never started
        return RunResult.failed("never started")

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:  # pragma: no cover
        return None


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
