"""Keyset ("cursor") pagination for lists that grow without bound: the execution lists.

Offset pagination counts the whole list and skips the rows before the page, so its cost grows
with the table and the page number (a million executions: 312 ms for the first page, 536 ms at
offset 900,000). A keyset page is an index range read from the last row shown: its cost is the
page's, whatever the table's size or how deep the page is.

A list is an ordered sequence of **segments**; each segment is a filter, an ordering column
(or none: the id alone) and a direction, ordered by ``(column, id)``; each may read from several
**sources** (querysets of disjoint rows, each served by its own index), merged here. The cursor
names a position ``(segment, column value, id)``; the next page reads on from it with a row
comparison ``(column, id) < (value, id)`` (``>`` ascending), which PostgreSQL answers as an
index range. New rows inserted while a client pages never make it see a row twice or skip one
that was there when it started.

There is no total count (counting is what made big lists slow): ``next`` and ``previous`` are
links, null at either end.

This is the one paging of lists that grow, API and pages alike: :class:`KeysetPagination` serves
the API's lists, and the back office's lists call :func:`read_page` with the same cursors
(:mod:`backoffice.keyset`). Offsets are left to lists that are bounded.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db.models import CharField, DateTimeField, Field, Model, Q, QuerySet, TextField, UUIDField
from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

_INVALID = "Invalid cursor: use the next or previous link of a page as it is."


class BadCursor(ValueError):
    """A cursor this list did not make (malformed, forged, or of another ordering)."""

    def __init__(self) -> None:
        super().__init__(_INVALID)


@dataclass(frozen=True)
class Segment:
    """Rows of ``sources`` (disjoint querysets) ordered by ``(column, id)``, ``descending`` or not.

    ``column`` None orders by the id alone. The column must not be null in these rows.
    """

    sources: Sequence[QuerySet]
    column: str | None
    descending: bool


@dataclass(frozen=True)
class Position:
    segment: int
    value: Any
    #: The row's primary key: a whole number, or a UUID (the tasks).
    id: Any


@dataclass(frozen=True)
class KeysetPage:
    """The rows of a page, and the positions to read on from (None at either end)."""

    rows: list[Any]
    #: The last row's position, when rows follow.
    next: Position | None
    #: The first row's position (read backwards from it), when rows come before.
    previous: Position | None


def encode_cursor(
    position: Position, *, backwards: bool = False, state: dict[str, Any] | None = None, ordering: str = ""
) -> str:
    """``position`` as URL-safe text: read forwards from it, or ``backwards``; ``state`` (JSON
    values the list's segments depend on) and ``ordering`` (the list's chosen order) travel with it."""
    value, ident = position.value, position.id
    data: dict[str, Any] = {
        "p": [position.segment, value.isoformat() if isinstance(value, datetime) else value, ident],
        "k": "t" if isinstance(value, datetime) else ("s" if isinstance(value, str) else "i"),
        "s": state or {},
        "o": ordering,
    }
    if isinstance(ident, uuid.UUID):
        data["p"][2] = str(ident)
    if backwards:
        data["r"] = 1
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(raw: str, *, ordering: str = "") -> tuple[Position, bool, dict[str, Any]]:
    """``(position, backwards, state)`` of a cursor made by :func:`encode_cursor` for ``ordering``;
    :class:`BadCursor` otherwise. The position's types are checked against the list by :func:`read_page`."""
    try:
        data = json.loads(base64.urlsafe_b64decode(raw.encode("ascii") + b"==="))
        segment, value, ident = data["p"]
        if not isinstance(segment, int) or isinstance(segment, bool) or not isinstance(ident, int | str):
            raise ValueError
        if isinstance(ident, bool):
            raise ValueError
        if data.get("k") == "t" and value is not None:
            value = parse_datetime(value)
            if value is None:
                raise ValueError
        elif data.get("k") == "s" and value is not None:
            if not isinstance(value, str):
                raise ValueError
        elif value is not None and not isinstance(value, int):
            raise ValueError
        state = data.get("s", {})
        if not isinstance(state, dict) or data.get("o", "") != ordering:
            raise ValueError
        return Position(segment, value, ident), bool(data.get("r")), state
    except (ValueError, TypeError, KeyError, UnicodeError, binascii.Error, json.JSONDecodeError):
        raise BadCursor from None


def read_page(segments: list[Segment], position: Position | None, limit: int, *, backwards: bool = False) -> KeysetPage:
    """The ``limit`` rows of ``segments`` after ``position`` (before it when ``backwards``; from
    the start when None), read as index ranges, with the positions of the pages on either side.
    :class:`BadCursor` when ``position`` cannot be a row of these segments."""
    if position is not None:
        position = _fitted(position, segments)
    rows = _walk(segments, position, limit + 1, backwards)
    more = len(rows) > limit
    rows = rows[:limit]
    if backwards:
        rows.reverse()
    first, last = (rows[0][0], rows[-1][0]) if rows else (None, None)
    # Forwards: a next page when more rows were read; a previous one when we came from a cursor.
    # Backwards the other way round.
    has_next = more if not backwards else position is not None
    has_previous = position is not None if not backwards else more
    return KeysetPage(
        rows=[row for _, row in rows],
        next=last if has_next else None,
        previous=first if has_previous else None,
    )


def _fitted(position: Position, segments: list[Segment]) -> Position:
    """``position`` with its id typed as the segment's primary key, if it can be a row of these
    segments (a forged one never reaches SQL); :class:`BadCursor` otherwise."""
    if not 0 <= position.segment < len(segments):
        raise BadCursor
    segment = segments[position.segment]
    model = segment.sources[0].model
    ident = position.id
    if isinstance(model._meta.pk, UUIDField):
        try:
            ident = uuid.UUID(str(ident))
        except ValueError:
            raise BadCursor from None
    elif not isinstance(ident, int):
        raise BadCursor
    if segment.column is None:
        if position.value is not None:
            raise BadCursor
    elif isinstance(field := _column_field(segment), DateTimeField):
        if not (isinstance(position.value, datetime) and position.value.tzinfo is not None):
            raise BadCursor
    elif isinstance(field, CharField | TextField):
        if not isinstance(position.value, str):
            raise BadCursor
    elif not isinstance(position.value, int) or isinstance(position.value, bool):
        raise BadCursor
    return replace(position, id=ident)


def _column_field(segment: Segment) -> Field:
    """The model field a segment orders by, or the output field of the annotation it names."""
    source = segment.sources[0]
    try:
        return source.model._meta.get_field(str(segment.column))
    except FieldDoesNotExist:
        return source.query.annotations[str(segment.column)].output_field


def _walk(
    segments: list[Segment], position: Position | None, want: int, backwards: bool
) -> list[tuple[Position, Model]]:
    order = range(len(segments))
    if backwards:
        order = range(len(segments) - 1, -1, -1)
    rows: list[tuple[Position, Model]] = []
    for index in order:
        if position is not None and (index < position.segment if not backwards else index > position.segment):
            continue
        segment = segments[index]
        descending = segment.descending != backwards
        after = position if position is not None and index == position.segment else None
        rows += _read(index, segment, descending, after, want - len(rows))
        if len(rows) >= want:
            break
    return rows


def _read(
    index: int, segment: Segment, descending: bool, after: Position | None, want: int
) -> list[tuple[Position, Model]]:
    column = segment.column
    fields = [column, "id"] if column else ["id"]
    ordering = [f"-{f}" if descending else f for f in fields]
    merged: list[tuple[Position, Model]] = []
    for source in segment.sources:
        queryset = source
        if after is not None and column is not None and column in queryset.query.annotations:
            # An annotation (a task's next run) has no column to compare as a row: the same order
            # said with lookups, which a computed value could not use an index for anyway.
            op = "lt" if descending else "gt"
            queryset = queryset.filter(
                Q(**{f"{column}__{op}": after.value}) | Q(**{column: after.value, f"pk__{op}": after.id})
            )
        elif after is not None:
            # A row comparison Django's lookups cannot say; the names are the model's, values parameters.
            queryset = queryset.extra(  # noqa: S610
                where=[_compare(queryset, column, descending)], params=_params(after)
            )
        for row in queryset.order_by(*ordering)[:want]:
            value = getattr(row, column) if column else None
            merged.append((Position(index, value, row.pk), row))

    def key(item: tuple[Position, Model]) -> tuple[Any, Any]:
        return (item[0].value, item[0].id) if column else (0, item[0].id)

    if len(segment.sources) > 1:
        # Each source gave its first ``want`` rows in order: the first ``want`` of them all.
        merged.sort(key=key, reverse=descending)
    return merged[:want]


def _compare(queryset: QuerySet, column: str | None, descending: bool) -> str:
    table = queryset.model._meta.db_table
    op = "<" if descending else ">"
    pk = queryset.model._meta.pk.column
    if column is None:
        return f'"{table}"."{pk}" {op} %s'
    db_column = queryset.model._meta.get_field(column).column
    # A row comparison: PostgreSQL reads it as one index range on (column, id).
    return f'("{table}"."{db_column}", "{table}"."{pk}") {op} (%s, %s)'


def _params(after: Position) -> list[Any]:
    return [after.id] if after.value is None else [after.value, after.id]


class KeysetPagination(BasePagination):
    """``?limit=`` (1-500, default ``PAGE_SIZE``) and ``?cursor=`` (from a page's links).

    The view provides ``keyset_segments(queryset, state) -> list[Segment]`` and may put what its
    segments depend on in ``state`` (a dict of JSON values carried in the cursor, such as the
    instant that splits past from upcoming), so every page of one walk cuts the list the same way.
    ``?offset=`` is refused with a 400 that says to follow the links.
    """

    cursor_query_param = "cursor"
    limit_query_param = "limit"
    max_limit = 500
    default_limit = 50

    def __init__(self) -> None:
        from django.conf import settings

        self.default_limit = settings.REST_FRAMEWORK.get("PAGE_SIZE") or self.default_limit

    # -- reading the request --------------------------------------------------------------

    def get_limit(self, request: Request) -> int:
        values = request.query_params.getlist(self.limit_query_param)
        if not values:
            return self.default_limit
        value = values[-1]
        if not value.lstrip("-").isdigit():
            raise ValidationError({self.limit_query_param: ["A whole number is required."]})
        if int(value) < 1:
            raise ValidationError({self.limit_query_param: ["Must be at least 1."]})
        return min(int(value), self.max_limit)

    def decode(self, request: Request) -> tuple[Position | None, bool, dict[str, Any]]:
        """(position, backwards, state) from ``?cursor=``."""
        raw = request.query_params.get(self.cursor_query_param)
        if raw is None:
            return None, False, {}
        try:
            return decode_cursor(raw, ordering=self._ordering(request))
        except BadCursor:
            raise ValidationError({self.cursor_query_param: [_INVALID]}) from None

    @staticmethod
    def _ordering(request: Request) -> str:
        return ",".join(value for value in request.query_params.getlist("ordering") if value)

    def encode(self, position: Position, *, backwards: bool, state: dict[str, Any]) -> str:
        return encode_cursor(position, backwards=backwards, state=state, ordering=self._ordering(self.request))

    # -- the page -------------------------------------------------------------------------

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> Any:
        if request.query_params.getlist("offset"):
            raise ValidationError(
                {
                    "offset": [
                        "This list is paged by cursor, not offset: follow the `next` and `previous` links of each page "
                        "(`?cursor=`), with `?limit=` for the page size."
                    ]
                }
            )
        self.request = request
        limit = self.get_limit(request)
        position, backwards, state = self.decode(request)
        segments = view.keyset_segments(queryset, state)
        self.state = state
        try:
            page = read_page(segments, position, limit, backwards=backwards)
        except BadCursor:
            raise ValidationError({self.cursor_query_param: [_INVALID]}) from None
        self.next_cursor = self.encode(page.next, backwards=False, state=state) if page.next else None
        self.previous_cursor = self.encode(page.previous, backwards=True, state=state) if page.previous else None
        return page.rows

    def get_paginated_response(self, data: Any) -> Response:
        return Response(
            {"next": self._link(self.next_cursor), "previous": self._link(self.previous_cursor), "results": data}
        )

    def _link(self, cursor: str | None) -> str | None:
        if cursor is None:
            return None
        url = self.request.build_absolute_uri()
        return replace_query_param(remove_query_param(url, "offset"), self.cursor_query_param, cursor)

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "required": ["results"],
            "properties": {
                "next": {
                    "type": "string",
                    "nullable": True,
                    "format": "uri",
                    "description": "The next page; null at the end.",
                },
                "previous": {
                    "type": "string",
                    "nullable": True,
                    "format": "uri",
                    "description": "The previous page; null on the first.",
                },
                "results": schema,
            },
        }

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "Where the page starts: take it from a page's `next` or `previous` link.",
                "schema": {"type": "string"},
            },
            {
                "name": self.limit_query_param,
                "required": False,
                "in": "query",
                "description": f"Results per page (default {self.default_limit}); more than {self.max_limit} reads "
                f"as {self.max_limit}.",
                "schema": {"type": "integer", "minimum": 1},
            },
        ]


def keyset_cursor(position: Position, *, state: dict[str, Any], backwards: bool = False, ordering: str = "") -> str:
    """The ``?cursor=`` value of ``position`` (for tools that jump into a list, e.g. the benchmark)."""
    return encode_cursor(position, backwards=backwards, state=state, ordering=ordering)
