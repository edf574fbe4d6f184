"""The ``subprocess`` runner class: checks its OPTIONS, and starts, polls and cancels runs.

The pieces it puts together live beside it: :mod:`~runners.subprocess.config` (a task's config
and the operator's allow-list and limits), :mod:`~runners.subprocess.workdir` (run folders and
pruning), :mod:`~runners.subprocess.artifacts` (the checked copy of an uploaded artifact),
:mod:`~runners.subprocess.launch` (the plan and the detached supervisor) and
:mod:`~runners.subprocess.outcome` (the exit record read into a result). See the package's
docstring for the whole picture.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from rest_framework import serializers

from runners import sandbox
from runners.base import MAX_OUTPUT_BYTES_LIMIT, BaseRunner, RunHandle, RunnerError, RunResult, RunSpec
from runners.subprocess.config import (
    DEFAULT_PATH,
    ExecutableAllowList,
    SubprocessConfigSerializer,
    number_option,
    parse_limits,
    run_limits,
)
from runners.subprocess.launch import Launcher, start_supervisor
from runners.subprocess.outcome import judge, read_output
from runners.subprocess.workdir import (
    LAUNCH,
    SUPERVISOR_LOG,
    alive,
    prepare_work_dir,
    prune_runs,
    read_json,
    record_failure,
    signal_group,
    tail,
    wait_for_exit,
    write_json,
)
from runners.supervisor import CANCEL, EXIT, PID, SUPERVISOR_PID
from tms_core.conf import tms_settings

logger = logging.getLogger(__name__)


class SubprocessRunner(BaseRunner):
    """Runs an allow-listed command or the task's artifact as a detached local process.

    See the module docstring for the run folder, the supervisor and what is (not) guaranteed.
    """

    option_defaults: ClassVar[dict[str, Any]] = {
        #: Absolute paths, or names looked up on ``path``, that tasks may run. Empty: no command.
        #: A dict pins arguments too: ``{program: [regex, ...]}``, where every argument must match
        #: one of the patterns in full (an empty list: no arguments; ``None``: any arguments).
        "allowed_executables": [],
        #: ``{program: [NAME, ...]}``: the variables a task's ``env`` may give a program (a key of
        #: ``allowed_executables``, or ``"*"`` for every program and artifacts). A program pinned to
        #: its arguments gets these only (default: none); any other gets any variable but those
        #: that inject code (PYTHON*, PERL5*, NODE_OPTIONS, BASH_ENV, ...) unless named here.
        "allowed_env": {},
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
        "path": DEFAULT_PATH,
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
        options = self.options
        self.allow_list = ExecutableAllowList(
            alias, options["allowed_executables"], path=options["path"], allowed_env=options["allowed_env"]
        )
        self.limits, self.max_limits = parse_limits(alias, self.options)
        egress = sandbox.parse_egress(alias, self.options["egress"])
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
        self.max_output_bytes = number_option(
            alias, self.options, "max_output_bytes", upper=MAX_OUTPUT_BYTES_LIMIT, integer=True
        )
        self.kill_grace = number_option(alias, self.options, "kill_grace_seconds", upper=3600)
        self.inline_wait = number_option(alias, self.options, "inline_wait_seconds", upper=3600)
        self.launch_grace = number_option(alias, self.options, "launch_grace_seconds", upper=3600)
        self.host = socket.gethostname()
        self.launcher = Launcher(
            alias=alias,
            allow_list=self.allow_list,
            allow_artifacts=bool(self.options["allow_artifacts"]),
            limits=self.limits,
            read_only_paths=tuple(paths),
            inherit_env=tuple(inherit),
            egress=egress,
            kill_grace=float(self.kill_grace),
        )

    @property
    def egress(self) -> sandbox.Egress:
        """Where this runner's runs may connect (the ``egress`` option, parsed)."""
        return self.launcher.egress

    def sandbox_mode(self) -> str:
        """The sandbox mode runs get (resolved once): see :mod:`runners.sandbox`."""
        if self._mode is None:
            mode = sandbox.resolve_mode(self.options["sandbox"])
            if mode != "none" and self.egress.open:
                sandbox.check_egress_tools()
            self._mode = mode
        return self._mode

    # -- validation ---------------------------------------------------------------------------

    def validate_config(self, config: Any) -> dict[str, Any]:
        """Validate the config, then check the executable against ``allowed_executables`` and
        its ``env`` against ``allowed_env`` (:meth:`ExecutableAllowList.refused_env`)."""
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
        refused_env = self.allow_list.refused_env(
            data["command"][0] if data.get("command") else None, list(data.get("env") or {})
        )
        if refused_env:
            suffix = f"An operator can add it to the allowed_env option of the {self.alias!r} runner."
            raise serializers.ValidationError({"env": [f"{message} {suffix}" for message in refused_env]})
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
        return self.allow_list.refused_argument(program, arguments)

    def executable_allowed(self, program: str) -> bool:
        """Whether ``program`` (an absolute path or a name looked up on PATH) is allow-listed
        (:meth:`ExecutableAllowList.allows`)."""
        return self.allow_list.allows(program)

    def _which(self, program: str) -> str | None:
        return self.allow_list.which(program)

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
            prepare_work_dir(self.work_dir, mode)
            run_dir.mkdir(mode=0o700, exist_ok=True)
            marker = os.open(run_dir / LAUNCH, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            owner = (read_json(run_dir / LAUNCH) or {}).get("task_id")
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
            plan = self.launcher.plan(spec, run_dir, mode)
        except (RunnerError, OSError, sandbox.NoFreeRunUser, ImproperlyConfigured) as exc:
            # ImproperlyConfigured: egress's tools went missing after the mode was resolved.
            retryable = exc.retryable if isinstance(exc, RunnerError) else not isinstance(exc, ImproperlyConfigured)
            message = str(exc) if not isinstance(exc, OSError) else f"cannot prepare the run folder: {exc}"
            # Recorded in the folder too, so a start that adopts this run reports the same failure.
            record_failure(run_dir, message, retryable=retryable)
            return RunHandle(handle.external_run_id, handle.data, result=RunResult.failed(message, retryable=retryable))
        start_supervisor(run_dir, plan, path=self.launcher.path)
        return self._maybe_inline(spec, handle)

    def poll(self, spec: RunSpec, handle: RunHandle) -> RunResult:
        """Read the run folder: the exit file if the command ended, else whether it still runs."""
        run_dir = self._run_dir_for(spec, handle)
        if not (run_dir / LAUNCH).exists():
            return RunResult.failed(f"run folder {run_dir} is missing: the run was lost")
        outcome = read_json(run_dir / EXIT)
        if outcome is not None:
            return self._judge(spec, run_dir, outcome)
        if alive(read_json(run_dir / SUPERVISOR_PID)) or alive(read_json(run_dir / PID)):
            return RunResult.running()
        if not (run_dir / SUPERVISOR_PID).exists():
            try:
                age = time.time() - (run_dir / LAUNCH).stat().st_mtime
            except FileNotFoundError:
                age = float("inf")
            if age < self.launch_grace:
                return RunResult.running()  # the launcher is still starting it
        # The supervisor may have written the exit file and left since we first looked.
        outcome = read_json(run_dir / EXIT)
        if outcome is not None:
            return self._judge(spec, run_dir, outcome)
        if (run_dir / CANCEL).exists():
            return RunResult.failed("cancelled", output=self._output(spec, run_dir))
        detail = tail(run_dir / SUPERVISOR_LOG, 2048).strip()
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
        write_json(run_dir / CANCEL, {"at": time.time(), "by_pid": os.getpid()})
        info = read_json(run_dir / PID)
        if not alive(info):
            wait_for_exit(run_dir, 1.0)
            return
        signal_group(info, signal.SIGTERM)
        deadline = time.monotonic() + self.kill_grace
        while time.monotonic() < deadline and alive(info):
            time.sleep(0.05)
        if alive(info):
            signal_group(info, signal.SIGKILL)
        wait_for_exit(run_dir, 2.0)

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

    def prune_runs(self, retention: float | None = None) -> int:
        """Remove run folders older than ``TMS_SUBPROCESS_RUN_RETENTION`` (or ``retention`` seconds);
        never a run in progress (:func:`runners.subprocess.workdir.prune_runs`). Returns how many went."""
        keep = tms_settings().SUBPROCESS_RUN_RETENTION if retention is None else retention
        return prune_runs(self.work_dir, keep)

    # -- helpers ------------------------------------------------------------------------------

    def _run_dir(self, spec: RunSpec) -> Path:
        return self.work_dir / spec.idempotency_key

    def _run_dir_for(self, spec: RunSpec, handle: RunHandle) -> Path:
        """The run folder, recomputed from the spec (never a path taken from stored data)."""
        host = handle.data.get("host")
        if host and host != self.host:
            raise RunnerError(f"run {handle.external_run_id} lives on host {host!r}, not on {self.host!r}")
        return self._run_dir(spec)

    def _prune_now_and_then(self) -> None:
        if time.monotonic() - self._pruned_at < 300:
            return
        self._pruned_at = time.monotonic()
        try:
            self.prune_runs()
        except OSError:
            logger.exception("subprocess runner %r: pruning old run folders failed", self.alias)

    def _maybe_inline(self, spec: RunSpec, handle: RunHandle) -> RunHandle:
        """Wait up to ``inline_wait_seconds`` for a short command, and return its result if it ended."""
        wait = min(float(self.inline_wait), float(spec.timeout))
        run_dir = self._run_dir(spec)
        if wait_for_exit(run_dir, wait) or (run_dir / EXIT).exists():
            outcome = read_json(run_dir / EXIT)
            if outcome is not None:
                return RunHandle(handle.external_run_id, handle.data, result=self._judge(spec, run_dir, outcome))
        return handle

    def _output(self, spec: RunSpec, run_dir: Path) -> str:
        return read_output(spec, run_dir, self.max_output_bytes)

    def _judge(self, spec: RunSpec, run_dir: Path, outcome: Mapping[str, Any]) -> RunResult:
        return judge(
            spec,
            run_dir,
            outcome,
            limits=run_limits(self.limits, spec),
            default_output_limit=self.max_output_bytes,
            retry_on_failure=bool(self.options["retry_on_failure"]),
        )
