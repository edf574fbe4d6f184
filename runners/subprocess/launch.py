"""Launching a ``subprocess`` run: the plan the supervisor follows, and the detached supervisor itself.

:meth:`Launcher.plan` turns a task's config into the supervisor's ``run.json``: the resolved and
allow-listed executable (or the artifact's checked copy), the argv, a scrubbed environment, the
working folder, the run user, resource and disk limits, and in bwrap mode the sandbox's own argv.
:func:`start_supervisor` then spawns ``python -I runners/supervisor.py <run folder>``, which
double-forks and calls ``setsid()``, so the run outlives the worker, even one killed with SIGKILL.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runners import sandbox, supervisor
from runners.base import RunnerError, RunSpec
from runners.subprocess.artifacts import copy_artifact
from runners.subprocess.config import ExecutableAllowList, run_limits
from runners.subprocess.workdir import BIN, SUPERVISOR_LOG, WORK, record_failure, tail, write_json, write_text
from runners.supervisor import RUN

#: The host's temporary folders that a run in user mode shares: its files there are measured
#: against ``tmp_bytes`` and removed when it ends.
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108
#: The supervisor program, run by path: see :mod:`runners.supervisor`.
SUPERVISOR = str(Path(supervisor.__file__).resolve())


@dataclasses.dataclass(frozen=True)
class Launcher:
    """What a runner's OPTIONS say about launching its runs (checked at start-up by the runner)."""

    alias: str
    allow_list: ExecutableAllowList
    allow_artifacts: bool
    #: The runner's limits, which a run's config may change within the maxima.
    limits: Mapping[str, int]
    read_only_paths: tuple[str, ...]
    inherit_env: tuple[str, ...]
    egress: sandbox.Egress
    kill_grace: float

    @property
    def path(self) -> str:
        """PATH given to commands, also used to find allow-listed names."""
        return self.allow_list.path

    def plan(self, spec: RunSpec, run_dir: Path, mode: str = "none") -> dict[str, Any]:
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
            if not self.allow_artifacts:
                raise RunnerError(f"the {self.alias!r} runner does not run uploaded artifacts", retryable=False)
            executable = copy_artifact(spec, run_dir if user is None else run_dir / BIN, shared=user is not None)
        else:
            executable = self._executable(config["command"][0], [*config["command"][1:], *config.get("args", [])])
        # Checked again at launch: the config may be older than the rule, or than allowed_env's change.
        refused_env = self.allow_list.refused_env(
            None if config.get("artifact") else config["command"][0], list(config.get("env") or {})
        )
        if refused_env:
            raise RunnerError(f"env refused: {refused_env[0]}", retryable=False)
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
        limits = run_limits(self.limits, spec)
        if mode == "bwrap":
            read_only = [str(run_dir / BIN)] if config.get("artifact") else []
            if not executable.startswith(("/usr/", "/bin/", "/sbin/", "/lib")):
                read_only.append(executable)
            read_only += list(self.read_only_paths)
            resolv_conf = None
            if self.egress.open:
                # Names resolve through slirp4netns' forwarder (the host's resolvers), whatever they are.
                resolv_conf = str(run_dir / "resolv.conf")
                write_text(Path(resolv_conf), f"nameserver {sandbox.SLIRP_DNS}\n", mode=0o644)
            argv = sandbox.bwrap_argv(
                work=str(work), read_only=read_only, cwd=str(cwd), executable=executable, argv=argv,
                tmp_bytes=limits["tmp_bytes"], resolv_conf=resolv_conf,
            )  # fmt: skip
            executable = argv[0]
        return {
            "argv": argv,
            "executable": executable,
            "cwd": str(cwd),
            "env": self.environment(spec, work),
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

    def _executable(self, program: str, arguments: list[str]) -> str:
        """The allow-listed ``program``'s path, checked again at launch (the list may have changed
        since the task was saved)."""
        if not self.allow_list.allows(program):
            raise RunnerError(f"{program!r} is not an allowed executable", retryable=False)
        refused = self.allow_list.refused_argument(program, arguments)
        if refused is not None:
            raise RunnerError(f"argument {refused!r} is not allowed for {program!r}", retryable=False)
        resolved = self.allow_list.which(program)
        if resolved is None:
            raise RunnerError(f"{program!r} was not found on PATH {self.path}", retryable=False)
        return resolved

    def environment(self, spec: RunSpec, work: Path) -> dict[str, str]:
        """A scrubbed base environment, the inherited variables, the task's own, then TMS's."""
        env = {
            "PATH": self.path,
            "LANG": "C.UTF-8",
            "HOME": str(work),
            "TMPDIR": str(work / "tmp"),
        }
        env.update({name: os.environ[name] for name in self.inherit_env if name in os.environ})
        env.update(spec.config.get("env") or {})
        env.update(spec.environment())
        return env


def start_supervisor(run_dir: Path, plan: Mapping[str, Any], *, path: str) -> None:
    """Write ``plan`` to the run folder and start the detached supervisor on it.

    A supervisor that cannot start or detach is recorded as the run's outcome (so adopting
    starts and polls report it) and raised as a retryable :class:`RunnerError`.
    """
    try:
        write_json(run_dir / RUN, plan)
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
                env={"PATH": path, "LANG": "C.UTF-8"},
            )
        # Only the first fork is our child, and it exits at once: nothing is left to reap.
        returncode = launcher.wait(timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        record_failure(run_dir, f"could not start the supervisor: {exc}")
        raise RunnerError(f"could not start the supervisor: {exc}") from exc
    if returncode != 0:
        message = f"the supervisor failed to detach (exit {returncode}): {tail(run_dir / SUPERVISOR_LOG, 1024)}"
        record_failure(run_dir, message)
        raise RunnerError(message)
