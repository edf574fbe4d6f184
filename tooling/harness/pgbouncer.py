"""A private PgBouncer of Debian's ``pgbouncer`` package in transaction pooling mode, in front of
a PostgreSQL server, for the tests of TMS behind a pooler (tests/ha/test_pgbouncer.py) and for a
person to try (``make ha-pgbouncer``).

It listens on a free port of 127.0.0.1 (never 6432, the package's own service's) with its ini
file, user list, log and pid file in a ``/tmp/tms-pgbouncer-*`` folder of its own; every database
name is passed through to the server (``* = host=… port=…``), so a client reaches any database
of that server as ``postgres://USER@127.0.0.1:PORT/NAME``. Clients are trusted (the server
still checks the role its own way). The process is started in the foreground, as the leader of
a process session, and :meth:`PgBouncer.close` kills it whatever happened. PgBouncer refuses to
run as root, so under root it runs as ``postgres`` (``-u``), which is given the folder.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import signal
import time
from pathlib import Path

from tooling.harness.servers import ForegroundServer, free_ports

#: Debian's package's binary (``make pgbouncer`` installs it).
PGBOUNCER = "/usr/sbin/pgbouncer"
#: The user PgBouncer runs as when started by root (Debian's PostgreSQL packages create it).
RUN_AS = "postgres"


class PgBouncer(ForegroundServer):
    """One PgBouncer process; use as a context manager (or :meth:`start` and :meth:`close`).

    ``pool_size`` bounds the server connections per database and role (the shared PostgreSQL
    allows 100 in all): far fewer than the clients, which is what transaction pooling is for.
    """

    what = "pgbouncer"
    log_files = ("pgbouncer.log",)

    def __init__(
        self,
        *,
        server_host: str = "127.0.0.1",
        server_port: int = 5432,
        port: int | None = None,
        pool_size: int = 8,
        max_client_conn: int = 400,
    ) -> None:
        self.server_host = server_host
        self.server_port = server_port
        self.port = port or free_ports(1)[0]
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        super().__init__("tms-pgbouncer-")

    @property
    def ini(self) -> Path:
        return self.root / "pgbouncer.ini"

    @property
    def log_file(self) -> Path:
        return self.root / "pgbouncer.log"

    def url(self, database: str, user: str = "postgres") -> str:
        """A client's URL of ``database`` through this PgBouncer."""
        return f"postgres://{user}@127.0.0.1:{self.port}/{database}"

    def _write_config(self) -> None:
        (self.root / "userlist.txt").write_text('"postgres" ""\n')
        self.ini.write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "\n[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            # The admin console (database ``pgbouncer``): SHOW SERVERS names the server backends.
            "admin_users = postgres\n"
            f"auth_file = {self.root / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            "min_pool_size = 0\n"
            "reserve_pool_size = 0\n"
            f"max_client_conn = {self.max_client_conn}\n"
            # psycopg2 and Django send none of the others; a client that sent one would be refused.
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.log_file}\n"
            f"pidfile = {self.root / 'pgbouncer.pid'}\n"
            # Idle server connections go back to PostgreSQL soon: its 100 are shared.
            "server_idle_timeout = 10\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )

    def start(self) -> PgBouncer:
        self._write_config()
        command = [PGBOUNCER]
        if os.geteuid() == 0:
            account = pwd.getpwnam(RUN_AS)
            for path in [self.root, *self.root.iterdir()]:
                os.chown(path, account.pw_uid, account.pw_gid)
            command += ["-u", RUN_AS]
        command.append(str(self.ini))
        self._launch(command, ports=[self.port])
        return self

    def server_pids(self) -> set[int]:
        """The PostgreSQL backend pids of PgBouncer's server connections now (``SHOW SERVERS``)."""
        import psycopg2

        admin = psycopg2.connect(self.url("pgbouncer"))
        try:
            admin.autocommit = True
            with admin.cursor() as cursor:
                cursor.execute("SHOW SERVERS")
                names = [column[0] for column in cursor.description or ()]
                return {int(row[names.index("remote_pid")]) for row in cursor.fetchall()}
        finally:
            admin.close()


def main() -> None:
    """``make ha-pgbouncer``: start PgBouncer in front of the local PostgreSQL, print the URLs to
    give TMS, and stop it (deleting its folder) on Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", default="tms", help="the database name the printed URLs name")
    parser.add_argument("--port", type=int, default=None, help="the port to listen on (default: a free one)")
    args = parser.parse_args()
    with PgBouncer(port=args.port) as bouncer:
        print(f"PgBouncer (transaction pooling) on 127.0.0.1:{bouncer.port}, files in {bouncer.root}")
        print(f"\nexport DATABASE_URL='{bouncer.url(args.database)}'")
        print("export TMS_DATABASE_POOLER=transaction")
        print(f"export TMS_LISTEN_DATABASE_URL='postgres://postgres@127.0.0.1:5432/{args.database}'\n")
        print("Ctrl-C stops it.", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with contextlib.suppress(KeyboardInterrupt):
            while bouncer.running:
                time.sleep(1)


if __name__ == "__main__":
    main()
