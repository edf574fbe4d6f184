"""The detached supervisor of one ``subprocess`` run: starts the command, waits for it, records how it ended.

:class:`runners.subprocess.SubprocessRunner` launches it as ``python -I <this file> <run folder>``.
The first process forks and exits at once (that is all the launcher waits for); the second one
calls ``setsid()``, so it leads a session of its own, is adopted by init and outlives the worker
that started it, even a worker killed with SIGKILL. It then:

1. records itself: a line in ``launches`` (the executor's own launch count) and ``supervisor.pid``;
2. reads ``run.json`` (argv, executable, cwd, environment, deadline, kill grace);
3. gives up at once if ``cancel`` exists; when ``run.json`` asks (user mode, and egress open),
   moves itself into a network namespace of its own, which the command inherits (only its
   loopback, or, with egress open, a tap of slirp4netns filtered by nftables rules: see
   :mod:`runners.sandbox`; bwrap mode with egress closed gets a namespace from bubblewrap);
4. starts the command in a process group of its own, with stdout and stderr going to the
   ``stdout`` and ``stderr`` files, and records ``pid``;
5. waits for it until the deadline, then SIGTERMs the group, and SIGKILLs it after the grace;
   meanwhile it measures the work folder now and then, and SIGKILLs the group when it holds more
   than the run's ``disk_bytes`` (whose contents are then removed);
6. SIGKILLs the group in any case (nothing the run started may keep running) and writes ``exit``
   atomically: return code, whether it timed out, whether it was cancelled, an error if any.

Standard library only, and run isolated (``-I``: no environment variables, no user site, and
not even this file's folder on ``sys.path``, where the ``subprocess`` package and ``email.py`` would
shadow the standard modules), so it starts in milliseconds and keeps no Django in memory for
the length of the run. The runner imports the file names below from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any

# ctypes, fcntl, select, shutil, socket and struct are imported where they are needed: every run
# starts this program, and a bwrap run with egress closed needs none of them (their import was a
# measurable part of a short run's start on a loaded machine).

# File names inside a run folder (see runners.subprocess.workdir for the whole layout).
RUN, LAUNCHES, SUPERVISOR_PID, PID = "run.json", "launches", "supervisor.pid", "pid"
STDOUT, STDERR, EXIT, CANCEL = "stdout", "stderr", "exit", "cancel"
#: Exit codes that mean the program could not be executed or found, as a shell reports them.
NOT_EXECUTABLE, NOT_FOUND = 126, 127
#: run.json's "rlimits" keys -> resource limits set in the command's process before exec.
RLIMITS = {
    "cpu_seconds": resource.RLIMIT_CPU,
    "memory_bytes": resource.RLIMIT_AS,
    "file_bytes": resource.RLIMIT_FSIZE,
    "processes": resource.RLIMIT_NPROC,
    "open_files": resource.RLIMIT_NOFILE,
}


def path(run_dir: str, name: str) -> str:
    return os.path.join(run_dir, name)


def write_json(run_dir: str, name: str, data: dict[str, Any]) -> None:
    """Write ``data`` so that readers see either nothing or the whole document, even after a crash."""
    tmp = path(run_dir, f"{name}.tmp.{os.getpid()}")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path(run_dir, name))


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc``), or None if it cannot be read.

    Recorded next to each pid so that a reader can tell the process from a later one that
    reused its pid.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def killpg(pgid: int, sig: int) -> None:
    """Signal a process group that may be gone already."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def cancelled(run_dir: str) -> bool:
    return os.path.exists(path(run_dir, CANCEL))


def finish(run_dir: str, **outcome: Any) -> None:
    """Write the ``exit`` record; whether the run was cancelled is read from the folder."""
    outcome.setdefault("returncode", None)
    outcome.setdefault("timed_out", False)
    outcome["cancelled"] = cancelled(run_dir)
    outcome["finished_at"] = time.time()
    write_json(run_dir, EXIT, outcome)


def detach() -> None:
    """Leave the launcher behind: fork, let the parent exit, lead a new session in the child."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    become_subreaper()
    # Everything the supervisor creates (stdout, stderr, pid, exit) is for the worker only.
    os.umask(0o077)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


#: prctl option (linux/prctl.h): orphaned descendants are re-parented to this process.
PR_SET_CHILD_SUBREAPER = 36
#: How long the supervisor waits for the run user's killed processes to end (D state is slow).
REAP_SECONDS = 5.0


def become_subreaper() -> None:
    """Adopt the run's orphans (what it started in a new session, then left behind), so that the
    supervisor reaps them itself. Left to PID 1 they stay zombies until it reaps them, and in a
    container whose PID 1 reaps late or never, every zombie of a run user counts against that
    user's RLIMIT_NPROC: the next run on the user could not fork."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _user_processes(uid: int) -> list[tuple[int, int, bool]]:
    """(pid, parent pid, is a zombie) of every process of ``uid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
        except OSError:
            continue
        if str(uid) in fields.get("Uid", "").split():
            state = fields.get("State", "").strip()
            found.append((int(entry.name), int(fields.get("PPid", "0")), state.startswith(("Z", "X"))))
    return found


def reap_user(uid: int) -> None:
    """After ``kill_user``: wait until none of the run user's processes is left alive and reap
    those that ended as the supervisor's children (it is their subreaper), so that the user's
    process count is back to nought before the user is given back. A zombie of another parent
    is not the supervisor's to reap and does not hold it up."""
    me, deadline = os.getpid(), time.monotonic() + REAP_SECONDS
    while True:
        waiting = False
        processes = _user_processes(uid)
        users = {pid for pid, _, _ in processes}
        for pid, parent, zombie in processes:
            if parent == me:
                with contextlib.suppress(ChildProcessError):
                    # Reaped or not, look again: reaping a zombie parent hands its own zombie
                    # children (read above with that parent) to the supervisor, its subreaper.
                    os.waitpid(pid, os.WNOHANG)
                    waiting = True
            elif not zombie or parent in users:
                # Alive, or a zombie whose parent (the run user's) has yet to end and be reaped.
                waiting = True
        if not waiting or time.monotonic() > deadline:
            return
        time.sleep(0.005)


def record_start(run_dir: str) -> None:
    """Count this launch and publish the supervisor's own pid (with its start time)."""
    with open(path(run_dir, LAUNCHES), "a") as fh:
        fh.write(f"{os.getpid()} {time.time()}\n")
    write_json(run_dir, SUPERVISOR_PID, {"pid": os.getpid(), "start": start_ticks(os.getpid())})


def limiter(limits: dict[str, int], *, ignore_sigterm: bool = False) -> Any:
    """A function that sets ``limits`` (soft = hard: the command cannot raise them) in the child.

    Runs after the switch to the run user (Popen's order), so RLIMIT_NPROC counts that user's
    processes. The CPU limit's hard value is a second above the soft one: SIGXCPU first, then
    SIGKILL for a program that ignores it.
    """

    def apply() -> None:
        if ignore_sigterm:
            # Inherited by bwrap (see runners.sandbox.bwrap_argv), which must outlive the
            # command's own handling of a SIGTERM sent to the group.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for name, value in limits.items():
            kind = RLIMITS[name]
            resource.setrlimit(kind, (value, value + 1 if kind == resource.RLIMIT_CPU else value))

    return apply


def start_command(run_dir: str, spec: dict[str, Any]) -> subprocess.Popen[bytes] | None:
    """Start the command in a process group of its own; None (with ``exit`` written) if it cannot run.

    With a run user the child drops privileges (setgroups, setgid, setuid) before exec, then
    applies the resource limits; stdout and stderr stay files of the worker's, which the command
    writes through the descriptors it inherits (RLIMIT_FSIZE bounds them as they grow).
    """
    user = spec.get("user")
    identity: dict[str, Any] = {}
    if user:
        identity = {"user": user["uid"], "group": user["gid"], "extra_groups": []}
    limits = {name: int(value) for name, value in (spec.get("rlimits") or {}).items() if name in RLIMITS}
    try:
        with open(path(run_dir, STDOUT), "wb") as out, open(path(run_dir, STDERR), "wb") as err:
            return subprocess.Popen(
                spec["argv"],
                executable=spec["executable"],
                cwd=spec["cwd"],
                env=spec["env"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                close_fds=True,
                start_new_session=True,
                preexec_fn=limiter(limits, ignore_sigterm=bool(spec.get("ignore_sigterm"))),
                **identity,
            )
    except OSError as exc:
        code = NOT_FOUND if isinstance(exc, FileNotFoundError) else NOT_EXECUTABLE
        finish(run_dir, returncode=code, error=f"cannot execute: {exc}")
        return None


#: Seconds between two measures of the work folder, at least; a slow measure (many files) waits
#: ten times as long as it took, so that measuring never costs more than a tenth of a core.
DISK_CHECK_SECONDS = 0.5


def over_disk(spec: dict[str, Any]) -> str | None:
    """Why the run holds more disk than it may, or None: its work folder past ``disk_bytes``, or
    (user mode) its files in the host's shared temporary folders past ``tmp_bytes``."""
    disk = spec.get("disk")
    if not disk:
        return None
    used = disk_usage(disk["path"])
    if used > int(disk["limit"]):
        return (
            f"disk limit exceeded: the work folder held {used} bytes, more than the run's disk_bytes "
            f"{int(disk['limit'])}; its contents were removed"
        )
    shared, user = disk.get("shared"), spec.get("user")
    if shared and user:
        used = sum(disk_usage(entry) for entry in owned_entries(shared, int(user["uid"])))
        if used > int(disk["tmp_limit"]):
            return (
                f"tmp limit exceeded: the run's files in {', '.join(shared)} held {used} bytes, more than the "
                f"run's tmp_bytes {int(disk['tmp_limit'])}; they were removed"
            )
    return None


def owned_entries(folders: list[str], uid: int) -> list[str]:
    """The entries of ``folders`` (not below them) that belong to ``uid``: what a run user put in
    the host's shared temporary folders (it can create nothing elsewhere in them)."""
    found = []
    for folder in folders:
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        found.append(entry.path)
    return found


def wait_for_command(proc: subprocess.Popen[bytes], spec: dict[str, Any]) -> tuple[int, bool, str | None]:
    """Wait until the command ends, the deadline passes or the run holds more disk than it may:
    (return code, whether it timed out, why it held too much).

    At the deadline the group gets SIGTERM, and SIGKILL if it is still there after the grace; over
    the disk limit, SIGKILL at once.
    """
    disk = spec.get("disk")
    pause = DISK_CHECK_SECONDS
    while True:
        remaining = max(0.0, spec["deadline"] - time.time())
        try:
            return proc.wait(timeout=min(remaining, pause) if disk else remaining), False, None
        except subprocess.TimeoutExpired:
            pass
        if time.time() >= spec["deadline"]:
            break
        began = time.monotonic()
        used = over_disk(spec)
        pause = max(DISK_CHECK_SECONDS, 10 * (time.monotonic() - began))
        if used is not None:
            killpg(proc.pid, signal.SIGKILL)
            return proc.wait(), False, used
    killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=spec["kill_grace"]), True, None
    except subprocess.TimeoutExpired:
        killpg(proc.pid, signal.SIGKILL)
        return proc.wait(), True, None


CLONE_NEWNET = 0x40000000
#: ioctls and flag to bring an interface up (linux/sockios.h, linux/if.h).
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
#: How long slirp4netns may take to configure the run's tap.
SLIRP_READY_SECONDS = 10.0


class NetworkError(Exception):
    """The run's network namespace could not be set up: the command must not start."""


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _errno() -> int:
    import ctypes

    return ctypes.get_errno()


def _interface_up(name: bytes) -> None:
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh22x", name, 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh22x", name, flags | IFF_UP))


class Network:
    """The run's network namespace, which is this supervisor's own from :meth:`isolate` on.

    The command inherits it (in bwrap mode through ``--share-net``). With egress open,
    slirp4netns runs in the host's namespace (it goes back there before exec) and attaches a
    tap to ours; it ends when :meth:`close` closes its exit pipe, or with this process.
    """

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.slirp: subprocess.Popen[bytes] | None = None
        self._exit_fd: int | None = None

    def isolate(self, run_dir: str) -> None:
        libc = _libc()
        host = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.unshare(CLONE_NEWNET) != 0:
                error = _errno()
                raise NetworkError(f"cannot create a network namespace: {os.strerror(error)}")
            _interface_up(b"lo")
            egress = self.plan.get("egress")
            if egress:
                ready = self._start_slirp(run_dir, egress, host, libc)
                try:
                    # Loaded while slirp4netns configures the tap: the rules do not name it.
                    self._load_rules(egress)
                    self._wait_until_ready(ready)
                finally:
                    os.close(ready)
        finally:
            os.close(host)

    def _start_slirp(self, run_dir: str, egress: dict[str, Any], host: int, libc: Any) -> int:
        """Start slirp4netns on this namespace; the pipe it writes "1" to once the tap is configured."""
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()

        def back_to_the_host() -> None:
            if libc.setns(host, CLONE_NEWNET) != 0:
                raise OSError(_errno(), "setns to the host's network namespace")

        try:
            with open(path(run_dir, "slirp4netns.log"), "wb") as log:
                self.slirp = subprocess.Popen(
                    [
                        egress["slirp4netns"], "--configure", "--mtu=65520", "--disable-host-loopback",
                        "--enable-sandbox", "--enable-seccomp", f"--ready-fd={ready_w}", f"--exit-fd={exit_r}",
                        str(os.getpid()), "tap0",
                    ],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(ready_w, exit_r),
                    preexec_fn=back_to_the_host, start_new_session=True,
                )  # fmt: skip
        except OSError as exc:
            os.close(exit_w)
            os.close(ready_r)
            raise NetworkError(f"cannot start slirp4netns: {exc}") from exc
        finally:
            os.close(ready_w)
            os.close(exit_r)
        self._exit_fd = exit_w
        return ready_r

    @staticmethod
    def _wait_until_ready(ready_r: int) -> None:
        import select

        readable, _, _ = select.select([ready_r], [], [], SLIRP_READY_SECONDS)
        ready = os.read(ready_r, 1) if readable else b""
        if ready != b"1":
            raise NetworkError(f"slirp4netns did not configure the run's network in {SLIRP_READY_SECONDS:g} s")

    @staticmethod
    def _load_rules(egress: dict[str, Any]) -> None:
        done = subprocess.run(
            [egress["nft"], "-f", "-"], input=egress["rules"].encode(), capture_output=True, check=False, timeout=30
        )
        if done.returncode != 0:
            raise NetworkError(f"nft refused the run's rules: {done.stderr.decode(errors='replace').strip()}")

    def close(self) -> None:
        """End slirp4netns, if it runs (closing its exit pipe), and reap it."""
        if self._exit_fd is not None:
            os.close(self._exit_fd)
            self._exit_fd = None
        if self.slirp is not None:
            try:
                self.slirp.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.slirp.kill()
                self.slirp.wait()


def disk_usage(folder: str) -> int:
    """Bytes of disk held by ``folder`` and everything under it (allocated blocks; links not followed)."""
    try:
        top = os.lstat(folder)
    except OSError:
        return 0
    if not os.path.isdir(folder) or os.path.islink(folder):
        return top.st_blocks * 512
    total = 0
    stack = [folder]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return total


def remove(paths: list[str]) -> None:
    """Remove files and folders (whole trees), whatever is already gone."""
    import shutil

    for item in paths:
        if os.path.isdir(item) and not os.path.islink(item):
            shutil.rmtree(item, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(item)


def empty_folder(folder: str) -> None:
    """Remove what ``folder`` holds (the folder itself stays)."""
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        remove([entry.path for entry in entries])


def kill_user(uid: int) -> None:
    """SIGKILL every process of the run user: kill(-1) from a child that became that user."""
    if uid in (0, os.getuid()):
        return
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def release(run_dir: str, spec: dict[str, Any]) -> None:
    """After the run: close the folder to everyone but the worker, give the run user back."""
    user = spec.get("user")
    if not user:
        return
    # The run user goes to another run next: it must not reach this run's work folder.
    with contextlib.suppress(OSError):
        os.chmod(run_dir, 0o700)
    lock = user.get("lock")
    if lock:
        with contextlib.suppress(OSError, ValueError):
            with open(lock) as fh:
                mine = json.load(fh).get("run_dir") == run_dir
            if mine:
                os.unlink(lock)


def supervise(run_dir: str) -> None:
    """Everything after detaching: run the command described in ``run.json`` to its end."""
    record_start(run_dir)
    # Read while still privileged: run.json (secrets, callback token) is the worker's, 0600.
    with open(path(run_dir, RUN)) as fh:
        spec = json.load(fh)
    try:
        run(run_dir, spec)
    finally:
        release(run_dir, spec)


def run(run_dir: str, spec: dict[str, Any]) -> None:
    if cancelled(run_dir):
        finish(run_dir, error="cancelled before the command started")
        return
    network = Network(spec["network"]) if (spec.get("network") or {}).get("isolate") else None
    try:
        if network is not None:
            try:
                network.isolate(run_dir)
            except (NetworkError, OSError) as exc:
                finish(run_dir, error=f"the run's network could not be set up: {exc}")
                return
        supervise_command(run_dir, spec)
    finally:
        if network is not None:
            network.close()


def supervise_command(run_dir: str, spec: dict[str, Any]) -> None:
    """Start the command, wait for it, clean up after it, write ``exit``."""
    proc = start_command(run_dir, spec)
    if proc is None:
        return
    write_json(run_dir, PID, {"pid": proc.pid, "pgid": proc.pid, "start": start_ticks(proc.pid)})
    # Hand a SIGTERM meant for us (host shutdown, an operator) on to the command.
    signal.signal(signal.SIGTERM, lambda *_: killpg(proc.pid, signal.SIGTERM))
    if cancelled(run_dir):  # a cancel that came before the pid file could be seen
        killpg(proc.pid, signal.SIGTERM)
    returncode, timed_out, too_large = wait_for_command(proc, spec)
    # The run is over: nothing it started may keep running, not even what left the group.
    killpg(proc.pid, signal.SIGKILL)
    if spec.get("user"):
        kill_user(int(spec["user"]["uid"]))
        reap_user(int(spec["user"]["uid"]))
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    extra: dict[str, Any] = {}
    if too_large is None:
        too_large = over_disk(spec)  # a short run may have written it all between two measures
    if too_large is not None:
        # Kept for days otherwise: the folder is emptied, so that no run holds more than its limit.
        empty_folder(spec["disk"]["path"])
        extra = {"error": too_large}
    shared = (spec.get("disk") or {}).get("shared")
    if shared and spec.get("user"):
        # The uid goes to another task's run next: what this run left in /tmp must not be there.
        remove(owned_entries(shared, int(spec["user"]["uid"])))
    finish(run_dir, returncode=returncode, timed_out=timed_out, cpu_seconds=usage.ru_utime + usage.ru_stime, **extra)


def main(argv: list[str]) -> int:
    """``<this file> <run folder>``: detach, then supervise the run."""
    run_dir = argv[1]
    detach()
    supervise(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
