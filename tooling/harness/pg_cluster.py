"""A private Patroni-managed PostgreSQL pair (one etcd, two PostgreSQL 15 nodes, synchronous
replication), for the high-availability tests (tests/ha) and for a person to try (``make ha-db``).

Everything runs on ports and folders of its own (free ports chosen at start, data, logs and
configuration under one ``/tmp/tms-ha-pg-*`` folder), never the shared PostgreSQL of port 5432
or its cluster in ``/etc/postgresql``: the servers are started by Patroni from
``/usr/lib/postgresql/15/bin`` with a data directory, a port and a socket directory of their own.
PostgreSQL refuses to run as root, so when this runs as root the folder is given to the
``postgres`` user and etcd and Patroni run as that user.

The Patroni timings (bootstrap DCS settings) are chosen for a fast failover; Patroni requires
``ttl >= loop_wait + 2 * retry_timeout``:

- ``loop_wait: 1``: each Patroni looks at its node and the leader key every second, so a dead
  primary is noticed, and a free leader key taken, within about a second;
- ``retry_timeout: 3``: a DCS or PostgreSQL call is retried this long before Patroni gives up
  (etcd and the nodes share one machine: 3 s is generous);
- ``ttl: 10`` (>= 1 + 2 * 3): the leader key of a primary whose Patroni died (not only its
  PostgreSQL) expires after 10 s; a crashed postmaster is noticed by its own Patroni, which,
  with ``primary_start_timeout: 0``, releases the key at once instead of restarting the server
  in place (Patroni 3.0's default is 300 s of waiting for that restart);
- ``synchronous_mode: true``: a commit is acknowledged once the standby has it, so a run TMS saw
  committed survives the failover; not strict, so a primary left alone keeps accepting writes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tooling.harness.servers import (
    ClusterNode,
    Started,
    command_loop,
    free_ports,
    kill_session,
    listening,
    run_tool,
    wait_listening,
)

PG_BIN = Path(os.environ.get("TMS_HA_PG_BIN", "/usr/lib/postgresql/15/bin"))
#: The DCS timings (see the module's docstring).
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 1, 3
#: How long the pair may take to bootstrap (initdb, then a base backup for the standby).
BOOT_TIMEOUT = 120.0
DATABASE = "tms"


@dataclass
class PgNode(ClusterNode):
    #: Patroni's REST API.
    rest_port: int = field(kw_only=True)

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def config(self) -> Path:
        return self.base / "patroni.yml"

    def dsn(self, dbname: str = DATABASE) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname} connect_timeout=3"

    def postmaster_pid(self) -> int | None:
        """The pid of this node's postmaster (first line of ``postmaster.pid``), None when none runs."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if _cmdline_has(pid, str(self.data_dir)) else None


class PgCluster(Started):
    """etcd and two Patroni nodes ``<scope>-1`` and ``<scope>-2``; the first bootstraps the
    cluster and creates the ``tms`` database, the second becomes its synchronous standby.

    Use as a context manager (or :meth:`start` and :meth:`close`). :attr:`url` is the libpq
    multi-host URL TMS takes; :meth:`kill_primary` (SIGKILL of the primary's postmaster),
    :meth:`switchover` and :meth:`roles` drive and observe it.
    """

    def __init__(self, *, root: Path | None = None, scope: str | None = None, ports: list[int] | None = None) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="tms-ha-pg-", dir="/tmp"))
        self._own_root = root is None
        self.scope = scope or f"tmsha{os.getpid()}"
        pg1, pg2, rest1, rest2, self.etcd_port, self.etcd_peer_port = ports or free_ports(6)
        self.nodes = [
            PgNode(0, f"{self.scope}-1", pg1, self.root / "node1", rest_port=rest1),
            PgNode(1, f"{self.scope}-2", pg2, self.root / "node2", rest_port=rest2),
        ]
        self.etcd: subprocess.Popen[bytes] | None = None
        self._user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    # -- addresses ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The libpq multi-host URL: libpq tries each host in turn and keeps the one that accepts
        writes (``target_session_attrs=read-write``), which after a failover is the new primary."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write"

    # -- set-up ---------------------------------------------------------------------------------

    def _config(self, node: PgNode) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "name": node.name,
            "log": {"dir": str(node.base), "level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{node.rest_port}", "connect_address": f"127.0.0.1:{node.rest_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": True,
                    "primary_start_timeout": 0,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "remove_data_directory_on_rewind_failure": True,
                        "remove_data_directory_on_diverged_timelines": True,
                        "parameters": {
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",
                            "max_wal_senders": 5,
                            "max_replication_slots": 5,
                            "max_connections": 100,
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.port}",
                "connect_address": f"127.0.0.1:{node.port}",
                "data_dir": str(node.data_dir),
                "bin_dir": str(PG_BIN),
                "pgpass": str(node.base / "pgpass"),
                # The standby's base backup starts at once, not after a spread checkpoint (minutes).
                "basebackup": [{"checkpoint": "fast"}],
                "authentication": {"superuser": {"username": "postgres"}, "replication": {"username": "postgres"}},
                "parameters": {
                    "unix_socket_directories": str(node.base),
                    "shared_buffers": "32MB",
                    "fsync": "on",
                    "logging_collector": "off",
                },
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    def _prepare(self) -> None:
        for node in self.nodes:
            node.base.mkdir(parents=True, exist_ok=True)
            # JSON is YAML: Patroni reads it as its configuration file.
            node.config.write_text(json.dumps(self._config(node), indent=2))
        (self.root / "etcd").mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            for path in [self.root, *self.root.rglob("*")]:
                os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("PG", "PATRONI_", "ETCD"))}
        kwargs: dict[str, Any] = {}
        if self._user is not None:
            env.update(HOME=str(self.root), USER="postgres", LOGNAME="postgres")
            kwargs.update(user=self._user.pw_uid, group=self._user.pw_gid, extra_groups=[])
        with open(log, "ab") as out:
            return subprocess.Popen(
                argv,
                cwd=self.root,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **kwargs,
            )

    def _start_etcd(self) -> None:
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{self.etcd_peer_port}"
        self.etcd = self._spawn(
            [
                "etcd",
                "--name",
                self.scope,
                "--data-dir",
                str(self.root / "etcd" / "data"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"{self.scope}={peer}",
                "--initial-cluster-state",
                "new",
                "--log-level",
                "warn",
            ],
            self.root / "etcd" / "etcd.out",
        )
        wait_listening(self.etcd, [self.etcd_port], "etcd", 30.0)

    def start_node(self, node: PgNode) -> None:
        """Start ``node``'s Patroni (it starts, or clones, its PostgreSQL)."""
        if not node.running:
            node.popen = self._spawn(["patroni", str(node.config)], node.base / "patroni.out")

    def start(self) -> PgCluster:
        """etcd, then the first node (bootstrap), the ``tms`` database, then the standby; returns
        once the standby is the synchronous one."""
        ports = [self.etcd_port, self.etcd_peer_port, *(p for n in self.nodes for p in (n.port, n.rest_port))]
        busy = [port for port in ports if listening(port)]
        if busy:
            raise RuntimeError(f"ports {busy} are in use")
        self._prepare()
        try:
            self._start_etcd()
            self.start_node(self.nodes[0])
            self.wait_roles(leader=self.nodes[0], standby=None, timeout=BOOT_TIMEOUT)
            self.psql(self.nodes[0], f"CREATE DATABASE {DATABASE}", dbname="postgres")
            self.start_node(self.nodes[1])
            self.wait_roles(leader=self.nodes[0], standby=self.nodes[1], timeout=BOOT_TIMEOUT)
        except BaseException:
            self.close()
            raise
        return self

    # -- observing ------------------------------------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the members (``GET /cluster`` of the first node that answers):
        ``name``, ``role`` (``leader``, ``sync_standby``, ``replica``), ``state``, ``timeline``."""
        for node in self.nodes:
            url = f"http://127.0.0.1:{node.rest_port}/cluster"
            with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=2) as response:
                return list(json.load(response).get("members", []))
        return []

    def roles(self) -> dict[str, str]:
        """``{node name: role}`` of the running members, e.g. ``{"x-1": "leader", "x-2": "sync_standby"}``."""
        return {m["name"]: m["role"] for m in self.members() if m.get("state") in ("running", "streaming")}

    def primary(self) -> PgNode | None:
        leader = next((name for name, role in self.roles().items() if role == "leader"), None)
        return next((node for node in self.nodes if node.name == leader), None)

    def standby(self) -> PgNode:
        """The node that is not the primary (the primary must be known)."""
        primary = self.primary()
        return next(node for node in self.nodes if node is not primary)

    def wait_roles(self, *, leader: PgNode, standby: PgNode | None, timeout: float = 60.0) -> float:
        """Until ``leader`` leads, accepts writes, and (when given) ``standby`` is its synchronous
        standby, streaming; the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout
        while True:
            roles = self.roles()
            if (
                roles.get(leader.name) == "leader"
                and (standby is None or roles.get(standby.name) == "sync_standby")
                and self._writable(leader)
            ):
                return time.monotonic() - started
            for node in (leader, standby):
                if node is not None and node.popen is not None and node.popen.poll() is not None:
                    raise RuntimeError(f"patroni {node.name} exited: see {node.base / 'patroni.out'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"roles after {timeout:g}s: {roles} (wanted {leader.name} leading): see {self.root}")
            time.sleep(0.1)

    def _writable(self, node: PgNode) -> bool:
        try:
            out = self.psql(node, "SELECT pg_is_in_recovery()", dbname="postgres", timeout=3)
        except (RuntimeError, subprocess.TimeoutExpired):
            return False
        return out.strip() == "f"

    def psql(self, node: PgNode, sql: str, *, dbname: str = DATABASE, timeout: float = 30.0) -> str:
        """Run ``sql`` on ``node`` with psql; its unaligned output."""
        argv = [str(PG_BIN / "psql"), "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql, node.dsn(dbname)]
        return run_tool(argv, what=f"psql {node.name}", timeout=timeout)

    # -- faults ---------------------------------------------------------------------------------

    def kill_primary(self) -> PgNode:
        """SIGKILL the primary's postmaster (a crash of PostgreSQL, its Patroni left running);
        returns the node that was primary."""
        primary = self.primary()
        if primary is None:
            raise RuntimeError(f"no primary to kill: {self.members()}")
        pid = primary.postmaster_pid()
        if pid is None:
            raise RuntimeError(f"{primary.name} has no postmaster running")
        os.kill(pid, signal.SIGKILL)
        return primary

    def switchover(self, candidate: PgNode | None = None) -> PgNode:
        """``patronictl switchover`` from the primary to ``candidate`` (default: the standby);
        returns the new primary once Patroni reports the switchover done."""
        primary = self.primary()
        if primary is None:
            raise RuntimeError(f"no primary to switch over from: {self.members()}")
        target = candidate or next(node for node in self.nodes if node is not primary)
        self.patronictl("switchover", "--leader", primary.name, "--candidate", target.name, "--force")
        return target

    def patronictl(self, *args: str, timeout: float = 60.0) -> str:
        argv = ["patronictl", "-c", str(self.nodes[0].config), *args]
        return run_tool(argv, what=f"patronictl {' '.join(args)}", timeout=timeout)

    # -- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill both Patronis, their PostgreSQL servers and etcd, and delete the folder, whatever
        state they are in."""
        for node in self.nodes:
            if node.popen is not None:
                kill_session(node.popen.pid)
        for node in self.nodes:
            # The postmaster is in its Patroni's session, but a Patroni that died first may have
            # left it to init: find it by its pid file.
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if os.getsid(pid) == pid:  # Patroni starts it as a session leader: its backends
                        kill_session(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if self.etcd is not None:
            kill_session(self.etcd.pid)
        for popen in [*(n.popen for n in self.nodes), self.etcd]:
            if popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(10)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)


def _cmdline_has(pid: int, text: str) -> bool:
    """Whether process ``pid``'s command line mentions ``text`` (a stale pid file never makes us
    kill another process)."""
    try:
        return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def main() -> None:
    """``make ha-db``: start the pair, print its URL, then take commands from the terminal
    (``kill`` the primary's postmaster, ``switchover``, ``status``) until ``quit`` or Ctrl-C,
    which stop everything and delete its folder."""
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    with PgCluster() as cluster:
        print(f"Patroni-managed PostgreSQL pair running in {cluster.root} (etcd 127.0.0.1:{cluster.etcd_port}):")
        for node in cluster.nodes:
            print(f"  {node.name}: postgres 127.0.0.1:{node.port}, Patroni REST 127.0.0.1:{node.rest_port}")
        print(f"\nexport DATABASE_URL='{cluster.url}'")
        print(f"patronictl -c {cluster.nodes[0].config} list\n")
        commands = {
            "kill": lambda: f"killed the postmaster of {cluster.kill_primary().name}",
            "switchover": lambda: f"switched over to {cluster.switchover().name}",
            "status": lambda: json.dumps(cluster.members(), indent=2),
        }
        command_loop("ha-db", commands, "kill | switchover | status")


if __name__ == "__main__":
    main()
