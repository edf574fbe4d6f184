"""The database clock. Leases, heartbeats and due times are compared against it, not the host's."""

from __future__ import annotations

from datetime import datetime

from django.db import connection


def db_now() -> datetime:
    """The database server's current time (the statement's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def local_words(when: datetime, zone: str) -> str:
    """``when`` as people read it on the pages: the wall time in ``zone`` to the second, with the
    zone's abbreviation ("2027-03-28 03:00:00 CEST"), as Django's DATETIME_FORMAT shows dates
    (``Y-m-d H:i:s T``): no microseconds, no raw UTC offset. An unknown zone reads UTC."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        tz = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        tz = ZoneInfo("UTC")
    return when.astimezone(tz).strftime("%Y-%m-%d %H:%M:%S %Z")
