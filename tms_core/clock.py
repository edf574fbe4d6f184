"""The database clock. Leases, heartbeats and due times are compared against it, not the host's."""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.utils import timezone


def db_now() -> datetime:
    """The database server's current time (the host's on SQLite, the embedded single-host mode)."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]
