"""Wake-ups for the monitor: Postgres ``NOTIFY`` on a channel the monitor ``LISTEN``s to."""

from __future__ import annotations

import contextlib
import logging
import select
import time

import psycopg2
import psycopg2.extensions
from django.db import connections

from tms_core.conf import tms_settings
from tms_core.together import execute_soon

logger = logging.getLogger(__name__)

CHANNEL = "tms_due"

#: The waits before connecting the LISTEN connection again after a failed attempt, then the
#: longest one: a PostgreSQL failover takes 2-4 s, and a refused connection costs milliseconds.
RECONNECT_DELAYS = (0.1, 0.25, 0.5)
RECONNECT_DELAY_MAX = 1.0


def notify_due() -> None:
    """Tell the monitors that new work may be due. Delivered when the current transaction commits
    (so inside :func:`tms_core.together.sent_together` it may go with the next statement)."""
    execute_soon(f"NOTIFY {CHANNEL}")


class DueListener:
    """A dedicated autocommit connection that LISTENs for :data:`CHANNEL`.

    It connects to ``TMS_LISTEN_DATABASE_URL`` when set (PostgreSQL itself, past a pooler: a
    LISTEN sent through PgBouncer in transaction pooling mode stays on the server connection that
    ran it, and this client would hear nothing), else with the default database's settings.
    """

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias
        self._conn: psycopg2.extensions.connection | None = None
        #: Its connection was lost and is not made again yet: what it missed is not known.
        self._lost = False

    def _connect(self) -> psycopg2.extensions.connection:
        params = connections[self.alias].get_connection_params()
        direct = tms_settings().LISTEN_DATABASE_URL
        if direct:
            conn = psycopg2.connect(direct, connect_timeout=params.get("connect_timeout", 5))
        else:
            conn = psycopg2.connect(**params)
        conn.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
        with conn.cursor() as cursor:
            cursor.execute(f"LISTEN {CHANNEL}")
        return conn

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if a notification arrived, or if the LISTEN
        connection was lost and is made again (a notification sent meanwhile went to nobody: the
        caller looks at once)."""
        if timeout <= 0:
            return False
        deadline = time.monotonic() + timeout
        if self._conn is None or self._conn.closed:
            if not self._reconnect(deadline):
                return False
            if self._lost:
                self._lost = False
                return True
        assert self._conn is not None
        try:
            ready, _, _ = select.select([self._conn], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return False
            self._conn.poll()
            heard = bool(self._conn.notifies)
            self._conn.notifies.clear()
            return heard
        except psycopg2.Error as exc:
            # Its backend ended (a failover, a restart, a terminated session): connect again at
            # once, not after the rest of the sleep (up to TMS_MONITOR_MAX_SLEEP).
            logger.warning("LISTEN connection lost (%s); connecting again", exc)
            self.close()
            self._lost = True
            if self._reconnect(deadline):
                self._lost = False
                logger.info("LISTEN connection made again")
                return True
            return False

    def _reconnect(self, deadline: float) -> bool:
        """Connect and LISTEN, retrying after :data:`RECONNECT_DELAYS` (then every
        :data:`RECONNECT_DELAY_MAX` s) until ``deadline``; whether it is connected."""
        failures = 0
        while True:
            try:
                self._conn = self._connect()
                return True
            except psycopg2.Error as exc:
                self.close()
                delay = RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
                delay = delay if failures < len(RECONNECT_DELAYS) else RECONNECT_DELAY_MAX
                failures += 1
                left = deadline - time.monotonic()
                if left <= delay:
                    logger.warning("LISTEN connection failed (%s); sleeping instead", exc)
                    time.sleep(max(0.0, left))
                    return False
                time.sleep(delay)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg2.Error):
                self._conn.close()
            self._conn = None
