"""Statements that need no answer, sent with the next one that does: one round trip for several.

A task create wrote its task, its audit entry, its version, the wake-up for the monitors and its
executions in five statements, five round trips to PostgreSQL; on a loaded machine each costs
about a millisecond of waiting for the server process to be scheduled (issue 33: single creates
p99). Inside :func:`sent_together`, :func:`execute_soon` keeps a statement back, and the next
statement run on the connection (any, through Django's cursor) carries the ones kept back before
it, in one ``execute`` of several statements, which psycopg2 sends as one simple query; what the
caller fetches is the last statement's result, its own. Whatever is still kept back when the block
ends is sent then. A failure of any of them fails that ``execute``, in the caller's transaction,
as the first statement's failure would have.

Outside the block, or on a database other than PostgreSQL, :func:`execute_soon` runs the
statement at once.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.db import connection

#: The statements kept back on this thread (or task), or None outside :func:`sent_together`.
_kept: contextvars.ContextVar[list[tuple[str, Sequence[Any]]] | None] = contextvars.ContextVar(
    "tms_sent_together", default=None
)


def _joined(kept: list[tuple[str, Sequence[Any]]], sql: str, params: Sequence[Any]) -> tuple[str, list[Any]]:
    statements = [statement for statement, _ in kept]
    values: list[Any] = [value for _, given in kept for value in given]
    return ";\n".join([*statements, sql]), [*values, *params]


def _carry(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    kept = _kept.get()
    if not kept:
        return execute(sql, params, many, context)
    if params is None and "%" not in sql:
        params = ()  # a statement without parameters: nothing of it reads as a placeholder
    if many or not isinstance(params, list | tuple):
        # executemany, named parameters or a literal %: the kept statements go first, on their own.
        flush()
        return execute(sql, params, many, context)
    joined, values = _joined(kept, sql, params)
    kept.clear()
    return execute(joined, values, many, context)


def execute_soon(sql: str, params: Sequence[Any] = ()) -> None:
    """Run ``sql`` (a statement whose result nobody reads; ``%s`` placeholders) now, or inside
    :func:`sent_together` with the next statement."""
    kept = _kept.get()
    if kept is None:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
        return
    kept.append((sql, list(params)))


def flush() -> None:
    """Send the statements kept back, if any, now."""
    kept = _kept.get()
    if not kept:
        return
    joined, values = _joined(kept[:-1], *kept[-1])
    kept.clear()
    with connection.cursor() as cursor:
        cursor.execute(joined, values)


@contextlib.contextmanager
def sent_together() -> Iterator[None]:
    """Inside: statements given to :func:`execute_soon` wait for the next statement run on the
    default connection and go with it; the rest are sent when the block ends (and dropped if it
    raises: the caller's transaction fails with it). Use it inside the transaction that writes."""
    flush()  # an enclosing block's statements keep their place, before this block's
    token = _kept.set([])
    try:
        with connection.execute_wrapper(_carry):
            yield
            flush()
    finally:
        _kept.reset(token)
