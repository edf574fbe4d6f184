"""How the ``subprocess`` runner isolates a run from the worker and from other runs.

Modes (``TMS_SUBPROCESS_SANDBOX``):

``bwrap``
    The command runs as a run user of its own (not the worker's) inside bubblewrap: new user,
    PID, IPC, UTS and mount namespaces (the network is shared). It sees ``/usr`` (and the
    ``/bin``, ``/sbin``, ``/lib*`` links or folders), a few files of ``/etc``, a fresh ``/proc``
    of its own PID namespace (no other process of the host, the worker's included), a private
    ``/dev`` and ``/tmp``, its own work folder (read-write), its artifact (read-only) and the
    operator's ``read_only_paths``; nothing else of the host: no other run folder, no artifact
    cache, no project files.
``user``
    The command runs as a run user of its own, with the host's file system: the worker's
    ``/proc/<pid>/environ`` is closed to it (another user's), its run folder's control files
    (``run.json`` with the task's secrets and callback token) are root-only, its work folder
    is 0700 and its own, other runs run as other users. World-readable files of the host stay
    readable, and ``/tmp`` is shared.
``none``
    Explicit opt-in, **not a sandbox**: the command runs as the worker's own user (only the
    resource limits and the scrubbed environment apply).
``auto`` (default)
    ``bwrap`` when the worker can switch users (root or ``CAP_SETUID``) and ``bwrap`` is
    installed, ``user`` when it can switch users only, and otherwise a configuration error.

Run users form a pool, ``<prefix>0 .. <prefix>N-1`` (``manage.py tms_sandbox_setup`` creates
them). Each concurrent run on a host claims one for itself, with an ``O_EXCL`` file in the
host-wide, root-only ``SUBPROCESS_RUN_USER_LOCKS`` folder, and the supervisor gives it back when
the run is over, after killing every process left with that uid: two runs never share a uid at
the same time, so per-user limits (``RLIMIT_NPROC``) and signals stay within one run.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from runners.supervisor import kill_user, start_ticks
from tms_core.conf import tms_settings

MODES = ("bwrap", "user", "none")
#: Files of /etc a run sees in bwrap mode (those that exist): name lookups, TLS roots, time zone.
ETC_FILES = (
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "resolv.conf",
    "localtime",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "alternatives",
    "mime.types",
)
#: Top-level folders (or merged-/usr links) of the system a run sees in bwrap mode.
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: coreutils' env (>= 8.31 for --default-signal), run inside the sandbox in front of the command.
ENV = "/usr/bin/env"


def privileged() -> bool:
    """Whether this process can switch to another user (root, or CAP_SETUID and CAP_SETGID)."""
    if os.geteuid() == 0:
        return True
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
                return bool(caps & (1 << 7)) and bool(caps & (1 << 6))  # CAP_SETUID, CAP_SETGID
    except OSError:
        pass
    return False


def bwrap_path() -> str | None:
    return shutil.which("bwrap", path="/usr/local/bin:/usr/bin:/bin")


def run_user_names() -> list[str]:
    conf = tms_settings()
    return [f"{conf.SUBPROCESS_RUN_USER_PREFIX}{i}" for i in range(conf.SUBPROCESS_RUN_USERS)]


def missing_run_users() -> list[str]:
    missing = []
    for name in run_user_names():
        try:
            pwd.getpwnam(name)
        except KeyError:
            missing.append(name)
    return missing


def resolve_mode(configured: str | None = None) -> str:
    """The mode runs get on this host, or ImproperlyConfigured saying what is missing."""
    mode = configured or tms_settings().SUBPROCESS_SANDBOX
    if mode == "none":
        return mode
    can_switch = privileged()
    if mode == "auto":
        if not can_switch:
            raise ImproperlyConfigured(
                "TMS_SUBPROCESS_SANDBOX=auto: the worker can neither switch to a run user (it is not root and "
                "has no CAP_SETUID) nor sandbox runs otherwise; run the worker as root (it drops privileges "
                "for each run), or set TMS_SUBPROCESS_SANDBOX=none to run commands as the worker's own user "
                "(not a sandbox)."
            )
        mode = "bwrap" if bwrap_path() else "user"
    elif not can_switch:
        raise ImproperlyConfigured(
            f"TMS_SUBPROCESS_SANDBOX={mode}: the worker must be root (or have CAP_SETUID and CAP_SETGID) to "
            "run commands as a run user."
        )
    if mode == "bwrap" and not bwrap_path():
        raise ImproperlyConfigured(
            "TMS_SUBPROCESS_SANDBOX=bwrap: bubblewrap is not installed (apt-get install -y bubblewrap)."
        )
    missing = missing_run_users()
    if missing:
        raise ImproperlyConfigured(
            f"TMS_SUBPROCESS_SANDBOX={mode}: run users missing ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}); create them with `python manage.py tms_sandbox_setup` (as root)."
        )
    return mode


@dataclass(frozen=True)
class RunUser:
    name: str
    uid: int
    gid: int
    #: The claim file; the supervisor removes it when the run is over.
    lock: str


class NoFreeRunUser(RuntimeError):
    """Every run user of the pool is busy with a run on this host."""


def _lock_dir() -> Path:
    path = Path(tms_settings().SUBPROCESS_RUN_USER_LOCKS)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _claim_is_stale(lock: Path) -> bool:
    """A claim whose run has ended (exit written, folder gone) or whose supervisor is gone."""
    try:
        data = json.loads(lock.read_text())
    except FileNotFoundError:
        return False
    except ValueError:
        # Half-written by a launcher that died: stale once it is old enough.
        return time.time() - lock.stat().st_mtime > 60
    run_dir = Path(str(data.get("run_dir", "")))
    # First: a claim younger than a minute is never taken, even before its run folder has its
    # launch marker (the claim comes first), or a run starting beside it would be killed.
    if time.time() - float(data.get("at", 0)) < 60:
        return False  # the launcher is still starting the supervisor
    if not (run_dir / "launch").exists():
        return True
    # Only a dead supervisor's claim is taken over: a live one gives it back itself, after
    # killing what the run left behind (an exit record alone does not mean it has done so).
    try:
        info = json.loads((run_dir / "supervisor.pid").read_text())
    except (OSError, ValueError):
        return True
    pid, start = info.get("pid"), info.get("start")
    return not isinstance(pid, int) or start_ticks(pid) is None or (start is not None and start_ticks(pid) != start)


def claim_run_user(run_dir: Path) -> RunUser:
    """Claim a free run user of the pool for the run in ``run_dir`` (NoFreeRunUser if none is)."""
    folder = _lock_dir()
    for name in run_user_names():
        lock = folder / name
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                if not _claim_is_stale(lock):
                    break
                # Moved aside first: of two workers reclaiming it, one wins the rename.
                aside = folder / f".stale.{name}.{os.getpid()}.{time.monotonic_ns()}"
                with contextlib.suppress(FileNotFoundError):
                    os.rename(lock, aside)
                    _reclaim(aside, pwd.getpwnam(name).pw_uid)
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump({"run_dir": str(run_dir), "at": time.time()}, fh)
            entry = pwd.getpwnam(name)
            return RunUser(name=name, uid=entry.pw_uid, gid=entry.pw_gid, lock=str(lock))
    raise NoFreeRunUser(f"all {len(run_user_names())} run users are busy on this host")


def _reclaim(claim: Path, uid: int) -> None:
    """Tidy what a dead supervisor left: the user's processes, its run folder's access."""
    kill_user(uid)
    with contextlib.suppress(OSError, ValueError):
        run_dir = json.loads(claim.read_text()).get("run_dir")
        if run_dir:
            os.chmod(run_dir, 0o700)
    claim.unlink(missing_ok=True)


def bwrap_argv(
    *, work: str, read_only: list[str], cwd: str, executable: str, argv: list[str], network: bool = True
) -> list[str]:
    """The bubblewrap command that runs ``argv`` with the view of the host described above."""
    bwrap = bwrap_path()
    assert bwrap is not None
    args = [bwrap, "--unshare-all"]
    if network:
        args.append("--share-net")
    args += ["--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--dir", "/etc"]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    # A private /tmp (a tmpfs of the sandbox's own), not the host's.
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]  # noqa: S108
    for path in read_only:
        args += ["--ro-bind-try", path, path]
    # The bwrap processes ignore SIGTERM (the supervisor sets that before exec; see
    # ``ignore_sigterm`` in run.json) so that a cancel's SIGTERM to the group reaches the command
    # and not only bwrap, which would take the command down at once; ``env`` gives the command
    # back the default disposition.
    args += ["--bind", work, work, "--chdir", cwd, "--", ENV, "--default-signal=TERM", executable, *argv[1:]]
    return args
