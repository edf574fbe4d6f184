"""A runner that kills the process running it, like native code that segfaults its worker.

Configured only in the test settings, for the poison-work tests.
"""

from __future__ import annotations

import os
import signal

from runners.base import BaseRunner, RunHandle, RunResult, RunSpec


class CrashRunner(BaseRunner):
    def start(self, spec: RunSpec) -> RunHandle:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")  # pragma: no cover

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:  # pragma: no cover - never started
        return RunResult.failed("never started")

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:  # pragma: no cover
        return None
