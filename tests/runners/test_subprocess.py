"""The subprocess runner against real processes (no database needed).

Every run lives in its own folder under ``tmp_path``; commands are the test interpreter (with
``-c`` code) and a few coreutils, never a shell.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from rest_framework import serializers

from runners.base import RunHandle, RunnerError, RunSpec, RunState
from runners.registry import get_runner
from runners.subprocess import SubprocessRunner
from runners.subprocess.workdir import process_started, signal_group
from tests.runners.conftest import SYSTEM_PYTHON, reachable_dir, spec_maker, wait_for_file, wait_for_result

# Runs execute as a run user, which may not reach the suite's own interpreter (under /root).
PYTHON = SYSTEM_PYTHON
make_spec = spec_maker(task_id="task-7", timeout=30.0)


def make_runner(tmp_path: Path, **options: Any) -> SubprocessRunner:
    options.setdefault("allowed_executables", [PYTHON, "echo", "sleep", "true"])
    options.setdefault("work_dir", str(reachable_dir(tmp_path) / "runs"))
    options.setdefault("kill_grace_seconds", 0.5)
    return SubprocessRunner("local", options)


def python(code: str) -> dict[str, Any]:
    return {"command": [PYTHON, "-c", code]}


def run_dir(runner: SubprocessRunner, spec: RunSpec) -> Path:
    return runner.work_dir / spec.idempotency_key


def launches(runner: SubprocessRunner, spec: RunSpec, *, wait: bool = True, seconds: float = 5) -> int:
    """The executor's own count: one line per supervisor that ever started for this key.

    The supervisor is a detached process that writes its line when it starts, which may be after
    ``start()`` returned: by default this waits for the first line (a CI flake read 0 here). With
    ``wait=False`` (a test where nothing was launched) it counts what is there now."""
    path = run_dir(runner, spec) / "launches"

    def count() -> int:
        # Whole lines only: a line being appended counts once it is complete.
        return path.read_text().count("\n") if path.exists() else 0

    deadline = time.monotonic() + seconds
    while wait and not count() and time.monotonic() < deadline:
        time.sleep(0.02)
    return count()


def command_pid(runner: SubprocessRunner, spec: RunSpec) -> int:
    path = run_dir(runner, spec) / "pid"
    wait_for_file(path)
    return json.loads(path.read_text())["pid"]


def gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie nobody reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def wait_gone(pid: int, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.02)
    return gone(pid)


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[SubprocessRunner]:
    runner = make_runner(tmp_path)
    yield runner
    # Leave no process behind, whatever a test did.
    # Through signal_group: the number in an old pid file may lead another test's group by now.
    for pid_file in runner.work_dir.glob("*/pid"):
        signal_group(json.loads(pid_file.read_text()), signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# Outcomes
# --------------------------------------------------------------------------------------------


def test_command_runs_detached_and_poll_reports_success(runner: SubprocessRunner) -> None:
    spec = make_spec(
        runner, {**python("import sys, time; time.sleep(0.3); print(*sys.argv[1:])"), "args": ["hi", "there"]}
    )

    handle = runner.start(spec)

    assert handle.result is None
    assert handle.external_run_id.endswith(":" + spec.idempotency_key)
    assert runner.poll(spec, handle).state is RunState.RUNNING
    result = wait_for_result(runner, spec, handle)
    assert result.state is RunState.SUCCEEDED
    assert result.output == "hi there\n"
    assert launches(runner, spec) == 1


def test_short_command_finishes_inside_start_with_inline_wait(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, inline_wait_seconds=5)
    spec = make_spec(runner, python("print('quick')"))

    handle = runner.start(spec)

    assert handle.result is not None
    assert handle.result.state is RunState.SUCCEEDED
    assert handle.result.output == "quick\n"


def test_output_keeps_the_bounded_tail_of_stdout(runner: SubprocessRunner) -> None:
    spec = make_spec(runner, {**python("print('x' * 5000 + 'END')"), "max_output_bytes": 100})

    result = wait_for_result(runner, spec, runner.start(spec))

    assert result.state is RunState.SUCCEEDED
    assert result.output.startswith("[... 4904 earlier bytes omitted]\n")
    assert result.output.endswith("xEND\n")
    assert len(result.output.split("\n", 1)[1]) == 100


def test_nonzero_exit_fails_retryably_with_stderr_excerpt(runner: SubprocessRunner) -> None:
    spec = make_spec(runner, python("import sys; print('partial'); sys.stderr.write('disk full'); sys.exit(3)"))

    result = wait_for_result(runner, spec, runner.start(spec))

    assert result.state is RunState.FAILED
    assert result.error == "exited with code 3: disk full"
    assert result.output == "partial\n"
    assert result.retryable is True


def test_nonzero_exit_is_final_when_the_operator_says_so(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, retry_on_failure=False)
    spec = make_spec(runner, python("raise SystemExit(1)"))

    result = wait_for_result(runner, spec, runner.start(spec))

    assert (result.state, result.retryable) == (RunState.FAILED, False)


@pytest.mark.parametrize("code", [126, 127])
def test_exit_codes_126_and_127_are_not_retryable(runner: SubprocessRunner, code: int) -> None:
    spec = make_spec(runner, python(f"raise SystemExit({code})"))

    result = wait_for_result(runner, spec, runner.start(spec))

    assert result.state is RunState.FAILED
    assert result.error == f"exited with code {code}"
    assert result.retryable is False


def test_missing_executable_fails_at_start_without_retry(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, allowed_executables=["no-such-program-tms"])
    spec = make_spec(runner, {"command": ["no-such-program-tms"]})

    handle = runner.start(spec)

    assert handle.result is not None
    assert handle.result.state is RunState.FAILED
    assert "was not found" in handle.result.error
    assert handle.result.retryable is False
    assert launches(runner, spec, wait=False) == 0
    # A start that adopts the key reports the same failure instead of waiting for a launch.
    again = runner.start(spec)
    assert again.result == handle.result


def test_environment_is_scrubbed_and_carries_the_run_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_SECRET", "hunter2")
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/ssl/certs/ca.pem")
    runner = make_runner(tmp_path, inherit_env=["SSL_CERT_FILE"])
    spec = make_spec(
        runner,
        {**python("import json, os; print(json.dumps(dict(os.environ)))"), "env": {"GREETING": "hi"}},
        execution_id=41,
        attempt=2,
        callback_url="http://127.0.0.1:9/api/v1/callbacks/41",
        tracing_id="trace-1",
    )

    result = wait_for_result(runner, spec, runner.start(spec))

    env = json.loads(result.output)
    work = run_dir(runner, spec) / "work"
    assert "WORKER_SECRET" not in env
    assert env["GREETING"] == "hi"
    assert env["SSL_CERT_FILE"] == "/etc/ssl/certs/ca.pem"
    assert env["HOME"] == str(work)
    assert env["TMPDIR"] == str(work / "tmp")
    assert env["TMS_EXECUTION_ID"] == "41"
    assert env["TMS_ATTEMPT"] == "2"
    assert env["TMS_IDEMPOTENCY_KEY"] == "tms-41-2"
    assert env["TMS_CALLBACK_URL"] == "http://127.0.0.1:9/api/v1/callbacks/41"
    assert env["TMS_TRACING_ID"] == "trace-1"
    # PWD: bubblewrap sets it to the working directory.
    assert set(env) <= {"PATH", "LANG", "HOME", "TMPDIR", "GREETING", "SSL_CERT_FILE", "LC_CTYPE", "PWD"} | {
        name for name in env if name.startswith("TMS_")
    }


def test_cwd_is_created_inside_the_work_folder(runner: SubprocessRunner) -> None:
    spec = make_spec(runner, {**python("import os; print(os.getcwd())"), "cwd": "data/in"})

    result = wait_for_result(runner, spec, runner.start(spec))

    assert result.output.strip() == str(run_dir(runner, spec) / "work" / "data" / "in")


def test_uploaded_artifact_is_copied_made_executable_and_run_with_args(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, allow_artifacts=True)
    upload = tmp_path / "media" / "report.sh"
    upload.parent.mkdir()
    upload.write_text('#!/bin/sh\necho "artifact got $1 in $PWD"\n')
    upload.chmod(0o644)  # uploads are not executable; the runner's copy is
    spec = make_spec(runner, {"artifact": True, "args": ["--fast"]}, artifact_path=str(upload))

    result = wait_for_result(runner, spec, runner.start(spec))

    work = run_dir(runner, spec) / "work"
    assert result.state is RunState.SUCCEEDED
    assert result.output == f"artifact got --fast in {work}\n"
    # The copy is in the run's bin/ (the worker's, read-only to the run user), checked against the upload.
    assert os.access(run_dir(runner, spec) / "bin" / "report.sh", os.X_OK)
    assert not os.access(upload, os.X_OK)


def test_artifact_config_without_an_upload_fails_without_retry(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, allow_artifacts=True)
    spec = make_spec(runner, {"artifact": True})

    handle = runner.start(spec)

    assert handle.result is not None
    assert (handle.result.state, handle.result.retryable) == (RunState.FAILED, False)
    assert "no uploaded artifact" in handle.result.error


# --------------------------------------------------------------------------------------------
# Timeouts and cancellation
# --------------------------------------------------------------------------------------------

# Starts a grandchild in the same process group, prints both pids, then waits for a long time.
_FAMILY = (
    "import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print(child.pid, flush=True); time.sleep(60)"
)


def _grandchild_pid(runner: SubprocessRunner, spec: RunSpec) -> int:
    stdout = run_dir(runner, spec) / "stdout"
    deadline = time.monotonic() + 5
    while not stdout.read_text().strip():
        assert time.monotonic() < deadline, "the command never printed its child's pid"
        time.sleep(0.02)
    return int(stdout.read_text().split()[0])


@pytest.fixture
def user_runner(tmp_path: Path) -> SubprocessRunner:
    """A runner in ``user`` mode: the run's pids are the host's (bubblewrap gives it a PID namespace)."""
    return make_runner(tmp_path, sandbox="user")


def test_timeout_backstop_kills_the_whole_process_group(user_runner: SubprocessRunner) -> None:
    runner = user_runner
    spec = make_spec(runner, python(_FAMILY), timeout=1.0)
    handle = runner.start(spec)
    pid = command_pid(runner, spec)
    grandchild = _grandchild_pid(runner, spec)

    result = wait_for_result(runner, spec, handle, seconds=10)

    assert result.state is RunState.FAILED
    assert result.error.startswith("timed out after 1s")
    assert result.retryable is True
    assert wait_gone(pid) and wait_gone(grandchild)


def test_cancel_terminates_the_process_group(user_runner: SubprocessRunner) -> None:
    runner = user_runner
    spec = make_spec(runner, python(_FAMILY))
    handle = runner.start(spec)
    pid = command_pid(runner, spec)
    grandchild = _grandchild_pid(runner, spec)

    runner.cancel(spec, handle)

    assert gone(pid) and wait_gone(grandchild)
    result = runner.poll(spec, handle)
    assert result.state is RunState.FAILED
    assert result.error == "cancelled"


def test_cancel_escalates_to_sigkill_when_sigterm_is_ignored(runner: SubprocessRunner) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    spec = make_spec(runner, python(code))
    handle = runner.start(spec)
    pid = command_pid(runner, spec)
    wait_for_file(run_dir(runner, spec) / "stdout")
    while "ready" not in (run_dir(runner, spec) / "stdout").read_text():
        time.sleep(0.02)

    started = time.monotonic()
    runner.cancel(spec, handle)

    assert gone(pid)
    assert 0.4 <= time.monotonic() - started < 4
    assert runner.poll(spec, handle).error == "cancelled"


def test_cancel_of_a_finished_run_changes_nothing(runner: SubprocessRunner) -> None:
    spec = make_spec(runner, {"command": ["true"]})
    handle = runner.start(spec)
    assert wait_for_result(runner, spec, handle).state is RunState.SUCCEEDED

    runner.cancel(spec, handle)

    assert runner.poll(spec, handle).state is RunState.SUCCEEDED


def test_a_pid_file_whose_number_leads_another_group_now_signals_nobody() -> None:
    # With pid_max at 32,768 a finished run's number comes round again; the group it leads then
    # (another run's supervisor, say) is not the run's to kill.
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        started = process_started(other.pid)
        assert started is not None
        signal_group({"pid": other.pid, "pgid": other.pid, "start": started - 1}, signal.SIGKILL)
        with pytest.raises(subprocess.TimeoutExpired):
            other.wait(timeout=0.3)
        signal_group({"pid": other.pid, "pgid": other.pid, "start": started}, signal.SIGKILL)
        assert other.wait(timeout=5) == -signal.SIGKILL
    finally:
        other.kill()
        other.wait()


# --------------------------------------------------------------------------------------------
# Idempotency and recovery
# --------------------------------------------------------------------------------------------


def test_repeated_start_with_the_same_key_adopts_the_one_launch(runner: SubprocessRunner) -> None:
    spec = make_spec(runner, python("import time; time.sleep(0.5); print('once')"))

    first = runner.start(spec)
    second = runner.start(spec)
    third = runner.start(spec)

    assert first == second == third
    assert wait_for_result(runner, spec, second).output == "once\n"
    assert launches(runner, spec) == 1
    # After the run ended, a start still adopts it, and reports its outcome at once.
    late = runner.start(spec)
    assert late.external_run_id == first.external_run_id
    assert late.result is not None and late.result.output == "once\n"
    assert launches(runner, spec) == 1


def _start_in_child(runner: SubprocessRunner, spec: RunSpec, gate: Any, queue: Any) -> None:
    gate.wait()
    handle = runner.start(spec)
    queue.put((handle.external_run_id, dict(handle.data)))


def test_concurrent_starts_in_several_processes_launch_once(runner: SubprocessRunner) -> None:
    spec = make_spec(runner, python("import time; time.sleep(0.5)"))
    ctx = multiprocessing.get_context("fork")
    gate, queue = ctx.Event(), ctx.Queue()
    children = [ctx.Process(target=_start_in_child, args=(runner, spec, gate, queue)) for _ in range(4)]
    for child in children:
        child.start()
    gate.set()
    stored = [queue.get(timeout=10) for _ in children]
    for child in children:
        child.join(timeout=10)

    assert len({run_id for run_id, _ in stored}) == 1
    assert launches(runner, spec) == 1
    handle = RunHandle(*stored[0])
    assert wait_for_result(runner, spec, handle).state is RunState.SUCCEEDED


def _start_then_hang(runner: SubprocessRunner, spec: RunSpec, queue: Any) -> None:
    handle = runner.start(spec)
    queue.put({"external_run_id": handle.external_run_id, "data": dict(handle.data), "pid": os.getpid()})
    time.sleep(60)


def test_run_started_by_a_sigkilled_worker_is_polled_to_completion_elsewhere(runner: SubprocessRunner) -> None:
    spec = make_spec(runner, python("import time; time.sleep(1); print('survived')"))
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    starter = ctx.Process(target=_start_then_hang, args=(runner, spec, queue))
    starter.start()
    stored = queue.get(timeout=10)  # what the worker would have written to the database
    os.kill(starter.pid, signal.SIGKILL)
    starter.join(timeout=5)
    assert starter.exitcode == -signal.SIGKILL

    # A fresh runner instance in this process stands in for another worker.
    other_worker = make_runner(Path(runner.work_dir).parent)
    handle = RunHandle(stored["external_run_id"], stored["data"])
    assert other_worker.poll(spec, handle).state is RunState.RUNNING
    result = wait_for_result(other_worker, spec, handle)

    assert result.state is RunState.SUCCEEDED
    assert result.output == "survived\n"
    assert launches(runner, spec) == 1
    marker = json.loads((run_dir(runner, spec) / "launch").read_text())
    assert marker["launcher_pid"] == stored["pid"] != os.getpid()
    # A redelivered message would start again: it adopts the finished run.
    assert other_worker.start(spec).result == result
    assert launches(runner, spec) == 1


def test_run_whose_processes_vanished_fails_retryably(runner: SubprocessRunner) -> None:
    spec = make_spec(runner, python("import time; time.sleep(60)"))
    handle = runner.start(spec)
    folder = run_dir(runner, spec)
    pid = command_pid(runner, spec)
    supervisor = json.loads((folder / "supervisor.pid").read_text())["pid"]

    os.kill(supervisor, signal.SIGKILL)  # nobody is left to write the exit file
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(supervisor) and wait_gone(pid)

    result = runner.poll(spec, handle)
    assert result.state is RunState.FAILED
    assert result.error.startswith("process vanished")
    assert result.retryable is True


def test_launch_marker_without_a_supervisor_is_lost_after_the_grace_period(tmp_path: Path) -> None:
    patient = make_runner(tmp_path, launch_grace_seconds=60)
    impatient = make_runner(tmp_path, launch_grace_seconds=0)
    spec = make_spec(patient, {"command": ["true"]})
    folder = run_dir(patient, spec)
    folder.mkdir(parents=True)
    (folder / "launch").write_text("{}")  # a launcher that died right after winning the marker

    handle = patient.start(spec)  # adopts, launches nothing

    assert patient.poll(spec, handle).state is RunState.RUNNING
    assert impatient.poll(spec, handle).state is RunState.FAILED
    assert launches(patient, spec, wait=False) == 0


def test_poll_from_another_host_is_refused(runner: SubprocessRunner) -> None:
    spec = make_spec(runner, {"command": ["true"]})
    handle = runner.start(spec)

    with pytest.raises(RunnerError, match="lives on host 'elsewhere'"):
        runner.poll(spec, RunHandle(handle.external_run_id, {**handle.data, "host": "elsewhere"}))


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def validation_errors(runner: SubprocessRunner, config: Any) -> Any:
    with pytest.raises(serializers.ValidationError) as caught:
        runner.validate_config(config)
    return caught.value.detail


def test_executable_not_on_the_allow_list_is_a_command_error(runner: SubprocessRunner) -> None:
    errors = validation_errors(runner, {"command": ["/bin/rm", "-rf", "/"]})

    assert list(errors) == ["command"]
    assert "not an allowed executable" in str(errors["command"][0])


@pytest.mark.parametrize("program", ["rm", "./echo", "bin/echo", "/usr/bin/../bin/rm"])
def test_only_allow_listed_programs_pass(runner: SubprocessRunner, program: str) -> None:
    assert "command" in validation_errors(runner, {"command": [program]})


def test_allow_list_matches_names_and_their_resolved_paths(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, allowed_executables=["echo"], path="/usr/bin:/bin")
    resolved = runner._which("echo")

    assert runner.validate_config({"command": ["echo"]})["command"] == ["echo"]
    assert resolved is not None
    assert runner.validate_config({"command": [resolved]})["command"] == [resolved]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"command": []}, "command"),
        ({}, "command"),
        ({"command": ["echo"], "artifact": True}, "command"),
        ({"command": ["echo"], "cwd": "../escape"}, "cwd"),
        ({"command": ["echo"], "cwd": "/etc"}, "cwd"),
        ({"command": ["echo"], "env": {"LD_PRELOAD": "/tmp/evil.so"}}, "env"),
        ({"command": ["echo"], "env": {"TMS_ATTEMPT": "9"}}, "env"),
        ({"command": ["echo"], "env": {"BAD NAME": "x"}}, "env"),
        ({"command": ["echo"], "max_output_bytes": 0}, "max_output_bytes"),
        ({"command": ["echo"], "shell": True}, "shell"),
        ({"artifact": True}, "artifact"),
    ],
)
def test_bad_config_is_reported_per_field(runner: SubprocessRunner, config: dict[str, Any], field: str) -> None:
    assert field in validation_errors(runner, config)


def test_unknown_option_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match="unknown OPTIONS shell"):
        SubprocessRunner("local", {"shell": True})
    with pytest.raises(ImproperlyConfigured, match="allowed_executables"):
        make_runner(tmp_path, allowed_executables=["bin/echo"])


def test_run_folder_of_another_task_is_never_adopted(runner: SubprocessRunner) -> None:
    spec = make_spec(runner, {"command": ["true"]}, task_id="task-1")
    runner.start(spec)
    # The same key for another task: e.g. a work_dir left over from before a database reset.
    stranger = make_spec(runner, {"command": ["true"]}, execution_id=spec.execution_id, task_id="task-2")

    with pytest.raises(RunnerError, match="belongs to task task-1") as caught:
        runner.start(stranger)

    assert caught.value.retryable is False
    assert launches(runner, spec) == 1


def test_runner_loads_from_the_tms_runners_setting(tmp_path: Path) -> None:
    entry = {
        "BACKEND": "runners.subprocess.SubprocessRunner",
        "OPTIONS": {
            "allowed_executables": ["echo"],
            "work_dir": str(reachable_dir(tmp_path) / "runs"),
            "inline_wait_seconds": 2,
        },
    }
    with override_settings(TMS_RUNNERS={"subprocess": entry}):
        runner = get_runner("subprocess")
        spec = make_spec(runner, {"command": ["echo", "from settings"]})  # type: ignore[arg-type]
        handle = runner.start(spec)

    assert isinstance(runner, SubprocessRunner)
    assert handle.result is not None and handle.result.output == "from settings\n"


def test_default_work_dir_is_under_var_dir(settings: Any) -> None:
    assert SubprocessRunner("local").work_dir == Path(settings.VAR_DIR).absolute() / "runs"
