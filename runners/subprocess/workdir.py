"""Run folders of the ``subprocess`` runner: their files, the processes they record, and pruning.

Every attempt gets its own folder, ``<work_dir>/<idempotency key>/``::

    launch          O_EXCL marker: whoever creates it launches; every later start adopts the run
    run.json        what to run (argv, environment, working directory, timeout), mode 0600
    launches        one line per supervisor that ever started: the executor's own launch count
    supervisor.pid  the supervisor's pid and start time
    pid             the command's pid (= its process group) and start time
    stdout, stderr  the command's output streams (read back bounded, from the end)
    exit            the outcome, written atomically by the supervisor when the command ends
    cancel          written by ``cancel`` before it signals anything
    supervisor.log  the supervisor's own errors, if it ever has any
    work/           the command's working directory, HOME and TMPDIR (``work/tmp``)

The folder is all any worker process on the host needs to poll or cancel a run. Liveness checks
compare the process start time from ``/proc`` with the one recorded at launch, so a recycled pid is
never mistaken for the run. Folders are kept after the run (for the output and for adoption) until
:func:`prune_runs` removes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runners.base import RunnerError
from runners.supervisor import EXIT, PID, SUPERVISOR_PID

# File names inside a run folder, besides those the supervisor writes (imported from it).
LAUNCH, SUPERVISOR_LOG, WORK, BIN = "launch", "supervisor.log", "work", "bin"


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: Mapping[str, Any], *, mode: int = 0o600) -> None:
    """Write ``data`` so that readers see either nothing or the whole document."""
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def write_text(path: Path, text: str, *, mode: int) -> None:
    """Write a small text file whole, with ``mode`` whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)


def size(path: Path) -> int:
    """The size of ``path`` in bytes, 0 when it does not exist."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def tail(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of a file as text, saying how much was left out."""
    try:
        with path.open("rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, end - limit))
            data = fh.read(limit)
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if end > limit:
        return f"[... {end - limit} earlier bytes omitted]\n{text}"
    return text


def process_started(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks, or None if it is gone or a zombie.

    Raises ``OSError`` when ``/proc`` cannot tell (not Linux).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):  # a zombie has finished; nobody may have reaped it yet
        return None
    return int(fields[19])


def alive(info: Mapping[str, Any] | None) -> bool:
    """Whether the process recorded in ``info`` still runs (and its pid was not recycled)."""
    if not info or not isinstance(info.get("pid"), int):
        return False
    pid = info["pid"]
    try:
        started = process_started(pid)
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return started is not None and (info.get("start") is None or started == info["start"])


def signal_group(info: Mapping[str, Any] | None, sig: int) -> None:
    """Send ``sig`` to the process group recorded in ``info``, if there is one and it is still the
    run's.

    Pids are reused (pid_max is often 32,768): once the run's group has emptied, its number may lead
    another group, such as the next run's supervisor (which leads a session of its own). So the
    group is signalled only while its leader is the recorded process, or while the leader is gone
    and members are left: the kernel does not hand out a number still in use as a group id, so
    those members are the run's own.
    """
    if not info or not isinstance(info.get("pgid"), int) or info["pgid"] <= 1:
        return
    if info.get("start") is not None and info["pgid"] == info.get("pid"):
        with contextlib.suppress(OSError):
            leader = process_started(info["pgid"])
            if leader is not None and leader != info["start"]:
                return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(info["pgid"], sig)


def record_failure(run_dir: Path, message: str, *, retryable: bool = True) -> None:
    """Make a failed launch final, so adopting starts and polls report it instead of waiting."""
    write_json(
        run_dir / EXIT,
        {
            "returncode": None,
            "timed_out": False,
            "cancelled": False,
            "error": message,
            "retryable": retryable,
            "finished_at": time.time(),
        },
    )


def wait_for_exit(run_dir: Path, seconds: float) -> bool:
    """Wait up to ``seconds`` for the run's exit record; say whether it appeared."""
    deadline = time.monotonic() + seconds
    delay = 0.005
    while time.monotonic() < deadline:
        if (run_dir / EXIT).exists():
            return True
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.05)
    return False


def prepare_work_dir(work_dir: Path, mode: str) -> None:
    """Create ``work_dir``; with a run user (sandbox ``mode`` other than none), check that it
    can reach its folder (no more)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    if mode == "none":
        return
    # Search (x) but no listing (r) for others: a run user reaches its own folder by name only.
    if work_dir.stat().st_mode & 0o777 != 0o711:
        work_dir.chmod(0o711)
    for folder in work_dir.parents:
        if not folder.stat().st_mode & 0o001:
            raise RunnerError(
                f"run users cannot reach the work_dir {work_dir}: {folder} is not searchable by others "
                "(chmod o+x it, or choose another work_dir)",
                retryable=False,
            )


def prune_runs(work_dir: Path, retention: float) -> int:
    """Remove the run folders in ``work_dir`` older than ``retention`` seconds; never a run in progress.

    A folder goes when its run has ended (exit record) that long ago, or when it was launched
    that long ago and neither its supervisor nor its command is alive. Returns how many went.
    """
    cutoff = time.time() - retention
    removed = 0
    if not work_dir.is_dir():
        return 0
    for folder in work_dir.iterdir():
        if not folder.is_dir() or folder.is_symlink():
            continue
        try:
            ended = (folder / EXIT).stat().st_mtime
        except FileNotFoundError:
            try:
                launched = (folder / LAUNCH).stat().st_mtime
            except FileNotFoundError:
                continue
            if launched > cutoff or alive(read_json(folder / SUPERVISOR_PID)) or alive(read_json(folder / PID)):
                continue
        else:
            if ended > cutoff:
                continue
        shutil.rmtree(folder, ignore_errors=True)
        removed += 1
    return removed
