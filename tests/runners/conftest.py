"""Helpers the runner tests share: building run specs, polling a run to its end, a free port.

They are plain functions, imported by the test modules (``from tests.runners.conftest import ...``),
because each module wants them with its own defaults rather than as fixtures.
"""

from __future__ import annotations

import itertools
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from runners.base import BaseRunner, RunHandle, RunResult, RunSpec


class SpecMaker(Protocol):
    def __call__(self, runner: BaseRunner, config: Any, **fields: Any) -> RunSpec: ...


def spec_maker(*, task_id: str, timeout: float, first_execution_id: int = 1) -> SpecMaker:
    """A ``make_spec(runner, config, **fields)`` with this module's defaults.

    The config goes through the runner's own validation, as the task services would do it, and
    every spec gets a fresh execution id unless the test names one.
    """
    execution_ids = itertools.count(first_execution_id)

    def make_spec(runner: BaseRunner, config: Any, **fields: Any) -> RunSpec:
        fields.setdefault("execution_id", next(execution_ids))
        fields.setdefault("attempt", 1)
        fields.setdefault("task_id", task_id)
        fields.setdefault("timeout", timeout)
        return RunSpec(config=runner.validate_config(config), **fields)

    return make_spec


def wait_for_result(
    runner: BaseRunner, spec: RunSpec, handle: RunHandle, seconds: float = 10, *, interval: float = 0.05
) -> RunResult:
    """Poll ``handle`` until the run finishes (the result ``start`` returned, if it had one)."""
    if handle.result is not None:
        return handle.result
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = runner.poll(spec, handle)
        if result.finished:
            return result
        time.sleep(interval)
    raise AssertionError(f"run {handle.external_run_id} did not finish within {seconds}s")


def wait_for_file(path: Path, seconds: float = 5, *, nonempty: bool = False) -> Path:
    """Wait until ``path`` exists (with ``nonempty``, has content): the files of a run folder are
    written by the detached supervisor or the command, which may still be starting when the
    runner's call returned."""
    deadline = time.monotonic() + seconds
    while not (path.exists() and (not nonempty or path.stat().st_size)):
        assert time.monotonic() < deadline, f"{path} never appeared" + (" with content" if nonempty else "")
        time.sleep(0.02)
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (until a test binds it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: An interpreter run users can execute (the suite's own may live under /root, closed to them).
SYSTEM_PYTHON = "/usr/bin/python3"


def reachable_dir(tmp_path: Path) -> Path:
    """A folder for run folders that run users can reach (pytest's own tmp_path is 0700 root's).

    ``/tmp/tms-test-runs-<pid>/<test's tmp folder name>``, searchable (not listable) by others.
    """
    top = Path(tempfile.gettempdir()) / f"tms-test-reach-{os.getpid()}"
    top.mkdir(mode=0o711, exist_ok=True)
    top.chmod(0o711)
    folder = top / tmp_path.name
    folder.mkdir(mode=0o711, exist_ok=True)
    return folder
