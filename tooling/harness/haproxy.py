"""HAProxy (Debian's ``haproxy`` package) in front of the private Patroni pair of
:mod:`tooling.harness.pg_cluster`, routing a write port to the member whose Patroni REST API
answers ``GET /primary`` with 200: for the tests of TMS given one address for its database
(tests/ha/test_haproxy_failover.py) and for a person to try (``make ha-haproxy``).

It runs ``docker/haproxy/haproxy.cfg``, the file the HA compose stack ships, unchanged: that file
takes every address from the environment (with the compose values as defaults), and this gives
it 127.0.0.1 and free ports (the write port, the status page) and the pair's PostgreSQL and REST
ports. HAProxy runs in the foreground (``-db``), as the leader of a process session, logging to
a file of its own ``/tmp/tms-haproxy-*`` folder; :meth:`HAProxy.close` kills it whatever happened.
The package's own service (``/etc/haproxy``, started at install) is never used.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

from tooling.harness.pg_cluster import DATABASE, PgCluster, PgNode
from tooling.harness.servers import ForegroundServer, command_loop, free_ports, listening

#: Debian's package's binary (``make haproxy`` installs it).
HAPROXY = "/usr/sbin/haproxy"
CONFIG = Path(__file__).resolve().parents[2] / "docker" / "haproxy" / "haproxy.cfg"
#: The backend of the write port in CONFIG, and its servers, one per Patroni node in order.
BACKEND = "postgres-primary"
SERVERS = ("patroni1", "patroni2")


class HAProxy(ForegroundServer):
    """One HAProxy process in front of ``cluster``; use as a context manager (or :meth:`start`
    and :meth:`close`). :attr:`url` is the single-host ``DATABASE_URL`` TMS takes."""

    what = "haproxy"

    def __init__(self, cluster: PgCluster, *, port: int | None = None) -> None:
        if len(cluster.nodes) != len(SERVERS):
            raise ValueError(f"{CONFIG.name} names {len(SERVERS)} servers, the cluster has {len(cluster.nodes)}")
        self.cluster = cluster
        chosen, self.stats_port, dns_port = free_ports(3)
        self.port = port or chosen
        # The resolvers section needs a nameserver; every address given here is an IP, so
        # nothing is ever asked of it (a free port nobody answers on).
        self._dns_port = dns_port
        super().__init__("tms-haproxy-")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def log_file(self) -> Path:
        return self.output_log

    def environment(self) -> dict[str, str]:
        """The variables ``docker/haproxy/haproxy.cfg`` takes, for this machine's pair."""
        env = {
            "WRITE_BIND": f"127.0.0.1:{self.port}",
            "STATS_BIND": f"127.0.0.1:{self.stats_port}",
            "RESOLVER": f"127.0.0.1:{self._dns_port}",
        }
        for number, node in enumerate(self.cluster.nodes, start=1):
            env[f"PATRONI{number}_ADDR"] = f"127.0.0.1:{node.port}"
            env[f"PATRONI{number}_REST"] = str(node.rest_port)
        return env

    def _command(self, *extra: str) -> tuple[list[str], dict[str, str]]:
        keep = ("PATH", "LANG", "LC_ALL")
        env = {key: value for key, value in os.environ.items() if key in keep}
        env.update(self.environment())
        return [HAPROXY, *extra, "-f", str(CONFIG)], env

    def check(self) -> str:
        """``haproxy -c``: the configuration, with this environment, parsed and checked; its
        output. Raises RuntimeError when HAProxy refuses it."""
        argv, env = self._command("-c")
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(f"haproxy -c refused {CONFIG}:\n{result.stdout}{result.stderr}")
        return result.stdout + result.stderr

    def start(self) -> HAProxy:
        busy = [port for port in (self.port, self.stats_port) if listening(port)]
        if busy:
            raise RuntimeError(f"ports {busy} are in use")
        argv, env = self._command("-db")
        self._launch(argv, ports=[self.port, self.stats_port], env=env)
        return self

    # -- observing ------------------------------------------------------------------------------

    def server_states(self) -> dict[str, str]:
        """``{server: status}`` of the write port's servers as HAProxy sees them now (``UP``,
        ``DOWN``, ``UP 1/2`` while a check is failing...), from its status page's CSV."""
        url = f"http://127.0.0.1:{self.stats_port}/;csv"
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode().lstrip("# ")
        return {
            row["svname"]: row["status"]
            for row in csv.DictReader(io.StringIO(text))
            if row["pxname"] == BACKEND and row["svname"] in SERVERS
        }

    def routed_to(self) -> PgNode | None:
        """The node HAProxy sends new connections to, None unless exactly one server takes them
        and its last check passed. A server is sent connections while its status starts with UP:
        ``UP 1/2`` is one that is going down (a check failed) and, at HAProxy's start, every
        server until its first check, since HAProxy counts a server up until a check fails."""
        states = self.server_states()
        taking = [name for name, status in states.items() if status.startswith("UP")]
        if len(taking) != 1 or states[taking[0]] != "UP":
            return None
        return self.cluster.nodes[SERVERS.index(taking[0])]

    def wait_routed_to(self, node: PgNode, timeout: float = 30.0) -> float:
        """Until HAProxy sends connections to ``node`` alone; the seconds it took."""
        started = time.monotonic()
        while True:
            with contextlib.suppress(OSError):
                if self.routed_to() is node:
                    return time.monotonic() - started
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(f"haproxy exited ({self.popen.returncode}):\n{self.log_text()[-2000:]}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"HAProxy not routing to {node.name} after {timeout:g}s: {self.server_states()}")
            time.sleep(0.05)


def main() -> None:
    """``make ha-haproxy``: start the Patroni pair and HAProxy in front of it, print the
    single-host URL to give TMS, then take ``kill`` (the primary's postmaster), ``switchover``,
    ``status`` and ``quit`` (or Ctrl-C, which stops everything and deletes its folders)."""
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    with PgCluster() as cluster, HAProxy(cluster) as haproxy:
        primary = cluster.primary()
        if primary is not None:
            haproxy.wait_routed_to(primary)
        print(f"Patroni pair in {cluster.root}; HAProxy on 127.0.0.1:{haproxy.port}, log {haproxy.log_file}")
        for node in cluster.nodes:
            print(f"  {node.name}: postgres 127.0.0.1:{node.port}, Patroni REST 127.0.0.1:{node.rest_port}")
        print(f"  HAProxy's status page: http://127.0.0.1:{haproxy.stats_port}/")
        print(f"\nexport DATABASE_URL='{haproxy.url}'\n")

        def kill() -> str:
            old = cluster.kill_primary()
            new = next(node for node in cluster.nodes if node is not old)
            took = haproxy.wait_routed_to(new, timeout=60)
            return f"killed the postmaster of {old.name}; HAProxy routes to {new.name} {took:.1f}s later"

        def switchover() -> str:
            new = cluster.switchover()
            took = haproxy.wait_routed_to(new, timeout=60)
            return f"switched over to {new.name}; HAProxy routes to it {took:.1f}s later"

        def status() -> str:
            return json.dumps({"patroni": cluster.members(), "haproxy": haproxy.server_states()}, indent=2)

        command_loop(
            "ha-haproxy", {"kill": kill, "switchover": switchover, "status": status}, "kill | switchover | status"
        )


if __name__ == "__main__":
    main()
