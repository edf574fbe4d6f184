"""The ``subprocess`` runner: runs an allow-listed local command, or the task's uploaded artifact.

No shell is ever involved: the config names an argv list (``command`` + ``args``), and the
executable must be on the operator's ``allowed_executables`` list, which is checked when the task
is saved (a per-field error on ``command``) and again when the attempt starts. Alternatively
``"artifact": true`` runs the task's uploaded binary or script, if the operator enabled
``allow_artifacts``.

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

The command does not run as a child of the worker. ``start`` spawns a small stdlib-only
supervisor (:mod:`runners.supervisor`, run as ``python -I runners/supervisor.py <run folder>``)
that double-forks and calls ``setsid()``, so it is adopted by init and outlives the worker, even a
worker killed with SIGKILL. The supervisor starts the command in a process group of its own, waits
for it, enforces ``spec.timeout`` as a backstop (SIGTERM to the group, SIGKILL after
``kill_grace_seconds``), and writes the ``exit`` file. Any worker process on
the same host can therefore poll or cancel the run from the folder alone. Liveness checks compare
the process start time from ``/proc`` with the one recorded at launch, so a recycled pid is never
mistaken for the run.

Limits, on purpose: the command runs as the worker's user, with a scrubbed environment, in its own
folder; it is not a sandbox (use the kubernetes runner for isolation). Its output files are only
bounded when read back. Runs are local to one host: a poll from another host fails the attempt
(retryably), so route subprocess tasks to workers of one host, or to a queue per host. Run folders
are kept after the run (for the output and for adoption); a retention job should prune old ones.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

from runners import supervisor
from runners.base import MAX_OUTPUT_BYTES_LIMIT, BaseRunner, RunHandle, RunnerError, RunResult, RunSpec
from runners.supervisor import (
    CANCEL,
    EXIT,
    NOT_EXECUTABLE,
    NOT_FOUND,
    PID,
    RUN,
    STDERR,
    STDOUT,
    SUPERVISOR_PID,
)

logger = logging.getLogger(__name__)

#: Environment variables the runner sets itself (a task may not override them).
_RESERVED_ENV_PREFIX = "TMS_"
#: Variables that make the dynamic loader inject code into any allowed executable.
_LOADER_ENV_PREFIXES = ("LD_", "DYLD_")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# File names inside a run folder, besides those the supervisor writes (imported from it).
LAUNCH, SUPERVISOR_LOG, WORK = "launch", "supervisor.log", "work"
#: The supervisor program, run by path: see :mod:`runners.supervisor`.
SUPERVISOR = str(Path(supervisor.__file__).resolve())


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


class SubprocessConfigSerializer(serializers.Serializer):
    command = serializers.ListField(
        child=serializers.CharField(trim_whitespace=False),
        min_length=1,
        required=False,
        help_text='argv list, e.g. ["/usr/bin/python3", "job.py"]; no shell. The executable must be allow-listed.',
    )
    artifact = serializers.BooleanField(
        default=False, help_text="Run the task's uploaded artifact (binary or script) instead of a command."
    )
    args = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        default=list,
        help_text="Arguments appended to the command (or passed to the artifact).",
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        default=dict,
        help_text="Extra environment variables, on top of a scrubbed base environment.",
    )
    cwd = serializers.CharField(
        required=False,
        help_text="Working directory, relative to the attempt's own work folder (created if missing).",
    )
    max_output_bytes = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_OUTPUT_BYTES_LIMIT,
        help_text="How much of the end of stdout (and stderr, for errors) is kept.",
    )

    def validate_command(self, value: list[str]) -> list[str]:
        if any("\0" in part for part in value):
            raise serializers.ValidationError("Arguments may not contain NUL characters.")
        return value

    def validate_args(self, value: list[str]) -> list[str]:
        return self.validate_command(value)

    def validate_env(self, value: dict[str, str]) -> dict[str, str]:
        errors = []
        for name, text in value.items():
            if not _ENV_NAME.match(name):
                errors.append(f"{name!r} is not a valid variable name.")
            elif name.upper().startswith(_RESERVED_ENV_PREFIX):
                errors.append(f"{name!r}: names starting with {_RESERVED_ENV_PREFIX} are set by TMS.")
            elif name.upper().startswith(_LOADER_ENV_PREFIXES):
                errors.append(f"{name!r}: dynamic loader variables are not allowed.")
            elif "\0" in text:
                errors.append(f"{name!r}: values may not contain NUL characters.")
        if errors:
            raise serializers.ValidationError(errors)
        return value

    def validate_cwd(self, value: str) -> str:
        path = PurePosixPath(value)
        if "\0" in value or path.is_absolute() or ".." in path.parts:
            raise serializers.ValidationError("Must be a relative path inside the work folder, without '..'.")
        return str(path)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("artifact") and attrs.get("command"):
            raise serializers.ValidationError({"command": ["Give a command or set artifact, not both."]})
        if not attrs.get("artifact") and not attrs.get("command"):
            raise serializers.ValidationError(
                {"command": ["This field is required, unless artifact is true (run the task's upload)."]}
            )
        return attrs


# --------------------------------------------------------------------------------------------
# Reading a run folder
# --------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: Mapping[str, Any], *, mode: int = 0o600) -> None:
    """Write ``data`` so that readers see either nothing or the whole document."""
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _tail(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of a file as text, saying how much was left out."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - limit))
            data = fh.read(limit)
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if size > limit:
        return f"[... {size - limit} earlier bytes omitted]\n{text}"
    return text


def _process_started(pid: int) -> int | None:
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


def _alive(info: Mapping[str, Any] | None) -> bool:
    """Whether the process recorded in ``info`` still runs (and its pid was not recycled)."""
    if not info or not isinstance(info.get("pid"), int):
        return False
    pid = info["pid"]
    try:
        started = _process_started(pid)
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return started is not None and (info.get("start") is None or started == info["start"])


def _signal_group(info: Mapping[str, Any] | None, sig: int) -> None:
    if not info or not isinstance(info.get("pgid"), int) or info["pgid"] <= 1:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(info["pgid"], sig)


# --------------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------------


class SubprocessRunner(BaseRunner):
    """Runs an allow-listed command or the task's artifact as a detached local process.

    See the module docstring for the run folder, the supervisor and what is (not) guaranteed.
    """

    option_defaults: ClassVar[dict[str, Any]] = {
        #: Absolute paths, or names looked up on ``path``, that tasks may run. Empty: no command.
        "allowed_executables": [],
        #: Whether tasks may run their uploaded artifact.
        "allow_artifacts": False,
        #: Folder holding one sub-folder per attempt; default ``<VAR_DIR>/runs``.
        "work_dir": None,
        #: Default for the ``max_output_bytes`` config.
        "max_output_bytes": 65536,
        #: Seconds between SIGTERM and SIGKILL when a run is cancelled or times out.
        "kill_grace_seconds": 5.0,
        #: ``start`` waits this long for the command to end, and returns its result if it did.
        "inline_wait_seconds": 0.0,
        #: Whether a non-zero exit is worth another attempt (126 and 127 never are).
        "retry_on_failure": True,
        #: PATH given to commands, also used to find allow-listed names.
        "path": _DEFAULT_PATH,
        #: Names of worker environment variables passed through (e.g. ``SSL_CERT_FILE``).
        "inherit_env": [],
        #: A run whose launcher died before the supervisor wrote its pid is lost after this long.
        "launch_grace_seconds": 30.0,
    }
    config_serializer_class = SubprocessConfigSerializer
    secret_config_fields = ("env",)
    supports_cancel = True

    def __init__(self, alias: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        allowed = self.options["allowed_executables"]
        if not isinstance(allowed, list | tuple) or not all(isinstance(item, str) and item for item in allowed):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: allowed_executables must be a list of strings.")
        for entry in allowed:
            if "/" in entry and not os.path.isabs(entry):
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: allowed_executables entry {entry!r} must be an absolute path or a name."
                )
        self.allowed: tuple[str, ...] = tuple(os.path.normpath(item) if "/" in item else item for item in allowed)
        inherit = self.options["inherit_env"]
        if not isinstance(inherit, list | tuple) or not all(isinstance(name, str) for name in inherit):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: inherit_env must be a list of variable names.")
        self.work_dir = Path(self.options["work_dir"] or Path(settings.VAR_DIR) / "runs").absolute()
        self.max_output_bytes = self._number("max_output_bytes", upper=MAX_OUTPUT_BYTES_LIMIT, integer=True)
        self.kill_grace = self._number("kill_grace_seconds", upper=3600)
        self.inline_wait = self._number("inline_wait_seconds", upper=3600)
        self.launch_grace = self._number("launch_grace_seconds", upper=3600)
        self.host = socket.gethostname()

    def _number(self, name: str, *, upper: float, integer: bool = False) -> Any:
        value = self.options[name]
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not 0 <= value <= upper:
            raise ImproperlyConfigured(f"TMS_RUNNERS[{self.alias!r}]: {name} must be a number from 0 to {upper}.")
        return value

    # -- validation ---------------------------------------------------------------------------

    def validate_config(self, config: Any) -> dict[str, Any]:
        """Validate the config, then check the executable against ``allowed_executables``."""
        data = super().validate_config(config)
        if data.get("artifact") and not self.options["allow_artifacts"]:
            self.refuse(
                "artifact", "This runner does not run uploaded artifacts.", "allow_artifacts", action="switch on"
            )
        if data.get("command") and not self.executable_allowed(data["command"][0]):
            self.refuse("command", f"{data['command'][0]!r} is not an allowed executable.", "allowed_executables")
        return data

    def executable_allowed(self, program: str) -> bool:
        """Whether ``program`` (an absolute path or a name looked up on PATH) is allow-listed.

        Paths are compared as written, never through symlinks: allowing ``/bin/ls`` on a busybox
        system must not allow every other applet that links to the same binary.
        """
        if "\0" in program or ("/" in program and not os.path.isabs(program)):
            return False
        if "/" not in program and program in self.allowed:
            return True
        resolved = self._which(program)
        if resolved is None:
            return False
        return any(entry == resolved or ("/" not in entry and self._which(entry) == resolved) for entry in self.allowed)

    def _which(self, program: str) -> str | None:
        if os.path.isabs(program):
            return os.path.normpath(program)
        found = shutil.which(program, path=self.options["path"])
        return os.path.normpath(os.path.abspath(found)) if found else None

    # -- runner interface ---------------------------------------------------------------------

    def start(self, spec: RunSpec) -> RunHandle:
        """Launch the attempt once per idempotency key, or adopt the launch that already happened.

        The ``launch`` marker is created with ``O_EXCL``: of two concurrent starts (two workers,
        a redelivered message) exactly one wins and launches; the others adopt its run folder.
        """
        run_dir = self._run_dir(spec)
        handle = RunHandle(f"{self.host}:{spec.idempotency_key}", data={"host": self.host, "run_dir": str(run_dir)})
        try:
            run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            marker = os.open(run_dir / LAUNCH, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            owner = (_read_json(run_dir / LAUNCH) or {}).get("task_id")
            if owner is not None and owner != str(spec.task_id):
                # Same key, another task: a work_dir left over from an earlier database, say.
                raise RunnerError(
                    f"run folder {run_dir} belongs to task {owner}, not {spec.task_id}; not adopting it",
                    retryable=False,
                ) from None
            logger.info("subprocess runner %r: adopting the existing run %s", self.alias, run_dir)
            return self._maybe_inline(spec, handle)
        except OSError as exc:
            raise RunnerError(f"cannot create the run folder {run_dir}: {exc}") from exc
        with os.fdopen(marker, "w") as fh:
            json.dump(
                {"host": self.host, "launcher_pid": os.getpid(), "task_id": str(spec.task_id), "at": time.time()}, fh
            )
        try:
            plan = self._plan(spec, run_dir)
        except (RunnerError, OSError) as exc:
            retryable = exc.retryable if isinstance(exc, RunnerError) else True
            message = str(exc) if isinstance(exc, RunnerError) else f"cannot prepare the run folder: {exc}"
            # Recorded in the folder too, so a start that adopts this run reports the same failure.
            self._record_failure(run_dir, message, retryable=retryable)
            return RunHandle(handle.external_run_id, handle.data, result=RunResult.failed(message, retryable=retryable))
        self._launch(run_dir, plan)
        return self._maybe_inline(spec, handle)

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        """Read the run folder: the exit file if the command ended, else whether it still runs."""
        run_dir = self._run_dir_for(spec, handle)
        if not (run_dir / LAUNCH).exists():
            return RunResult.failed(f"run folder {run_dir} is missing: the run was lost")
        outcome = _read_json(run_dir / EXIT)
        if outcome is not None:
            return self._judge(spec, run_dir, outcome)
        if _alive(_read_json(run_dir / SUPERVISOR_PID)) or _alive(_read_json(run_dir / PID)):
            return RunResult.running()
        if not (run_dir / SUPERVISOR_PID).exists():
            try:
                age = time.time() - (run_dir / LAUNCH).stat().st_mtime
            except FileNotFoundError:
                age = float("inf")
            if age < self.launch_grace:
                return RunResult.running()  # the launcher is still starting it
        # The supervisor may have written the exit file and left since we first looked.
        outcome = _read_json(run_dir / EXIT)
        if outcome is not None:
            return self._judge(spec, run_dir, outcome)
        if (run_dir / CANCEL).exists():
            return RunResult.failed("cancelled", output=self._output(spec, run_dir))
        detail = _tail(run_dir / SUPERVISOR_LOG, 2048).strip()
        return RunResult.failed(
            "process vanished without recording an exit status" + (f": {detail}" if detail else ""),
            output=self._output(spec, run_dir),
        )

    def cancel(self, spec: RunSpec, handle: RunHandle) -> None:
        """SIGTERM the command's process group, then SIGKILL it after ``kill_grace_seconds``.

        Blocks for at most the grace period (plus a moment for the exit file to appear).
        """
        run_dir = self._run_dir_for(spec, handle)
        if not (run_dir / LAUNCH).exists() or (run_dir / EXIT).exists():
            return
        # Written first: a supervisor that has not published the pid yet sees it and stops.
        _write_json(run_dir / CANCEL, {"at": time.time(), "by_pid": os.getpid()})
        info = _read_json(run_dir / PID)
        if not _alive(info):
            self._wait_for_exit(run_dir, 1.0)
            return
        _signal_group(info, signal.SIGTERM)
        deadline = time.monotonic() + self.kill_grace
        while time.monotonic() < deadline and _alive(info):
            time.sleep(0.05)
        if _alive(info):
            _signal_group(info, signal.SIGKILL)
        self._wait_for_exit(run_dir, 2.0)

    def output_so_far(self, spec: RunSpec, handle: RunHandle) -> str | None:
        """The end of the command's stdout so far (bounded like the final output), read from its
        run folder; None when the run lives on another host or has no folder (yet)."""
        try:
            run_dir = self._run_dir_for(spec, handle)
        except RunnerError:
            return None
        if not (run_dir / LAUNCH).exists():
            return None
        return self._output(spec, run_dir)

    # -- helpers ------------------------------------------------------------------------------

    def _run_dir(self, spec: RunSpec) -> Path:
        return self.work_dir / spec.idempotency_key

    def _run_dir_for(self, spec: RunSpec, handle: RunHandle) -> Path:
        """The run folder, recomputed from the spec (never a path taken from stored data)."""
        host = handle.data.get("host")
        if host and host != self.host:
            raise RunnerError(f"run {handle.external_run_id} lives on host {host!r}, not on {self.host!r}")
        return self._run_dir(spec)

    def _plan(self, spec: RunSpec, run_dir: Path) -> dict[str, Any]:
        """What the supervisor runs: resolved executable, argv, environment and folder."""
        config = spec.config
        work = run_dir / WORK
        (work / "tmp").mkdir(mode=0o700, parents=True, exist_ok=True)
        if config.get("artifact"):
            if not self.options["allow_artifacts"]:
                raise RunnerError(f"the {self.alias!r} runner does not run uploaded artifacts", retryable=False)
            if not spec.artifact_path:
                raise RunnerError("the task has no uploaded artifact to run", retryable=False)
            source = Path(spec.artifact_path)
            target = work / (source.name or "artifact")
            try:
                shutil.copyfile(source, target)
            except OSError as exc:
                raise RunnerError(f"cannot copy the artifact {source}: {exc}", retryable=False) from exc
            target.chmod(0o700)
            executable = str(target)
        else:
            program = config["command"][0]
            if not self.executable_allowed(program):
                raise RunnerError(f"{program!r} is not an allowed executable", retryable=False)
            resolved = self._which(program)
            if resolved is None:
                raise RunnerError(f"{program!r} was not found on PATH {self.options['path']}", retryable=False)
            executable = resolved
        argv = [executable, *(config.get("command") or [])[1:], *config.get("args", [])]
        cwd = work
        if config.get("cwd"):
            cwd = work / config["cwd"]
            cwd.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not cwd.resolve().is_relative_to(work.resolve()):
                raise RunnerError(f"cwd {config['cwd']!r} leaves the work folder", retryable=False)
        return {
            "argv": argv,
            "executable": executable,
            "cwd": str(cwd),
            "env": self._environment(spec, work),
            "deadline": time.time() + float(spec.timeout),
            "kill_grace": float(self.kill_grace),
        }

    def _environment(self, spec: RunSpec, work: Path) -> dict[str, str]:
        env = {
            "PATH": self.options["path"],
            "LANG": "C.UTF-8",
            "HOME": str(work),
            "TMPDIR": str(work / "tmp"),
        }
        env.update({name: os.environ[name] for name in self.options["inherit_env"] if name in os.environ})
        env.update(spec.config.get("env") or {})
        env.update(spec.environment())
        return env

    def _launch(self, run_dir: Path, plan: Mapping[str, Any]) -> None:
        try:
            _write_json(run_dir / RUN, plan)
            with (run_dir / SUPERVISOR_LOG).open("ab") as log:
                launcher = subprocess.Popen(
                    [sys.executable, "-I", SUPERVISOR, str(run_dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    close_fds=True,
                    start_new_session=True,
                    cwd=run_dir,
                    env={"PATH": self.options["path"], "LANG": "C.UTF-8"},
                )
            # Only the first fork is our child, and it exits at once: nothing is left to reap.
            returncode = launcher.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._record_failure(run_dir, f"could not start the supervisor: {exc}")
            raise RunnerError(f"could not start the supervisor: {exc}") from exc
        if returncode != 0:
            message = f"the supervisor failed to detach (exit {returncode}): {_tail(run_dir / SUPERVISOR_LOG, 1024)}"
            self._record_failure(run_dir, message)
            raise RunnerError(message)

    @staticmethod
    def _record_failure(run_dir: Path, message: str, *, retryable: bool = True) -> None:
        """Make a failed launch final, so adopting starts and polls report it instead of waiting."""
        _write_json(
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

    def _maybe_inline(self, spec: RunSpec, handle: RunHandle) -> RunHandle:
        """Wait up to ``inline_wait_seconds`` for a short command, and return its result if it ended."""
        wait = min(float(self.inline_wait), float(spec.timeout))
        run_dir = self._run_dir(spec)
        if self._wait_for_exit(run_dir, wait) or (run_dir / EXIT).exists():
            outcome = _read_json(run_dir / EXIT)
            if outcome is not None:
                return RunHandle(handle.external_run_id, handle.data, result=self._judge(spec, run_dir, outcome))
        return handle

    @staticmethod
    def _wait_for_exit(run_dir: Path, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        delay = 0.005
        while time.monotonic() < deadline:
            if (run_dir / EXIT).exists():
                return True
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.05)
        return False

    def _limit(self, spec: RunSpec) -> int:
        value = spec.config.get("max_output_bytes")
        return self.max_output_bytes if value is None else int(value)

    def _output(self, spec: RunSpec, run_dir: Path) -> str:
        return _tail(run_dir / STDOUT, self._limit(spec))

    def _judge(self, spec: RunSpec, run_dir: Path, outcome: Mapping[str, Any]) -> RunResult:
        """Turn the supervisor's exit record into a result."""
        output = self._output(spec, run_dir)
        returncode = outcome.get("returncode")
        if outcome.get("cancelled") or (run_dir / CANCEL).exists():
            return RunResult.failed("cancelled", output=output)
        if outcome.get("timed_out"):
            return RunResult.failed(
                f"timed out after {float(spec.timeout):g}s; the process group was killed", output=output
            )
        if returncode == 0:
            return RunResult.succeeded(output)
        stderr = _tail(run_dir / STDERR, self._limit(spec)).strip()
        if outcome.get("error"):
            message = str(outcome["error"])
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
            retryable = returncode not in (NOT_EXECUTABLE, NOT_FOUND) and (
                returncode is None or bool(self.options["retry_on_failure"])
            )
        return RunResult.failed(message, output=output, retryable=retryable)
