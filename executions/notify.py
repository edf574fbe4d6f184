"""Wake-ups for the monitor: Postgres ``NOTIFY`` on a channel the monitor ``LISTEN``s to."""

from __future__ import annotations

import contextlib
import logging
import select
import time

import psycopg2
import psycopg2.extensions
from django.db import connection, connections

from tms_core.together import execute_soon

logger = logging.getLogger(__name__)

CHANNEL = "tms_due"


def notify_due() -> None:
    """Tell the monitors that new work may be due. Delivered when the current transaction commits
    (so inside :func:`tms_core.together.sent_together` it may go with the next statement)."""
    if connection.vendor == "postgresql":
        execute_soon(f"NOTIFY {CHANNEL}")


class DueListener:
    """A dedicated autocommit connection that LISTENs for :data:`CHANNEL`.

    On a backend without LISTEN (SQLite) :meth:`wait` simply sleeps for the timeout.
    """

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias
        self._conn: psycopg2.extensions.connection | None = None

    @property
    def supported(self) -> bool:
        return connections[self.alias].vendor == "postgresql"

    def _connect(self) -> psycopg2.extensions.connection:
        params = connections[self.alias].get_connection_params()
        conn = psycopg2.connect(**params)
        conn.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
        with conn.cursor() as cursor:
            cursor.execute(f"LISTEN {CHANNEL}")
        return conn

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if a notification arrived."""
        if timeout <= 0:
            return False
        if not self.supported:
            time.sleep(timeout)
            return False
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            ready, _, _ = select.select([self._conn], [], [], timeout)
            if not ready:
                return False
            self._conn.poll()
            heard = bool(self._conn.notifies)
            self._conn.notifies.clear()
            return heard
        except psycopg2.Error as exc:
            logger.warning("LISTEN connection failed (%s); sleeping instead", exc)
            self.close()
            time.sleep(timeout)
            return False

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg2.Error):
                self._conn.close()
            self._conn = None
