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

Isolation: in the ``bwrap`` and ``user`` modes the command runs as a run user of its own, in a
network namespace of its own (no network but its loopback unless the ``egress`` option opens
some), within resource limits and a measured disk limit on its work folder; see
:mod:`runners.sandbox`. Mode ``none`` runs it as the worker's user: not a sandbox. Runs are local
to one host: a poll from another host fails the attempt
(retryably), so route subprocess tasks to workers of one host, or to a queue per host. Run folders
are kept after the run (for the output and for adoption); a retention job should prune old ones.
"""

from __future__ import annotations

import contextlib
import hashlib
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

from runners import sandbox, supervisor
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
from tms_core.conf import tms_settings

logger = logging.getLogger(__name__)

#: Environment variables the runner sets itself (a task may not override them).
_RESERVED_ENV_PREFIX = "TMS_"
#: Variables that make the dynamic loader inject code into any allowed executable.
_LOADER_ENV_PREFIXES = ("LD_", "DYLD_")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# File names inside a run folder, besides those the supervisor writes (imported from it).
LAUNCH, SUPERVISOR_LOG, WORK, BIN = "launch", "supervisor.log", "work", "bin"
#: Limits a run gets: resource limits (setrlimit in the command's process), the disk its work
#: folder may hold (measured by the supervisor) and the size of its private /tmp and /dev/shm
#: (bwrap mode). Their defaults, which are also what a task may ask for at most unless the
#: operator's ``max_limits`` says more, and the ceilings of what an operator may set.
LIMIT_NAMES = (*supervisor.RLIMITS, "disk_bytes", "tmp_bytes")
DEFAULT_LIMITS = {
    "cpu_seconds": 3600,
    "memory_bytes": 2 * 1024**3,
    "file_bytes": 64 * 1024**2,
    "processes": 64,
    "open_files": 1024,
    "disk_bytes": 256 * 1024**2,
    "tmp_bytes": 64 * 1024**2,
}
LIMIT_CEILINGS = {
    "cpu_seconds": 86400,
    "memory_bytes": 16 * 1024**3,
    "file_bytes": 4 * 1024**3,
    "processes": 1024,
    "open_files": 65536,
    "disk_bytes": 64 * 1024**3,
    "tmp_bytes": 4 * 1024**3,
}
#: The host's temporary folders that a run in user mode shares: its files there are measured
#: against ``tmp_bytes`` and removed when it ends.
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108
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
    limits = serializers.DictField(
        child=serializers.IntegerField(min_value=1),
        default=dict,
        help_text=(
            "Limits of the run, within the operator's maxima (by default the runner's own limits: a task may "
            "lower them, not raise them): cpu_seconds, memory_bytes (address space), file_bytes (largest file "
            "written, stdout and stderr included), processes, open_files, disk_bytes (what the work folder may "
            "hold), tmp_bytes (size of the private /tmp and /dev/shm, each; bwrap mode)."
        ),
    )

    def validate_limits(self, value: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(value) - set(LIMIT_NAMES))
        if unknown:
            raise serializers.ValidationError(
                f"Unknown limits: {', '.join(unknown)} (known: {', '.join(LIMIT_NAMES)})."
            )
        return value

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


def _write_text(path: Path, text: str, *, mode: int) -> None:
    """Write a small text file whole, with ``mode`` whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


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
        #: A dict pins arguments too: ``{program: [regex, ...]}``, where every argument must match
        #: one of the patterns in full (an empty list: no arguments; ``None``: any arguments).
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
        #: Sandbox mode of this runner (bwrap, user, none, auto); None: TMS_SUBPROCESS_SANDBOX.
        "sandbox": None,
        #: Limits of a run unless its config sets lower (or, up to ``max_limits``, higher).
        "limits": {},
        #: The highest limits a task's config may ask for; by default the runner's ``limits``.
        "max_limits": {},
        #: Extra host paths a run sees read-only in bwrap mode (an interpreter's libraries, say).
        "read_only_paths": [],
        #: Where runs (bwrap and user modes) may connect: None, no network but their own loopback;
        #: ``{"internet": true, "allow": ["10.1.2.0/24", "files.internal"]}`` opens public addresses
        #: and the listed networks, addresses and host names (see :mod:`runners.sandbox`).
        "egress": None,
    }
    config_serializer_class = SubprocessConfigSerializer
    secret_config_fields = ("env",)
    destination_config_fields = ("command", "args", "artifact", "cwd")
    supports_cancel = True

    def __init__(self, alias: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(alias, options)
        allowed = self.options["allowed_executables"]
        if isinstance(allowed, Mapping):
            entries = dict(allowed)
        elif isinstance(allowed, list | tuple):
            entries = dict.fromkeys(allowed)
        else:
            entries = None
        if entries is None or not all(isinstance(item, str) and item for item in entries):
            raise ImproperlyConfigured(
                f"TMS_RUNNERS[{alias!r}]: allowed_executables must be a list of strings, or a dict of program -> "
                "argument patterns."
            )
        #: entry -> compiled argument patterns (None: any arguments).
        self.arg_patterns: dict[str, tuple[re.Pattern[str], ...] | None] = {}
        for entry, patterns in entries.items():
            if "/" in entry and not os.path.isabs(entry):
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: allowed_executables entry {entry!r} must be an absolute path or a name."
                )
            key = os.path.normpath(entry) if "/" in entry else entry
            if patterns is None:
                self.arg_patterns[key] = None
                continue
            if not isinstance(patterns, list | tuple) or not all(isinstance(item, str) for item in patterns):
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: allowed_executables[{entry!r}] must be a list of regular expressions."
                )
            try:
                self.arg_patterns[key] = tuple(re.compile(item) for item in patterns)
            except re.error as exc:
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{alias!r}]: allowed_executables[{entry!r}]: bad pattern: {exc}"
                ) from exc
        self.allowed: tuple[str, ...] = tuple(self.arg_patterns)
        self.limits, self.max_limits = self._limits()
        self.egress = sandbox.parse_egress(alias, self.options["egress"])
        paths = self.options["read_only_paths"]
        if not isinstance(paths, list | tuple) or not all(isinstance(p, str) and os.path.isabs(p) for p in paths):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: read_only_paths must be a list of absolute paths.")
        mode = self.options["sandbox"]
        if mode is not None and mode not in ("auto", *sandbox.MODES):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: sandbox must be one of auto, bwrap, user, none.")
        self._mode: str | None = None
        self._pruned_at = 0.0
        inherit = self.options["inherit_env"]
        if not isinstance(inherit, list | tuple) or not all(isinstance(name, str) for name in inherit):
            raise ImproperlyConfigured(f"TMS_RUNNERS[{alias!r}]: inherit_env must be a list of variable names.")
        self.work_dir = Path(self.options["work_dir"] or Path(settings.VAR_DIR) / "runs").absolute()
        self.max_output_bytes = self._number("max_output_bytes", upper=MAX_OUTPUT_BYTES_LIMIT, integer=True)
        self.kill_grace = self._number("kill_grace_seconds", upper=3600)
        self.inline_wait = self._number("inline_wait_seconds", upper=3600)
        self.launch_grace = self._number("launch_grace_seconds", upper=3600)
        self.host = socket.gethostname()

    def _limits(self) -> tuple[dict[str, int], dict[str, int]]:
        """The runner's limits and the maxima a task may ask for, checked against the ceilings.

        ``max_limits`` defaults to ``limits``: a task raises a limit only where the operator
        allowed it. A default limit above an operator's lower maximum comes down to it.
        """
        given: dict[str, Mapping[str, Any]] = {}
        for name in ("limits", "max_limits"):
            value = self.options[name]
            if not isinstance(value, Mapping) or set(value) - set(LIMIT_NAMES):
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{self.alias!r}]: {name} must be a dict with keys among {', '.join(LIMIT_NAMES)}."
                )
            for key, number in value.items():
                if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= LIMIT_CEILINGS[key]:
                    raise ImproperlyConfigured(
                        f"TMS_RUNNERS[{self.alias!r}]: {name}[{key!r}] must be a whole number from 1 to "
                        f"{LIMIT_CEILINGS[key]}."
                    )
            given[name] = value
        limits: dict[str, int] = {}
        maxima: dict[str, int] = {}
        for key in LIMIT_NAMES:
            if key in given["limits"]:
                limits[key] = int(given["limits"][key])
            else:
                limits[key] = min(DEFAULT_LIMITS[key], int(given["max_limits"].get(key, DEFAULT_LIMITS[key])))
            maxima[key] = int(given["max_limits"].get(key, limits[key]))
            if limits[key] > maxima[key]:
                raise ImproperlyConfigured(
                    f"TMS_RUNNERS[{self.alias!r}]: limits[{key!r}] {limits[key]} is above max_limits[{key!r}] "
                    f"{maxima[key]}."
                )
        return limits, maxima

    def sandbox_mode(self) -> str:
        """The sandbox mode runs get (resolved once): see :mod:`runners.sandbox`."""
        if self._mode is None:
            mode = sandbox.resolve_mode(self.options["sandbox"])
            if mode != "none" and self.egress.open:
                sandbox.check_egress_tools()
            self._mode = mode
        return self._mode

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
        if data.get("command"):
            refused = self.refused_argument(data["command"][0], [*data["command"][1:], *data.get("args", [])])
            if refused is not None:
                field = "command" if refused in data["command"][1:] else "args"
                self.refuse(
                    field, f"argument {refused!r} matches none of the patterns allowed for {data['command'][0]!r}.",
                    "allowed_executables",
                )  # fmt: skip
        too_high = [
            f"{name} may be at most {self.max_limits[name]} on the {self.alias!r} runner."
            for name, value in sorted(data.get("limits", {}).items())
            if value > self.max_limits[name]
        ]
        if too_high:
            raise serializers.ValidationError({"limits": too_high})
        return data

    def refused_argument(self, program: str, arguments: list[str]) -> str | None:
        """The first argument that the operator's patterns for ``program`` do not allow, if any."""
        entry = self._allowed_entry(program)
        patterns = self.arg_patterns.get(entry) if entry is not None else None
        if patterns is None:
            return None
        for argument in arguments:
            if not any(pattern.fullmatch(argument) for pattern in patterns):
                return argument
        return None

    def executable_allowed(self, program: str) -> bool:
        """Whether ``program`` (an absolute path or a name looked up on PATH) is allow-listed.

        Paths are compared as written, never through symlinks: allowing ``/bin/ls`` on a busybox
        system must not allow every other applet that links to the same binary.
        """
        return self._allowed_entry(program) is not None

    def _allowed_entry(self, program: str) -> str | None:
        """The allow-list entry that admits ``program``, or None."""
        if "\0" in program or ("/" in program and not os.path.isabs(program)):
            return None
        if "/" not in program and program in self.allowed:
            return program
        resolved = self._which(program)
        if resolved is None:
            return None
        for entry in self.allowed:
            if entry == resolved or ("/" not in entry and self._which(entry) == resolved):
                return entry
        return None

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
            mode = self.sandbox_mode()
        except ImproperlyConfigured as exc:
            raise RunnerError(f"the subprocess sandbox is not set up on {self.host}: {exc}", retryable=False) from exc
        self._prune_now_and_then()
        try:
            self._prepare_work_dir(mode)
            run_dir.mkdir(mode=0o700, exist_ok=True)
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
            plan = self._plan(spec, run_dir, mode)
        except (RunnerError, OSError, sandbox.NoFreeRunUser, ImproperlyConfigured) as exc:
            # ImproperlyConfigured: egress's tools went missing after the mode was resolved.
            retryable = exc.retryable if isinstance(exc, RunnerError) else not isinstance(exc, ImproperlyConfigured)
            message = str(exc) if not isinstance(exc, OSError) else f"cannot prepare the run folder: {exc}"
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

    def _prepare_work_dir(self, mode: str) -> None:
        """Create ``work_dir``; with a run user, check that it can reach its folder (no more)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if mode == "none":
            return
        # Search (x) but no listing (r) for others: a run user reaches its own folder by name only.
        if self.work_dir.stat().st_mode & 0o777 != 0o711:
            self.work_dir.chmod(0o711)
        for folder in self.work_dir.parents:
            if not folder.stat().st_mode & 0o001:
                raise RunnerError(
                    f"run users cannot reach the work_dir {self.work_dir}: {folder} is not searchable by others "
                    "(chmod o+x it, or choose another work_dir)",
                    retryable=False,
                )

    def _plan(self, spec: RunSpec, run_dir: Path, mode: str = "none") -> dict[str, Any]:
        """What the supervisor runs: resolved executable, argv, environment, folder, user and limits.

        With a run user (modes ``user`` and ``bwrap``) the run folder is the worker's and only
        searchable by others (0711), its control files are the worker's 0600, ``work/`` is the run
        user's 0700, and an artifact is copied to ``bin/`` (the worker's, read-only to the run)
        and its checksum checked on the copy.
        """
        work = run_dir / WORK
        work.mkdir(mode=0o700, exist_ok=True)
        (work / "tmp").mkdir(mode=0o700, exist_ok=True)
        user = sandbox.claim_run_user(run_dir) if mode != "none" else None
        try:
            return self._plan_as(spec, run_dir, mode, user)
        except BaseException:
            if user is not None:  # no supervisor will ever give it back
                Path(user.lock).unlink(missing_ok=True)
            raise

    def _plan_as(self, spec: RunSpec, run_dir: Path, mode: str, user: sandbox.RunUser | None) -> dict[str, Any]:
        config = spec.config
        work = run_dir / WORK
        if user is not None:
            run_dir.chmod(0o711)
            for folder in (work, work / "tmp"):
                os.chown(folder, user.uid, user.gid)
        if config.get("artifact"):
            executable = self._copy_artifact(spec, run_dir if user is None else run_dir / BIN, shared=user is not None)
        else:
            program = config["command"][0]
            if not self.executable_allowed(program):
                raise RunnerError(f"{program!r} is not an allowed executable", retryable=False)
            refused = self.refused_argument(program, [*config["command"][1:], *config.get("args", [])])
            if refused is not None:
                raise RunnerError(f"argument {refused!r} is not allowed for {program!r}", retryable=False)
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
            if user is not None:
                for folder in [cwd, *cwd.parents]:
                    if folder == work:
                        break
                    os.chown(folder, user.uid, user.gid)
        limits = self._run_limits(spec)
        if mode == "bwrap":
            read_only = [str(run_dir / BIN)] if config.get("artifact") else []
            if not executable.startswith(("/usr/", "/bin/", "/sbin/", "/lib")):
                read_only.append(executable)
            read_only += list(self.options["read_only_paths"])
            resolv_conf = None
            if self.egress.open:
                # Names resolve through slirp4netns' forwarder (the host's resolvers), whatever they are.
                resolv_conf = str(run_dir / "resolv.conf")
                _write_text(Path(resolv_conf), f"nameserver {sandbox.SLIRP_DNS}\n", mode=0o644)
            argv = sandbox.bwrap_argv(
                work=str(work), read_only=read_only, cwd=str(cwd), executable=executable, argv=argv,
                tmp_bytes=limits["tmp_bytes"], resolv_conf=resolv_conf,
            )  # fmt: skip
            executable = argv[0]
        return {
            "argv": argv,
            "executable": executable,
            "cwd": str(cwd),
            "env": self._environment(spec, work),
            "deadline": time.time() + float(spec.timeout),
            "kill_grace": float(self.kill_grace),
            "sandbox": mode,
            "user": None if user is None else {"name": user.name, "uid": user.uid, "gid": user.gid, "lock": user.lock},
            "rlimits": {name: value for name, value in limits.items() if name in supervisor.RLIMITS},
            "disk": {
                "path": str(work),
                "limit": limits["disk_bytes"],
                # User mode shares the host's temporary folders: the run user's entries there count.
                "shared": list(SHARED_TMP) if mode == "user" else [],
                "tmp_limit": limits["tmp_bytes"],
            },
            "network": sandbox.network_plan(self.egress, mode),
            "ignore_sigterm": mode == "bwrap",
        }

    def _run_limits(self, spec: RunSpec) -> dict[str, int]:
        return {**self.limits, **(spec.config.get("limits") or {})}

    def _copy_artifact(self, spec: RunSpec, folder: Path, *, shared: bool) -> str:
        """Copy the artifact into the run's own folder and check the copy's SHA-256: what runs is
        what was uploaded, whatever happened to the cache since."""
        if not self.options["allow_artifacts"]:
            raise RunnerError(f"the {self.alias!r} runner does not run uploaded artifacts", retryable=False)
        if not spec.artifact_path:
            raise RunnerError("the task has no uploaded artifact to run", retryable=False)
        source = Path(spec.artifact_path)
        folder.mkdir(mode=0o755 if shared else 0o700, exist_ok=True)
        # A plain name: it becomes an argument of env(1) in bwrap mode, where "a=b" would be a variable.
        target = folder / (re.sub(r"[^A-Za-z0-9._-]", "_", source.name).lstrip(".") or "artifact")
        digest = hashlib.sha256()
        try:
            with source.open("rb") as src, target.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
        except OSError as exc:
            raise RunnerError(f"cannot copy the artifact {source}: {exc}", retryable=False) from exc
        if spec.artifact_sha256 and digest.hexdigest() != spec.artifact_sha256:
            target.unlink(missing_ok=True)
            raise RunnerError(
                f"the artifact's copy does not match its checksum {spec.artifact_sha256}: not running it",
                retryable=False,
            )
        # Read and execute only, for the run user too: it cannot replace what it runs.
        target.chmod(0o555 if shared else 0o700)
        return str(target)

    def _prune_now_and_then(self) -> None:
        if time.monotonic() - self._pruned_at < 300:
            return
        self._pruned_at = time.monotonic()
        try:
            self.prune_runs()
        except OSError:
            logger.exception("subprocess runner %r: pruning old run folders failed", self.alias)

    def prune_runs(self, retention: float | None = None) -> int:
        """Remove run folders older than ``TMS_SUBPROCESS_RUN_RETENTION``; never a run in progress.

        A folder goes when its run has ended (exit record) that long ago, or when it was launched
        that long ago and neither its supervisor nor its command is alive. Returns how many went.
        """
        keep = tms_settings().SUBPROCESS_RUN_RETENTION if retention is None else retention
        cutoff = time.time() - keep
        removed = 0
        if not self.work_dir.is_dir():
            return 0
        for folder in self.work_dir.iterdir():
            if not folder.is_dir() or folder.is_symlink():
                continue
            try:
                ended = (folder / EXIT).stat().st_mtime
            except FileNotFoundError:
                try:
                    launched = (folder / LAUNCH).stat().st_mtime
                except FileNotFoundError:
                    continue
                if launched > cutoff or _alive(_read_json(folder / SUPERVISOR_PID)) or _alive(_read_json(folder / PID)):
                    continue
            else:
                if ended > cutoff:
                    continue
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        return removed

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
            fd = os.open(run_dir / SUPERVISOR_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "ab") as log:
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

    def _limit_exceeded(self, spec: RunSpec, run_dir: Path, outcome: Mapping[str, Any]) -> str | None:
        """Which resource limit ended a failed run, if one did (signals are 128+n through bwrap)."""
        returncode = outcome.get("returncode")
        if not isinstance(returncode, int) or returncode == 0:
            return None
        limits = self._run_limits(spec)
        signalled = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
        cpu = outcome.get("cpu_seconds")
        if signalled in (signal.SIGXCPU, signal.SIGKILL) and (
            signalled == signal.SIGXCPU or (isinstance(cpu, int | float) and cpu >= limits["cpu_seconds"] - 0.05)
        ):
            return f"killed: CPU time limit of {limits['cpu_seconds']} s reached"
        written = max((_size(run_dir / name) for name in (STDOUT, STDERR)), default=0)
        if signalled == signal.SIGXFSZ or written >= limits["file_bytes"]:
            return f"output exceeded {limits['file_bytes']} bytes (file size limit)"
        return None

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
        if returncode == 0 and not outcome.get("error"):
            return RunResult.succeeded(output)
        stderr = _tail(run_dir / STDERR, self._limit(spec)).strip()
        exceeded = self._limit_exceeded(spec, run_dir, outcome)
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
            retryable = returncode not in (NOT_EXECUTABLE, NOT_FOUND) and (
                returncode is None or bool(self.options["retry_on_failure"])
            )
        return RunResult.failed(message, output=output, retryable=retryable)
