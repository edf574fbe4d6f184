"""The subprocess runner's supervisor, piece by piece, against real processes in a temporary folder.

``supervise`` runs in the test process here (no fork, no detaching); the last test launches the
file the way the runner does. The whole runner is tested in test_subprocess.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runners import supervisor
from runners.subprocess.launch import SUPERVISOR
from runners.subprocess.workdir import process_started

PYTHON = sys.executable


@pytest.fixture
def run_dir(tmp_path: Path) -> str:
    folder = tmp_path / "tms-1-1"
    folder.mkdir()
    return str(folder)


@pytest.fixture(autouse=True)
def _keep_sigterm() -> Iterator[None]:
    """``supervise`` forwards SIGTERM to its command: give pytest its own handler back."""
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def plan(run_dir: str, code: str, *, seconds: float = 10.0, kill_grace: float = 0.5, **extra: Any) -> dict[str, Any]:
    """A run.json for ``python -c code``, as the runner writes it."""
    return {
        "argv": [PYTHON, "-c", code],
        "executable": PYTHON,
        "cwd": run_dir,
        "env": {"PATH": "/usr/bin:/bin"},
        "deadline": time.time() + seconds,
        "kill_grace": kill_grace,
        **extra,
    }


def write_plan(run_dir: str, spec: dict[str, Any]) -> None:
    Path(run_dir, supervisor.RUN).write_text(json.dumps(spec))


def read(run_dir: str, name: str) -> dict[str, Any]:
    return json.loads(Path(run_dir, name).read_text())


def alive(pid: int) -> bool:
    try:
        return process_started(pid) is not None
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------------


def test_write_json_replaces_the_document_whole_and_leaves_no_temporary_file(run_dir: str) -> None:
    supervisor.write_json(run_dir, "doc", {"n": 1})
    supervisor.write_json(run_dir, "doc", {"n": 2})

    assert read(run_dir, "doc") == {"n": 2}
    assert sorted(os.listdir(run_dir)) == ["doc"]


def test_start_ticks_match_proc_and_tell_a_gone_process() -> None:
    child = subprocess.Popen([PYTHON, "-c", "pass"])
    child.wait()

    assert supervisor.start_ticks(os.getpid()) == process_started(os.getpid())
    assert isinstance(supervisor.start_ticks(os.getpid()), int)
    assert supervisor.start_ticks(child.pid) is None


def test_killpg_of_a_gone_group_is_quiet() -> None:
    child = subprocess.Popen([PYTHON, "-c", "pass"], start_new_session=True)
    child.wait()

    supervisor.killpg(child.pid, signal.SIGTERM)  # no ProcessLookupError


def test_finish_fills_the_defaults_and_reads_cancel_from_the_folder(run_dir: str) -> None:
    supervisor.finish(run_dir, returncode=3)
    first = read(run_dir, supervisor.EXIT)
    Path(run_dir, supervisor.CANCEL).write_text("{}")
    supervisor.finish(run_dir, error="boom")
    second = read(run_dir, supervisor.EXIT)

    assert {key: first[key] for key in ("returncode", "timed_out", "cancelled")} == {
        "returncode": 3,
        "timed_out": False,
        "cancelled": False,
    }
    assert abs(first["finished_at"] - time.time()) < 5
    assert {key: second[key] for key in ("returncode", "timed_out", "cancelled", "error")} == {
        "returncode": None,
        "timed_out": False,
        "cancelled": True,
        "error": "boom",
    }


def test_record_start_counts_launches_and_publishes_the_pid(run_dir: str) -> None:
    supervisor.record_start(run_dir)
    supervisor.record_start(run_dir)

    assert len(Path(run_dir, supervisor.LAUNCHES).read_text().splitlines()) == 2
    assert read(run_dir, supervisor.SUPERVISOR_PID) == {
        "pid": os.getpid(),
        "start": process_started(os.getpid()),
    }


@pytest.mark.parametrize(
    ("executable", "code"),
    [("/nonexistent/program", supervisor.NOT_FOUND), ("/etc/hostname", supervisor.NOT_EXECUTABLE)],
)
def test_start_command_that_cannot_run_records_the_shell_exit_code(run_dir: str, executable: str, code: int) -> None:
    spec = {**plan(run_dir, "pass"), "argv": [executable], "executable": executable}

    assert supervisor.start_command(run_dir, spec) is None
    outcome = read(run_dir, supervisor.EXIT)
    assert outcome["returncode"] == code
    assert outcome["error"].startswith("cannot execute: ")


def test_start_command_runs_in_its_own_group_with_output_to_files(run_dir: str) -> None:
    code = "import os, sys; print(os.getpgid(0) == os.getpid(), os.environ['PATH']); print('oops', file=sys.stderr)"
    proc = supervisor.start_command(run_dir, plan(run_dir, code))

    assert proc is not None and proc.wait(timeout=10) == 0
    assert Path(run_dir, supervisor.STDOUT).read_text() == "True /usr/bin:/bin\n"
    assert Path(run_dir, supervisor.STDERR).read_text() == "oops\n"


def test_wait_for_command_reports_the_return_code() -> None:
    proc = subprocess.Popen([PYTHON, "-c", "raise SystemExit(4)"], start_new_session=True)

    assert supervisor.wait_for_command(proc, {"deadline": time.time() + 10, "kill_grace": 1}) == (4, False, None)


def test_wait_for_command_terminates_the_group_at_the_deadline() -> None:
    proc = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(30)"], start_new_session=True)

    began = time.monotonic()
    returncode, timed_out, too_large = supervisor.wait_for_command(
        proc, {"deadline": time.time() + 0.3, "kill_grace": 5}
    )

    assert (returncode, timed_out, too_large) == (-signal.SIGTERM, True, None)
    assert time.monotonic() - began < 4


def test_wait_for_command_kills_a_group_that_ignores_sigterm_after_the_grace() -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(30)"
    )
    proc = subprocess.Popen([PYTHON, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"

    began = time.monotonic()
    returncode, timed_out, too_large = supervisor.wait_for_command(proc, {"deadline": time.time(), "kill_grace": 0.3})

    assert (returncode, timed_out, too_large) == (-signal.SIGKILL, True, None)
    assert time.monotonic() - began < 4
    proc.stdout.close()


# --------------------------------------------------------------------------------------------
# supervise: the whole run, in this process
# --------------------------------------------------------------------------------------------


def test_supervise_runs_the_command_and_records_every_step(run_dir: str) -> None:
    write_plan(run_dir, plan(run_dir, "print('hello')"))

    supervisor.supervise(run_dir)

    outcome = read(run_dir, supervisor.EXIT)
    assert (outcome["returncode"], outcome["timed_out"], outcome["cancelled"]) == (0, False, False)
    assert "error" not in outcome
    assert Path(run_dir, supervisor.STDOUT).read_text() == "hello\n"
    assert len(Path(run_dir, supervisor.LAUNCHES).read_text().splitlines()) == 1
    assert read(run_dir, supervisor.SUPERVISOR_PID)["pid"] == os.getpid()
    pid = read(run_dir, supervisor.PID)
    assert pid["pgid"] == pid["pid"] != os.getpid()


def test_supervise_kills_what_the_command_left_behind(run_dir: str) -> None:
    # The command starts a grandchild (in the command's process group) and exits at once.
    code = (
        "import subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); print(p.pid)"
    )
    write_plan(run_dir, plan(run_dir, code))

    supervisor.supervise(run_dir)

    grandchild = int(Path(run_dir, supervisor.STDOUT).read_text())
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(grandchild)
    assert read(run_dir, supervisor.EXIT)["returncode"] == 0


def test_supervise_records_a_timeout(run_dir: str) -> None:
    write_plan(run_dir, plan(run_dir, "import time; time.sleep(30)", seconds=0.3, kill_grace=0.3))

    supervisor.supervise(run_dir)

    outcome = read(run_dir, supervisor.EXIT)
    assert (outcome["returncode"], outcome["timed_out"]) == (-signal.SIGTERM, True)


def test_supervise_does_not_start_a_cancelled_run(run_dir: str) -> None:
    marker = Path(run_dir, "started")
    write_plan(run_dir, plan(run_dir, f"open({str(marker)!r}, 'w').close()"))
    Path(run_dir, supervisor.CANCEL).write_text("{}")

    supervisor.supervise(run_dir)

    outcome = read(run_dir, supervisor.EXIT)
    assert outcome["error"] == "cancelled before the command started"
    assert outcome["cancelled"] is True
    assert not marker.exists()
    assert not Path(run_dir, supervisor.PID).exists()


# --------------------------------------------------------------------------------------------
# Launched as the runner launches it
# --------------------------------------------------------------------------------------------


def test_launched_by_path_it_detaches_at_once_and_uses_the_standard_modules(run_dir: str) -> None:
    # runners/ holds subprocess/ and email.py: with the file's folder on sys.path they would
    # shadow the standard library, and the run would never start.
    write_plan(run_dir, plan(run_dir, "import time; time.sleep(1); print('done')"))

    # Output to a file, as the runner does: a pipe would stay open as long as the detached process.
    with Path(run_dir, "supervisor.log").open("ab") as log:
        launcher = subprocess.Popen([PYTHON, "-I", SUPERVISOR, run_dir], stdout=log, stderr=log)
    launcher.wait(timeout=30)

    assert launcher.returncode == 0, Path(run_dir, "supervisor.log").read_text()
    assert not Path(run_dir, supervisor.EXIT).exists()  # the launcher did not wait for the command
    deadline = time.monotonic() + 10
    while not Path(run_dir, supervisor.EXIT).exists():
        assert time.monotonic() < deadline, "the supervisor never wrote the exit file"
        time.sleep(0.02)
    assert read(run_dir, supervisor.EXIT)["returncode"] == 0
    assert Path(run_dir, supervisor.STDOUT).read_text() == "done\n"
    assert read(run_dir, supervisor.SUPERVISOR_PID)["pid"] != launcher.pid  # the detached second process
