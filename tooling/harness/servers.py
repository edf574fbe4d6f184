"""What the harness's private servers share (the RabbitMQ cluster, the Patroni pair, PgBouncer,
HAProxy): free ports on 127.0.0.1, a process run in the foreground as the leader of a session of
its own and killed with that session whatever happened, a folder of its own under /tmp deleted
with it, and the little terminal loop of the ``make ha-*`` targets.

Nothing here knows Django: the harness starts these servers before any TMS process exists.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now (a test's cluster: several pytest
    processes may each start one)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_listening(popen: subprocess.Popen[bytes], ports: Iterable[int], what: str, timeout: float) -> None:
    """Until every port of ``ports`` accepts connections; RuntimeError if ``popen`` exits first
    or ``timeout`` seconds pass."""
    ports = list(ports)
    deadline = time.monotonic() + timeout
    while not all(listening(port) for port in ports):
        if popen.poll() is not None:
            raise RuntimeError(f"{what} exited ({popen.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen on {ports} in {timeout:g}s")
        time.sleep(0.05)


def kill_session(sid: int) -> None:
    """SIGKILL every process of the session ``sid`` leads, those that left its process group
    too (a launcher script's children, an Erlang VM's helpers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(ProcessLookupError, PermissionError, FileNotFoundError):
                if os.getsid(int(entry)) == sid:
                    os.kill(int(entry), signal.SIGKILL)


def run_tool(
    argv: list[str], *, what: str, timeout: float, env: Mapping[str, str] | None = None, check: bool = True
) -> str:
    """Run a server's command-line tool (psql, patronictl, rabbitmqctl) with no input (the Erlang
    CLI would read the terminal of a ``make ha-*`` target) and return what it printed; with
    ``check``, RuntimeError saying ``what`` ran (not the whole command line: a DSN may hold a
    password) and all it printed when it fails."""
    result = subprocess.run(
        argv,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"{what}: {result.stdout}{result.stderr}".strip())
    return result.stdout


class Started:
    """What a server or a cluster of them is to its caller: :meth:`start` (returns itself, ready)
    and :meth:`close` (stops it, whatever state it is in), so ``with X(...) as x:`` closes it
    however the block ends."""

    def start(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class ClusterNode:
    """One node of a private cluster (the Patroni pair's, the RabbitMQ cluster's): its index, its
    name, the port clients reach it on, its folder and, while it was started, its process. A
    node type adds its other ports as keyword-only fields."""

    index: int
    name: str
    port: int
    base: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class ForegroundServer(Started):
    """A server process of a Debian package run in the foreground, with its files in a folder of
    its own (``/tmp/<prefix>*``): the base of :class:`~tooling.harness.pgbouncer.PgBouncer` and
    :class:`~tooling.harness.haproxy.HAProxy`.

    A subclass writes its configuration and calls :meth:`_launch` from its :meth:`start`; its
    output goes to :attr:`output_log`, and :meth:`log_text` reads that and the ``log_files`` it
    names. Use as a context manager: :meth:`close` kills the session and deletes the folder.
    """

    #: What messages call it.
    what = "server"
    #: Files of the folder :meth:`log_text` reads after :attr:`output_log` (the server's own log).
    log_files: tuple[str, ...] = ()
    start_timeout = 15.0

    def __init__(self, prefix: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def output_log(self) -> Path:
        return self.root / "output.log"

    def _launch(self, argv: list[str], *, ports: Iterable[int], env: Mapping[str, str] | None = None) -> None:
        """Start ``argv`` in the folder, as the leader of a new session, and wait until it
        listens on every one of ``ports``; if it does not, close and raise RuntimeError with the
        end of its logs."""
        with open(self.output_log, "ab") as out:
            self.popen = subprocess.Popen(
                argv,
                env=None if env is None else dict(env),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_listening(self.popen, ports, self.what, self.start_timeout)
        except RuntimeError as exc:
            output = self.log_text()
            self.close()
            raise RuntimeError(f"{exc}:\n{output[-2000:]}") from None

    def log_text(self) -> str:
        parts = []
        for path in (self.output_log, *(self.root / name for name in self.log_files)):
            with contextlib.suppress(OSError):
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def close(self) -> None:
        """Kill the process's session (the connections through it close with it) and delete the folder."""
        if self.popen is not None:
            kill_session(self.popen.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
            self.popen = None
        shutil.rmtree(self.root, ignore_errors=True)


def command_loop(prompt: str, commands: Mapping[str, Callable[..., str]], usage: str) -> None:
    """The terminal of a ``make ha-*`` target: read ``<command> [argument...]`` lines and print
    what the command answers, until ``quit``, end of input or Ctrl-C (SIGTERM too). A command
    that fails (RuntimeError, or arguments it does not take) prints why and the loop goes on."""
    print(f"Commands: {usage} | quit (Ctrl-C also stops everything).", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt, EOFError):
        while True:
            words = input(f"{prompt}> ").split()
            if not words:
                continue
            if words == ["quit"]:
                return
            command = commands.get(words[0])
            if command is None:
                print(f"usage: {usage} | quit")
                continue
            try:
                print(command(*words[1:]), flush=True)
            except (RuntimeError, TypeError, ValueError) as exc:
                print(f"{words[0]} failed: {exc}", flush=True)
