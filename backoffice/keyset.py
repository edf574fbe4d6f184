"""Keyset ("next page") pagination for long lists: no COUNT, no OFFSET.

Django's paginator counts the whole queryset and skips ``OFFSET`` rows, both of which read the
table from the start: at a million executions a staff user's list page spends seconds on the
count alone. A keyset page instead continues after the last row it showed, ordered on a stable
key ``(time, id)`` that an index serves, so every page costs the same: an index range scan of
``size + 1`` rows (the extra row says whether there is a next page).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class BadCursor(ValueError):
    """The ``after`` parameter is not a cursor this page made."""


@dataclass(frozen=True)
class KeysetPage:
    rows: list[Any]
    #: Cursor of the next page (None on the last page).
    next_cursor: str | None
    #: Whether this is the first page (no cursor was given).
    first: bool


def encode_cursor(at: datetime, pk: Any) -> str:
    """``at`` (exact to the microsecond) and ``pk`` (a number or a UUID) as URL-safe text:
    ``<microseconds>_<id>``."""
    delta = at - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return f"{micros}_{pk}"


def decode_cursor(text: str, pk_field: Any = None) -> tuple[datetime, Any]:
    """The ``(time, id)`` of a cursor; the id read by ``pk_field`` (default: a whole number)."""
    try:
        micros_text, pk_text = text.split("_")
        at = _EPOCH + timedelta(microseconds=int(micros_text))
        pk = int(pk_text) if pk_field is None else pk_field.to_python(pk_text)
    except (ValueError, OverflowError, ValidationError) as exc:
        raise BadCursor(f"'after' must be a cursor of the form <microseconds>_<id>, not {text[:40]!r}.") from exc
    return at, pk


def keyset_page(
    queryset: QuerySet, *, time_field: str, descending: bool, after: str | None, size: int = 50
) -> KeysetPage:
    """The ``size`` rows of ``queryset`` that follow the cursor ``after`` in ``(time_field, id)``
    order (newest first when ``descending``). Raises :class:`BadCursor` for a malformed cursor.

    The condition is written as ``time <= t AND (time < t OR id < i)`` (for descending) rather
    than a plain OR so that ``time <= t`` is an index condition: the scan starts at the cursor.
    """
    sign = "-" if descending else ""
    queryset = queryset.order_by(f"{sign}{time_field}", f"{sign}id")
    if after:
        at, pk = decode_cursor(after, queryset.model._meta.pk)
        inclusive, strict, before = ("lte", "lt", "lt") if descending else ("gte", "gt", "gt")
        queryset = queryset.filter(
            Q(**{f"{time_field}__{inclusive}": at})
            & (Q(**{f"{time_field}__{strict}": at}) | Q(**{f"id__{before}": pk}))
        )
    rows = list(queryset[: size + 1])
    next_cursor = None
    if len(rows) > size:
        rows = rows[:size]
        last = rows[-1]
        next_cursor = encode_cursor(getattr(last, time_field), last.pk)
    return KeysetPage(rows=rows, next_cursor=next_cursor, first=not after)
