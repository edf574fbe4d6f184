"""The subprocess sandbox (issue 15, finding 1) against real child processes.

The three attacks of the audit, each run by a real command through the runner: reading the
worker's environment from ``/proc``, reading another task's ``run.json`` through ``$HOME/../..``,
and replacing a cached artifact that another task's next run executes. Each failed to be stopped
before run users and bubblewrap (the run shared the worker's user); each is stopped in both
sandbox modes here. Then the resource limits and the argument patterns.

The tests are written against the runner's public interface only, so the same file shows the
holes on a checkout without the sandbox.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework import serializers

from runners.base import RunSpec, RunState
from runners.subprocess import SubprocessRunner
from tests.runners.conftest import wait_for_file, wait_for_result

SECRET = "s3cr3t-worker-key-0b1d"
#: Modes a root worker on this host can use (bwrap only where bubblewrap is installed).
MODES = ["bwrap", "user"]
_ids = itertools.count(1000)


def _reachable(tmp_path: Path) -> Path:
    top = Path(tempfile.gettempdir()) / f"tms-test-sandbox-{os.getpid()}"
    top.mkdir(mode=0o711, exist_ok=True)
    top.chmod(0o711)
    folder = top / tmp_path.name
    folder.mkdir(mode=0o711, exist_ok=True)
    return folder


def make_runner(tmp_path: Path, mode: str, **options: Any) -> SubprocessRunner:
    options.setdefault("allowed_executables", ["/bin/sh", "/usr/bin/python3"])
    options.setdefault("work_dir", str(_reachable(tmp_path) / "runs"))
    options.setdefault("kill_grace_seconds", 0.5)
    if "sandbox" in SubprocessRunner.option_defaults:  # a checkout without the sandbox has no modes
        options["sandbox"] = mode
    return SubprocessRunner("local", options)


def make_spec(runner: SubprocessRunner, config: dict[str, Any], **fields: Any) -> RunSpec:
    fields.setdefault("execution_id", next(_ids))
    fields.setdefault("attempt", 1)
    fields.setdefault("task_id", "task-1")
    fields.setdefault("timeout", 30.0)
    return RunSpec(config=runner.validate_config(config), **fields)


def sh(script: str, **config: Any) -> dict[str, Any]:
    return {"command": ["/bin/sh", "-c", script], **config}


def run(runner: SubprocessRunner, config: dict[str, Any], **fields: Any):
    spec = make_spec(runner, config, **fields)
    return wait_for_result(runner, spec, runner.start(spec), seconds=30)


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    if request.param == "bwrap" and not Path("/usr/bin/bwrap").exists():
        pytest.fail("bubblewrap is not installed: apt-get install -y bubblewrap (make test installs it)")
    return request.param


# --------------------------------------------------------------------------------------------
# Attack (a): the worker's environment through /proc
# --------------------------------------------------------------------------------------------


def test_a_run_cannot_read_the_worker_environment_from_proc(tmp_path: Path, mode: str) -> None:
    # A process started the way the worker is (its secrets in its environment), as the worker's user.
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={"DJANGO_SECRET_KEY": SECRET, "PATH": "/usr/bin"}
    )
    try:
        runner = make_runner(tmp_path, mode)
        script = (
            f"cat /proc/{worker.pid}/environ; cat /proc/{os.getpid()}/environ; "
            "for f in /proc/[0-9]*/environ; do cat $f; done 2>/dev/null; echo done"
        )
        result = run(runner, sh(script))
    finally:
        worker.kill()
        worker.wait()
    assert SECRET not in result.output + result.error
    assert "DJANGO_SECRET_KEY" not in result.output + result.error


# --------------------------------------------------------------------------------------------
# Attack (b): another task's run.json through $HOME/../..
# --------------------------------------------------------------------------------------------


def test_a_run_cannot_read_another_runs_run_json(tmp_path: Path, mode: str) -> None:
    runner = make_runner(tmp_path, mode)
    victim = make_spec(runner, sh("sleep 20", env={"API_TOKEN": SECRET}), task_id="victim")
    handle = runner.start(victim)
    try:
        folder = runner.work_dir / victim.idempotency_key
        assert SECRET in (folder / "run.json").read_text()  # the secret is there, for the worker
        result = run(
            runner,
            sh(
                f'cat "$HOME/../../{victim.idempotency_key}/run.json"; '
                f'ls "$HOME/../../{victim.idempotency_key}/work"; cat "$HOME/../run.json"; '
                f'cat "$HOME/../../{victim.idempotency_key}/stdout"; echo end'
            ),
            task_id="attacker",
        )
    finally:
        runner.cancel(victim, handle)
    assert SECRET not in result.output + result.error
    assert "callback" not in result.output.lower()
    assert result.output.strip().endswith("end")


def test_run_json_and_control_files_are_the_workers_and_work_is_the_run_users(tmp_path: Path, mode: str) -> None:
    runner = make_runner(tmp_path, mode)
    spec = make_spec(runner, sh("id -u; sleep 5"))
    handle = runner.start(spec)
    try:
        folder = runner.work_dir / spec.idempotency_key
        # The command writes its uid after start() returned: wait for the whole line.
        stdout = wait_for_file(folder / "stdout", nonempty=True)
        run_uid = int(stdout.read_text().split()[0])
        assert run_uid not in (0, os.getuid())
        assert (folder / "run.json").stat().st_mode & 0o777 == 0o600
        assert (folder / "run.json").stat().st_uid == os.getuid()
        assert (folder / "work").stat().st_uid == run_uid
        assert (folder / "work").stat().st_mode & 0o777 == 0o700
        assert folder.stat().st_mode & 0o777 == 0o711
    finally:
        runner.cancel(spec, handle)
    # Over: the folder is closed to the run user, which goes to another run next.
    deadline = time.monotonic() + 5
    while folder.stat().st_mode & 0o777 != 0o700 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert folder.stat().st_mode & 0o777 == 0o700


# --------------------------------------------------------------------------------------------
# Attack (c): replacing a cached artifact that another task runs next
# --------------------------------------------------------------------------------------------

ARTIFACT = b"#!/bin/sh\necho hello from the artifact\n"
EVIL = b"#!/bin/sh\necho PWNED\n"


@pytest.fixture
def artifact_settings(settings: Any, tmp_path: Path) -> Any:
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.TMS_ARTIFACT_CACHE_DIR = str(_reachable(tmp_path) / "artifact-cache")
    return settings


def _artifact_task(owner: Any) -> Any:
    from tasks_api.creation import task_create
    from tasks_app.artifacts import artifact_create

    artifact = artifact_create(owner=owner, upload=SimpleUploadedFile("hello.sh", ARTIFACT))
    return task_create(owner=owner, runner="subprocess", config={"artifact": True}, artifact=artifact)


def _run_task(task: Any, runner: SubprocessRunner) -> Any:
    from executions.runs import run_spec
    from tests.factories import ExecutionFactory

    execution = ExecutionFactory(task=task)
    spec = run_spec(execution, task, starting=True)
    return wait_for_result(runner, spec, runner.start(spec), seconds=30)


@pytest.mark.django_db
def test_a_run_cannot_replace_a_cached_artifact_that_another_task_runs(
    tmp_path: Path, mode: str, artifact_settings: Any
) -> None:
    from tests.factories import UserFactory

    runner = make_runner(tmp_path, mode, allow_artifacts=True)
    victim = _artifact_task(UserFactory())
    assert _run_task(victim, runner).output == "hello from the artifact\n"  # cached now
    cached = Path(settings.TMS_ARTIFACT_CACHE_DIR) / victim.artifact.sha256

    # Another tenant's run tries to replace the cached file (path and content in its environment).
    attack = run(
        runner,
        sh(
            'chmod 700 "$TARGET"; printf "$EVIL" > "$TARGET"; rm -f "$TARGET"; printf "$EVIL" > "$TARGET"; echo tried',
            env={"TARGET": str(cached), "EVIL": EVIL.decode().replace("\n", "\\n")},
        ),
    )
    assert "tried" in attack.output

    result = _run_task(victim, runner)
    assert result.state is RunState.SUCCEEDED, result.error
    assert result.output == "hello from the artifact\n"
    assert "PWNED" not in result.output


@pytest.mark.django_db
def test_a_replaced_cache_file_is_fetched_again_not_run(tmp_path: Path, artifact_settings: Any) -> None:
    from tests.factories import UserFactory

    runner = make_runner(tmp_path, "user", allow_artifacts=True)
    victim = _artifact_task(UserFactory())
    _run_task(victim, runner)
    cached = Path(settings.TMS_ARTIFACT_CACHE_DIR) / victim.artifact.sha256
    # Whoever managed to write there (the worker's own user, say): a hit is re-hashed.
    cached.chmod(0o700)
    cached.write_bytes(EVIL)

    result = _run_task(victim, runner)
    assert result.output == "hello from the artifact\n"
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == victim.artifact.sha256
    assert Path(settings.TMS_ARTIFACT_CACHE_DIR).stat().st_mode & 0o777 == 0o700


# --------------------------------------------------------------------------------------------
# Processes left behind, limits
# --------------------------------------------------------------------------------------------


def _pids() -> set[str]:
    return {path.name for path in Path("/proc").glob("[0-9]*")}


def _processes_of(uid: int, *, besides: set[str]) -> list[str]:
    """Every process of ``uid`` not in ``besides`` (what ran before the test: a run user's
    zombie that a killed supervisor left to PID 1 elsewhere in the suite), zombies included: a
    zombie still counts against the user's RLIMIT_NPROC (the next run's ``processes`` limit)
    until somebody reaps it."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/status"):
        if stat.parent.name in besides:
            continue
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if str(uid) in fields.get("Uid", "").split() and not fields.get("State", "").strip().startswith("X"):
            found.append(f"{stat.parent.name}: {text.splitlines()[0]} {fields['State'].strip()}")
    return found


def test_nothing_the_run_started_survives_it_even_outside_its_group(tmp_path: Path, mode: str) -> None:
    runner = make_runner(tmp_path, mode)
    code = (
        "import os, subprocess, time; "
        "subprocess.Popen(['/usr/bin/python3', '-c', 'import time; time.sleep(60)'], start_new_session=True); "
        "print(os.getuid(), flush=True)"
    )
    before = _pids()
    result = run(runner, {"command": ["/usr/bin/python3", "-c", code]})
    assert result.state is RunState.SUCCEEDED, (result.state, result.error, result.output)
    uid = int(result.output.split()[0])
    # Not even as zombies: the supervisor reaps what it killed before it reports the end (a
    # container's PID 1 may never reap them).
    assert _processes_of(uid, besides=before) == []


def test_orphans_of_one_run_do_not_eat_the_next_runs_process_limit(tmp_path: Path, mode: str) -> None:
    """Found in CI: zombies of a run's killed orphans, left to a PID 1 that reaps late, counted
    against the run user's RLIMIT_NPROC, and the next run on that user could not fork."""
    runner = make_runner(tmp_path, mode)
    orphans = (
        "import os, subprocess; "
        "[subprocess.Popen(['/bin/sh', '-c', 'sleep 60'], start_new_session=True) for _ in range(12)]; "
        "print(os.getuid(), flush=True)"
    )
    before = _pids()
    first = run(runner, {"command": ["/usr/bin/python3", "-c", orphans]})
    assert first.state is RunState.SUCCEEDED, (first.state, first.error)
    assert _processes_of(int(first.output.split()[0]), besides=before) == []
    # The next run (the same run user, unless another test holds it) has its whole limit: 12
    # sleeps beside itself and bwrap's two, where the first run's zombies would be 26.
    forks = (
        "import subprocess; "
        "procs = [subprocess.Popen(['/bin/sleep', '0.2']) for _ in range(12)]; "
        "print(sum(p.wait() == 0 for p in procs), flush=True)"
    )
    second = run(runner, {"command": ["/usr/bin/python3", "-c", forks], "limits": {"processes": 20}})
    assert (second.state, second.output) == (RunState.SUCCEEDED, "12\n"), second.error


def test_cpu_time_limit_ends_the_run_with_a_clear_reason(tmp_path: Path, mode: str) -> None:
    runner = make_runner(tmp_path, mode)
    result = run(runner, {"command": ["/usr/bin/python3", "-c", "while True: pass"], "limits": {"cpu_seconds": 1}})
    assert result.state is RunState.FAILED
    assert result.error.startswith("killed: CPU time limit of 1 s reached")


def test_file_size_limit_caps_output_while_it_is_written(tmp_path: Path, mode: str) -> None:
    runner = make_runner(tmp_path, mode)
    code = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    spec = make_spec(runner, {"command": ["/usr/bin/python3", "-c", code], "limits": {"file_bytes": 200_000}})
    result = wait_for_result(runner, spec, runner.start(spec), seconds=30)
    assert result.state is RunState.FAILED
    assert result.error.startswith("output exceeded 200000 bytes")
    # Capped on the disk, not only when read back.
    assert (runner.work_dir / spec.idempotency_key / "stdout").stat().st_size <= 200_000


def test_limits_above_the_operator_maxima_are_refused_at_save(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, "user", max_limits={"cpu_seconds": 60}, limits={"cpu_seconds": 30})
    with pytest.raises(serializers.ValidationError) as refused:
        runner.validate_config(sh("true", limits={"cpu_seconds": 61}))
    assert "limits" in refused.value.detail  # type: ignore[operator]
    with pytest.raises(serializers.ValidationError):
        runner.validate_config(sh("true", limits={"wall_seconds": 1}))
    assert runner.validate_config(sh("true", limits={"cpu_seconds": 60}))["limits"] == {"cpu_seconds": 60}


# --------------------------------------------------------------------------------------------
# Argument patterns
# --------------------------------------------------------------------------------------------


def test_argument_patterns_pin_what_an_allowed_interpreter_may_run(tmp_path: Path) -> None:
    jobs = _reachable(tmp_path) / "jobs"
    jobs.mkdir(mode=0o755, exist_ok=True)
    (jobs / "report.py").write_text("print('report ran')\n")
    (jobs / "report.py").chmod(0o644)
    pattern = "^" + str(jobs).replace(".", r"\.") + r"/[a-z_]+\.py$"
    runner = make_runner(tmp_path, "user", allowed_executables={"/usr/bin/python3": [pattern], "/bin/sh": None})

    assert run(runner, {"command": ["/usr/bin/python3", str(jobs / "report.py")]}).output == "report ran\n"
    with pytest.raises(serializers.ValidationError) as refused:
        runner.validate_config({"command": ["/usr/bin/python3", "-c", "print(1)"]})
    assert "command" in refused.value.detail  # type: ignore[operator]
    with pytest.raises(serializers.ValidationError) as refused:
        runner.validate_config({"command": ["/usr/bin/python3", str(jobs / "report.py")], "args": ["-x"]})
    assert "args" in refused.value.detail  # type: ignore[operator]
    # Checked again at start: a config saved before the pattern was pinned does not run.
    spec = RunSpec(
        execution_id=next(_ids), attempt=1, task_id="t", timeout=10.0,
        config={"command": ["/usr/bin/python3", "-c", "print('no')"], "args": [], "env": {}, "limits": {}},
    )  # fmt: skip
    result = wait_for_result(runner, spec, runner.start(spec))
    assert result.state is RunState.FAILED and "not allowed" in result.error and result.retryable is False


def test_bad_argument_patterns_are_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match="bad pattern"):
        make_runner(tmp_path, "user", allowed_executables={"/usr/bin/python3": ["(unclosed"]})


# --------------------------------------------------------------------------------------------
# Modes
# --------------------------------------------------------------------------------------------


def test_an_unprivileged_worker_refuses_to_run_unless_unsandboxed_is_chosen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runners import sandbox

    monkeypatch.setattr(sandbox, "privileged", lambda: False)
    runner = make_runner(tmp_path, "auto")
    spec = make_spec(runner, sh("echo hi"))
    with pytest.raises(Exception, match="CAP_SETUID") as refused:
        runner.start(spec)
    assert getattr(refused.value, "retryable", True) is False
    assert not (runner.work_dir / spec.idempotency_key).exists()
    for mode in ("bwrap", "user"):
        with pytest.raises(ImproperlyConfigured, match="root"):
            sandbox.resolve_mode(mode)
    assert run(make_runner(tmp_path, "none"), sh("echo unsandboxed")).output == "unsandboxed\n"


def test_old_run_folders_are_pruned_but_never_a_running_one(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, "user")
    done = make_spec(runner, sh("echo done"))
    wait_for_result(runner, done, runner.start(done))
    live = make_spec(runner, sh("sleep 20"))
    handle = runner.start(live)
    wait_for_file(runner.work_dir / live.idempotency_key / "pid")
    try:
        old = time.time() - 3600
        for spec in (done, live):
            for name in ("exit", "launch"):
                path = runner.work_dir / spec.idempotency_key / name
                if path.exists():
                    os.utime(path, (old, old))
        assert runner.prune_runs(retention=60) == 1
        assert not (runner.work_dir / done.idempotency_key).exists()
        assert (runner.work_dir / live.idempotency_key / "run.json").exists()
    finally:
        runner.cancel(live, handle)
    # cancel() waits a moment for the supervisor's exit file; on a loaded machine it may come later.
    exit_file = wait_for_file(runner.work_dir / live.idempotency_key / "exit")
    assert json.loads(exit_file.read_text())["cancelled"] is True


# --------------------------------------------------------------------------------------------
# Disk and the limits a task may ask for (issue 27, finding 7)
# --------------------------------------------------------------------------------------------

MiB = 1024**2


def test_a_task_cannot_raise_its_limits_unless_the_operator_set_maxima(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, "user")
    # What the audit did: 4 GiB per file, 1024 processes, asked by the task alone.
    for name, value in (("file_bytes", 4 * 1024**3), ("processes", 1024), ("disk_bytes", 10 * 1024**3)):
        with pytest.raises(serializers.ValidationError) as refused:
            runner.validate_config(sh("true", limits={name: value}))
        assert list(refused.value.detail) == ["limits"]  # type: ignore[arg-type]
        assert name in str(refused.value.detail["limits"])  # type: ignore[index, call-overload]
    # Lower is always fine; the defaults are the maxima.
    assert runner.validate_config(sh("true", limits={"processes": 8, "file_bytes": MiB}))["limits"] == {
        "processes": 8,
        "file_bytes": MiB,
    }
    assert runner.max_limits == runner.limits
    assert runner.limits["disk_bytes"] == 256 * MiB and runner.limits["tmp_bytes"] == 64 * MiB
    # The operator opens more, within the ceilings.
    raised = make_runner(tmp_path, "user", max_limits={"processes": 256})
    assert raised.validate_config(sh("true", limits={"processes": 256}))["limits"] == {"processes": 256}
    assert raised.limits["processes"] == 64


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"limits": {"processes": 100}, "max_limits": {"processes": 50}}, r"limits\['processes'\] 100 is above"),
        ({"max_limits": {"file_bytes": 5 * 1024**3}}, r"max_limits\['file_bytes'\] must be a whole number from 1"),
        ({"limits": {"disk_bytes": 0}}, r"limits\['disk_bytes'\] must be"),
        ({"limits": {"wall_seconds": 1}}, "must be a dict with keys among"),
    ],
)
def test_bad_limits_are_a_configuration_error(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        make_runner(tmp_path, "user", **options)


def test_an_operator_maximum_below_a_default_lowers_the_default(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, "user", max_limits={"processes": 16})
    assert runner.limits["processes"] == 16 and runner.max_limits["processes"] == 16


@pytest.mark.django_db
def test_the_api_answers_400_on_config_limits_above_the_maxima(api_client: Any, settings: Any) -> None:
    settings.TMS_RUNNERS = {
        **settings.TMS_RUNNERS,
        "subprocess": {
            "BACKEND": "runners.subprocess.SubprocessRunner",
            "OPTIONS": {"allowed_executables": ["/bin/true"], "sandbox": "user"},
        },
    }
    payload = {"name": "greedy", "runner": "subprocess", "config": {"command": ["/bin/true"]}}
    big = {**payload, "config": {"command": ["/bin/true"], "limits": {"file_bytes": 4 * 1024**3, "processes": 1024}}}
    response = api_client.post("/api/v1/tasks", big, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {
        "config": {
            "limits": [
                "file_bytes may be at most 67108864 on the 'subprocess' runner.",
                "processes may be at most 64 on the 'subprocess' runner.",
            ]
        }
    }
    assert api_client.post("/api/v1/tasks", payload, format="json").status_code == 201


def test_the_work_folder_is_bounded_even_when_written_between_two_measures(tmp_path: Path, mode: str) -> None:
    runner = make_runner(tmp_path, mode, limits={"disk_bytes": 2 * MiB})
    script = 'for i in 1 2 3; do head -c 1048576 /dev/zero > "$HOME/f$i"; done; echo written'
    spec = make_spec(runner, sh(script))
    result = wait_for_result(runner, spec, runner.start(spec), seconds=30)
    assert result.state is RunState.FAILED
    assert result.error.startswith("disk limit exceeded: the work folder held"), result.error
    assert "disk_bytes 2097152" in result.error
    work = runner.work_dir / spec.idempotency_key / "work"
    assert sum(path.stat().st_size for path in work.rglob("*") if path.is_file()) == 0


def test_a_run_that_keeps_writing_is_killed_at_its_disk_limit(tmp_path: Path, mode: str) -> None:
    runner = make_runner(tmp_path, mode, limits={"disk_bytes": 4 * MiB})
    script = 'i=0; while true; do i=$((i+1)); head -c 262144 /dev/zero > "$TMPDIR/f$i"; sleep 0.02; done'
    spec = make_spec(runner, sh(script), timeout=60.0)
    began = time.monotonic()
    result = wait_for_result(runner, spec, runner.start(spec), seconds=30)
    assert result.state is RunState.FAILED
    assert result.error.startswith("disk limit exceeded"), result.error
    assert time.monotonic() - began < 10  # measured while it ran, not at its 60 s timeout


def test_private_tmp_and_dev_shm_are_size_limited_and_dev_and_run_read_only(tmp_path: Path) -> None:
    if not Path("/usr/bin/bwrap").exists():
        pytest.fail("bubblewrap is not installed: apt-get install -y bubblewrap (make test installs it)")
    runner = make_runner(tmp_path, "bwrap", limits={"tmp_bytes": MiB})
    code = (
        "import os\n"
        "for folder in ('/tmp', '/dev/shm', '/run', '/dev'):\n"
        "    try:\n"
        "        with open(folder + '/big', 'wb') as fh:\n"
        "            fh.write(b'x' * (2 * 1048576))\n"
        "        print(folder, 'wrote', os.path.getsize(folder + '/big'))\n"
        "    except OSError as exc:\n"
        "        print(folder, exc.strerror)\n"
        "st = os.statvfs('/tmp'); print('size', st.f_blocks * st.f_frsize)\n"
    )
    result = run(runner, {"command": ["/usr/bin/python3", "-c", code]})
    assert result.output.splitlines() == [
        "/tmp No space left on device",
        "/dev/shm No space left on device",
        "/run Read-only file system",
        "/dev Read-only file system",
        f"size {MiB}",
    ], result.output + result.error
    default = run(
        make_runner(tmp_path, "bwrap"),
        {"command": ["/usr/bin/python3", "-c", code.split("\n", 1)[0] + "\n" + code.rsplit("\n", 2)[1]]},
    )
    assert default.output == f"size {64 * MiB}\n"


def test_in_user_mode_what_a_run_leaves_in_the_hosts_tmp_goes_with_it(tmp_path: Path) -> None:
    # Its uid goes to another task's run next, which could read it otherwise.
    runner = make_runner(tmp_path, "user")
    name = f"tms-test-left-{os.getpid()}-{next(_ids)}"
    script = f"echo secret > /tmp/{name}; mkdir /var/tmp/{name}; echo secret > /var/tmp/{name}/f; echo done"
    result = run(runner, sh(script))
    assert result.state is RunState.SUCCEEDED and result.output == "done\n", result.error
    assert not Path(f"/tmp/{name}").exists() and not Path(f"/var/tmp/{name}").exists()


def test_in_user_mode_a_runs_files_in_the_hosts_tmp_count_against_tmp_bytes(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, "user", limits={"tmp_bytes": MiB})
    name = f"tms-test-big-{os.getpid()}-{next(_ids)}"
    result = run(runner, sh(f"head -c 2097152 /dev/zero > /tmp/{name}; echo written"))
    assert result.state is RunState.FAILED
    assert result.error.startswith("tmp limit exceeded: the run's files in /tmp, /var/tmp, /dev/shm held"), result.error
    assert not Path(f"/tmp/{name}").exists()
