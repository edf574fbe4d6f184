"""The back office's lists page by the API's keyset (:mod:`tms_core.api.keyset`): one mechanism,
the same cursors, API and pages alike.

Django's paginator counts the whole queryset and skips ``OFFSET`` rows, both of which read the
table from the start: at a million executions a staff user's list page spent seconds on the
count alone. A keyset page instead continues from the last (or first) row it showed, ordered on a
stable key ``(column, id)`` that an index serves, so every page costs the same: an index range
read of ``size + 1`` rows (the extra row says whether there is a page beyond). A page's links
carry ``?cursor=`` (the API's cursor text) with the list's other parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from tms_core.api.keyset import BadCursor, Segment, decode_cursor, encode_cursor, read_page

__all__ = ["BadCursor", "KeysetPage", "keyset_page"]


@dataclass(frozen=True)
class KeysetPage:
    rows: list[Any]
    #: Cursor of the next page (older, or later for an ascending list); None on the last page.
    next_cursor: str | None
    #: Cursor of the previous page (read backwards from the first row); None on the first page.
    previous_cursor: str | None
    #: Whether this is the first page (no cursor was given).
    first: bool


def keyset_page(
    queryset: QuerySet, *, column: str | None, descending: bool, cursor: str | None, size: int = 50
) -> KeysetPage:
    """The ``size`` rows of ``queryset`` from ``cursor`` on (a page's link), in ``(column, id)``
    order (``column`` None: the id alone), newest first when ``descending``. Raises
    :class:`BadCursor` for a cursor this list did not make."""
    segments = [Segment(sources=[queryset], column=column, descending=descending)]
    position, backwards = None, False
    if cursor:
        position, backwards, _ = decode_cursor(cursor)
    page = read_page(segments, position, size, backwards=backwards)
    return KeysetPage(
        rows=page.rows,
        next_cursor=encode_cursor(page.next) if page.next else None,
        previous_cursor=encode_cursor(page.previous, backwards=True) if page.previous else None,
        first=position is None,
    )


def row_cursor(column: str | None, row: Any) -> str:
    """The cursor of the page that follows ``row`` in a list of one segment (for tools that jump
    into a list, e.g. the benchmark)."""
    from tms_core.api.keyset import Position

    return encode_cursor(Position(0, getattr(row, column) if column else None, row.pk))
