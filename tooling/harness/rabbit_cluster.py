"""A private three-node RabbitMQ cluster of the installed ``rabbitmq-server``, for the high-
availability tests (tests/ha) and for a person to try (``make ha-broker``).

Every node runs on ports and folders of its own (AMQP 56721-56723, Erlang distribution
46721-46723, data, logs, pid files, config and cookie under one ``/tmp/tms-ha-*`` folder), never
on the shared node of port 5672 (``rabbit@localhost``), its files or its configuration:
``/etc/rabbitmq/rabbitmq.conf`` names port 5672 and ``rabbitmq-env.conf`` that node's name, so
each node is given a configuration file and an environment file of its own. ``rabbitmqctl`` is
only ever run with ``-n`` one of these nodes, and with ``HOME`` the private folder, whose
``.erlang.cookie`` the nodes and the CLI share (the shared node's cookie is not read).

The nodes are started by ``/usr/lib/rabbitmq/bin/rabbitmq-server`` directly (``/usr/sbin``'s
wrapper switches to the ``rabbitmq`` user, which cannot write here), each as the leader of a
process session, so that :meth:`RabbitCluster.close` can kill whatever a node started (its
``epmd`` excepted: the machine's one, on 127.0.0.1:4369, serves every node) even when a test
fails half-way. No plugin is enabled (management is off).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tooling.harness.servers import ClusterNode, Started, command_loop, kill_session, listening, run_tool

RABBITMQ_BIN = Path(os.environ.get("TMS_HA_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
#: AMQP ports of the nodes, and their Erlang distribution ports.
AMQP_PORTS = (56721, 56722, 56723)
DIST_PORTS = (46721, 46722, 46723)
#: Ports the CLI (rabbitmqctl) takes for its own distribution connection.
CTL_DIST_PORTS = (46731, 46750)
#: How long a node may take to boot (a loaded 2-core machine: about 5-10 s each).
BOOT_TIMEOUT = 90.0


@dataclass
class Node(ClusterNode):
    #: Erlang distribution (the nodes' links to each other).
    dist_port: int = field(kw_only=True)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"


class RabbitCluster(Started):
    """Three nodes ``tmsha1@localhost`` .. ``tmsha3@localhost``, clustered with ``join_cluster``.

    Use as a context manager (or call :meth:`start` and :meth:`close`); :meth:`stop_node` and
    :meth:`start_node` take one node away and bring it back, its data kept.
    """

    def __init__(
        self,
        *,
        root: Path | None = None,
        prefix: str = "tmsha",
        ports: tuple[int, int, int] = AMQP_PORTS,
        dist_ports: tuple[int, int, int] = DIST_PORTS,
    ) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="tms-ha-rabbit-", dir="/tmp"))
        self._own_root = root is None
        self.nodes = [
            Node(i, f"{prefix}{i + 1}@localhost", ports[i], self.root / f"node{i + 1}", dist_port=dist_ports[i])
            for i in range(3)
        ]
        self.home = self.root / "home"

    # -- set-up ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The failover URL list kombu takes: every node, the first one first."""
        return ";".join(node.url for node in self.nodes)

    def _prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(secrets.token_hex(20).upper())
            cookie.chmod(0o400)
        for node in self.nodes:
            for sub in ("mnesia", "log"):
                (node.base / sub).mkdir(parents=True, exist_ok=True)
            (node.base / "enabled_plugins").write_text("[].\n")
            (node.base / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's (the shared node)
            (node.base / "rabbitmq.conf").write_text(
                f"listeners.tcp.1 = 127.0.0.1:{node.port}\n"
                # A node that loses its peers keeps serving (the tests stop nodes on purpose).
                "cluster_partition_handling = ignore\n"
                # The shared machine's disk is not this cluster's concern.
                "disk_free_limit.absolute = 50MB\n"
                "log.console = false\n"
                "log.file.level = info\n"
            )

    def env(self, node: Node) -> dict[str, str]:
        """The environment of ``node``'s server and of the CLI that addresses it."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(self.home),
            RABBITMQ_CONF_ENV_FILE=str(node.base / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(node.base / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(node.base / "advanced.config"),
            RABBITMQ_NODENAME=node.name,
            RABBITMQ_USE_LONGNAME="false",
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(node.port),
            RABBITMQ_DIST_PORT=str(node.dist_port),
            RABBITMQ_CTL_DIST_PORT_MIN=str(CTL_DIST_PORTS[0]),
            RABBITMQ_CTL_DIST_PORT_MAX=str(CTL_DIST_PORTS[1]),
            RABBITMQ_MNESIA_BASE=str(node.base / "mnesia"),
            RABBITMQ_LOG_BASE=str(node.base / "log"),
            RABBITMQ_PID_FILE=str(node.base / "rabbitmq.pid"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(node.base / "enabled_plugins"),
            ERL_EPMD_ADDRESS="127.0.0.1",
            # One scheduler: the machine's cores are shared, and a test cluster carries little.
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+S 1:1 +A 4 -kernel inet_dist_use_interface {127,0,0,1}",
        )
        return env

    def ctl(self, node: Node, *args: str, timeout: float = 60.0, check: bool = True) -> str:
        """``rabbitmqctl -n <node> args``; the output, or :class:`RuntimeError` on failure."""
        argv = [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", node.name, *args]
        what = f"rabbitmqctl -n {node.name} {' '.join(args)}"
        return run_tool(argv, what=what, env=self.env(node), timeout=timeout, check=check)

    def _spawn(self, node: Node) -> None:
        log = open(node.base / "server.out", "ab")  # noqa: SIM115 - the child keeps it
        try:
            node.popen = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                env=self.env(node),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()

    def _wait_booted(self, node: Node, timeout: float = BOOT_TIMEOUT) -> None:
        """Until ``node`` accepts AMQP connections (its app is running)."""
        deadline = time.monotonic() + timeout
        while True:
            if node.popen is not None and node.popen.poll() is not None:
                raise RuntimeError(f"{node.name} exited ({node.popen.returncode}): see {node.base / 'log'}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", node.port), timeout=1):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.name} did not start in {timeout:g}s: see {node.base / 'log'}")
            time.sleep(0.2)

    def start(self) -> RabbitCluster:
        """Boot the three nodes (at once), then join the second and third to the first."""
        busy = [port for node in self.nodes for port in (node.port, node.dist_port) if listening(port)]
        if busy:
            raise RuntimeError(f"ports {busy} are in use: another private cluster is running (make ha-broker?)")
        self._prepare()
        try:
            for node in self.nodes:
                self._spawn(node)
            for node in self.nodes:
                self._wait_booted(node)
            first = self.nodes[0]
            for node in self.nodes[1:]:
                self.ctl(node, "stop_app")
                self.ctl(node, "join_cluster", first.name)
                self.ctl(node, "start_app")
            self.wait_cluster(3)
        except BaseException:
            self.close()
            raise
        return self

    def running_nodes(self, via: Node | None = None) -> list[str]:
        """The cluster's running nodes, as ``via`` (default: the first running one) sees them."""
        node = via or next((n for n in self.nodes if n.running), None)
        if node is None:
            return []
        out = self.ctl(node, "eval", "rabbit_nodes:all_running().")
        return sorted(name.strip(" '") for name in out.strip().strip("[]").split(",") if name.strip())

    def wait_cluster(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.running_nodes()) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster has not {count} running nodes after {timeout:g}s")
            time.sleep(0.3)

    # -- faults ---------------------------------------------------------------------------------

    def queue_home(self, queue: str, vhost: str = "/") -> str:
        """The node a classic queue lives on ('' when no running node knows it)."""
        return self._queue_column(queue, "pid", vhost).strip("<>").split(".")[0]

    def queue_leader(self, queue: str, vhost: str = "/") -> str:
        """The node leading a quorum queue ('' when no running node knows it, or it has no leader
        now: an election under way)."""
        return self._queue_column(queue, "leader", vhost)

    def _queue_column(self, queue: str, column: str, vhost: str) -> str:
        """A column of ``rabbitmqctl list_queues`` for ``queue``, from the first running node that
        knows it ('' when none does)."""
        for node in self.nodes:
            if node.running:
                for line in self.ctl(
                    node, "list_queues", "-p", vhost, "name", column, "--no-table-headers", "-q"
                ).splitlines():
                    name, _, value = line.partition("\t")
                    if name == queue:
                        return value.strip()
        return ""

    def node_named(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def stop_node(self, node: Node, timeout: float = 60.0) -> None:
        """Stop ``node``'s Erlang VM (``rabbitmqctl stop``, as an operator or a crash would take it
        away); its data stays for :meth:`start_node`."""
        if not node.running:
            return
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.ctl(node, "stop", timeout=timeout)
        assert node.popen is not None
        try:
            node.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_session(node.popen.pid)
            node.popen.wait(10)

    def kill_node(self, node: Node) -> None:
        """SIGKILL ``node`` and everything it started (a crash)."""
        if node.popen is not None:
            kill_session(node.popen.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.popen.wait(10)

    def start_node(self, node: Node) -> None:
        """Start ``node`` again (it rejoins the cluster from its data) and wait until it serves."""
        if node.running:
            return
        self._spawn(node)
        self._wait_booted(node)

    # -- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every node (and all its processes) and delete the cluster's folder, whatever
        state the nodes are in."""
        for node in self.nodes:
            if node.popen is not None:
                kill_session(node.popen.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.popen.wait(10)
        # A node whose launcher died before it (or a crash of this process earlier) leaves a VM
        # found only by its pid file.
        for node in self.nodes:
            with contextlib.suppress(OSError, ValueError):
                pid = int((node.base / "rabbitmq.pid").read_text().strip())
                if _is_our_beam(pid, node):
                    os.kill(pid, signal.SIGKILL)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)


def _is_our_beam(pid: int, node: Node) -> bool:
    """Whether ``pid`` is the Erlang VM of ``node`` (its command line names the node), so that a
    stale pid file never makes us kill another process."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return node.name.encode() in cmdline or any(node.name.encode() in arg for arg in cmdline)


def main() -> None:
    """``make ha-broker``: start the cluster, print its URL list, then take commands from the
    terminal (``stop N``, ``kill N``, ``start N``, ``status``) until ``quit`` or Ctrl-C, which stop
    every node and delete its folder."""
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    with RabbitCluster() as cluster:
        print(f"Three RabbitMQ nodes running in {cluster.root}:")
        for node in cluster.nodes:
            print(f"  {node.index + 1}: {node.name}  amqp 127.0.0.1:{node.port}")
        # Quorum queues: the type that survives the loss of the node leading a queue (docs/deployment.md).
        print(f"\nexport CELERY_BROKER_URL='{cluster.url}' TMS_QUEUE_TYPE=quorum\n")

        def on_node(action: str) -> Callable[[str], str]:
            def act(number: str) -> str:
                if number not in ("1", "2", "3"):
                    raise ValueError("N is 1, 2 or 3")
                node = cluster.nodes[int(number) - 1]
                getattr(cluster, f"{action}_node")(node)
                return f"{action} {node.name}: done"

            return act

        def status() -> str:
            return "running: " + (", ".join(cluster.running_nodes()) or "none")

        commands: dict[str, Callable[..., str]] = {action: on_node(action) for action in ("stop", "kill", "start")}
        commands["status"] = status
        command_loop("ha-broker", commands, "stop N | kill N | start N (N: 1, 2 or 3) | status")


if __name__ == "__main__":
    main()
