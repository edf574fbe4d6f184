"""What a ``subprocess`` run came to: the supervisor's exit record read into a :class:`RunResult`.

The output is the end of the command's stdout, bounded like every runner's; a failure says why
in words (cancelled, timed out, a resource limit, a signal, an exit code) followed by the end of
stderr, and whether another attempt can help: a command that cannot be executed or found
(126, 127) never, a launch failure as the record says, any other failure unless the operator
switched ``retry_on_failure`` off.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runners.base import RunResult, RunSpec
from runners.subprocess.config import output_limit
from runners.subprocess.workdir import size, tail
from runners.supervisor import CANCEL, NOT_EXECUTABLE, NOT_FOUND, STDERR, STDOUT


def read_output(spec: RunSpec, run_dir: Path, default_limit: int) -> str:
    """The end of the run's stdout so far, cut to its ``max_output_bytes`` (else ``default_limit``)."""
    return tail(run_dir / STDOUT, output_limit(spec, default_limit))


def limit_exceeded(run_dir: Path, outcome: Mapping[str, Any], limits: Mapping[str, int]) -> str | None:
    """Which resource limit ended a failed run, if one did (signals are 128+n through bwrap)."""
    returncode = outcome.get("returncode")
    if not isinstance(returncode, int) or returncode == 0:
        return None
    signalled = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
    cpu = outcome.get("cpu_seconds")
    if signalled in (signal.SIGXCPU, signal.SIGKILL) and (
        signalled == signal.SIGXCPU or (isinstance(cpu, int | float) and cpu >= limits["cpu_seconds"] - 0.05)
    ):
        return f"killed: CPU time limit of {limits['cpu_seconds']} s reached"
    written = max((size(run_dir / name) for name in (STDOUT, STDERR)), default=0)
    if signalled == signal.SIGXFSZ or written >= limits["file_bytes"]:
        return f"output exceeded {limits['file_bytes']} bytes (file size limit)"
    return None


def judge(
    spec: RunSpec,
    run_dir: Path,
    outcome: Mapping[str, Any],
    *,
    limits: Mapping[str, int],
    default_output_limit: int,
    retry_on_failure: bool,
) -> RunResult:
    """Turn the supervisor's exit record ``outcome`` into a result.

    ``limits`` are the run's own (the runner's, with its config's), ``default_output_limit`` the
    runner's ``max_output_bytes`` and ``retry_on_failure`` its option of that name.
    """
    output = read_output(spec, run_dir, default_output_limit)
    returncode = outcome.get("returncode")
    if outcome.get("cancelled") or (run_dir / CANCEL).exists():
        return RunResult.failed("cancelled", output=output)
    if outcome.get("timed_out"):
        return RunResult.failed(
            f"timed out after {float(spec.timeout):g}s; the process group was killed", output=output
        )
    if returncode == 0 and not outcome.get("error"):
        return RunResult.succeeded(output)
    stderr = tail(run_dir / STDERR, output_limit(spec, default_output_limit)).strip()
    exceeded = limit_exceeded(run_dir, outcome, limits)
    if outcome.get("error"):
        message = str(outcome["error"])
    elif exceeded:
        message = exceeded
    elif isinstance(returncode, int) and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        message = f"killed by {name}"
    else:
        message = f"exited with code {returncode}"
    if stderr:
        message = f"{message}: {stderr}"
    if isinstance(outcome.get("retryable"), bool):
        retryable = outcome["retryable"]
    else:
        retryable = returncode not in (NOT_EXECUTABLE, NOT_FOUND) and (returncode is None or retry_on_failure)
    return RunResult.failed(message, output=output, retryable=retryable)
