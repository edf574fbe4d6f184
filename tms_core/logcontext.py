"""Execution ids on every log line written while an execution is handled.

Where a process handles an execution (a worker's run or resume, the monitor's dispatch, a job's
callback report) it binds the ids with :func:`log_context`; :class:`ContextFilter`, on the
handler of every process's logging configuration (``tms_project.log_config``), copies them onto
each record as flat fields (``execution_id``, ``attempt``, ``task_id``, ``tracing_id``,
``worker_id``, ``celery_task_id``, and ``trace_id``, the run's OpenTelemetry trace, when tracing
is on), so a JSON log line can be found by any of them. Context
variables keep a binding to the thread that made it: the lease keeper thread binds its own.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager

#: The fields that can be bound, in the order the plain format shows them.
CONTEXT_KEYS = ("execution_id", "attempt", "task_id", "tracing_id", "worker_id", "celery_task_id", "trace_id")

_EMPTY: dict[str, object] = {}
_context: contextvars.ContextVar[dict[str, object]] = contextvars.ContextVar("tms_log_context", default=_EMPTY)


def bound() -> dict[str, object]:
    """The fields bound in this thread now (a copy)."""
    return dict(_context.get())


def _merged(fields: dict[str, object]) -> dict[str, object]:
    unknown = set(fields) - set(CONTEXT_KEYS)
    if unknown:
        raise TypeError(f"unknown log context fields: {', '.join(sorted(unknown))}")
    return {**_context.get(), **{k: v for k, v in fields.items() if v not in (None, "")}}


@contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Bind ``fields`` (names from :data:`CONTEXT_KEYS`; empty values are left out) on top of
    what is bound already, for the lines logged inside the block."""
    token = _context.set(_merged(fields))
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: object) -> contextvars.Token[dict[str, object]]:
    """Like :func:`log_context`, for code that cannot wrap a block (Celery's task_prerun and
    task_postrun signals); undo with :func:`unbind`."""
    return _context.set(_merged(fields))


def add(**fields: object) -> None:
    """Add ``fields`` to the innermost binding in place, so they stay until that binding ends
    (a worker adds the task's ids once it has loaded the row, and Celery's "succeeded" line,
    logged after the task returns, carries them too). Does nothing where nothing is bound."""
    current = _context.get()
    if current is not _EMPTY:
        current.update({k: v for k, v in _merged(fields).items() if k in fields})


def unbind(token: contextvars.Token[dict[str, object]]) -> None:
    try:
        _context.reset(token)
    except ValueError:  # made in another context: drop everything rather than keep stale ids
        _context.set(_EMPTY)


#: Texts masked in every line logged while bound: the secret values of the task being handled.
_redacted: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("tms_log_redacted", default=())
REDACTED = "********"


@contextmanager
def redacting(values: tuple[str, ...] | list[str]) -> Iterator[None]:
    """Mask ``values`` (a task's secrets) in the lines logged inside the block, exception texts
    included: a library's error message that quotes a URL or a header never reaches the logs."""
    token = _redacted.set(tuple(_redacted.get()) + tuple(values))
    try:
        yield
    finally:
        _redacted.reset(token)


def _redact(text: str, values: tuple[str, ...]) -> str:
    for value in values:
        text = text.replace(value, REDACTED)
    return text


class ContextFilter(logging.Filter):
    """Copy the bound fields onto each record (a field the call passed in ``extra`` wins), and
    mask the values bound with :func:`redacting` in its message and exception text."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        values = _redacted.get()
        if values:
            message = record.getMessage()
            redacted = _redact(message, values)
            if redacted != message:
                record.msg, record.args = redacted, ()
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = _redact(record.exc_text, values)
                record.exc_info = None  # formatters print exc_text, never the unmasked original
        return True


class PlainFormatter(logging.Formatter):
    """The human-readable format (``make run``): the line, then the bound ids in brackets."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = " ".join(f"{key}={getattr(record, key)}" for key in CONTEXT_KEYS if hasattr(record, key))
        if not ids:
            return text
        first, newline, rest = text.partition("\n")
        return f"{first} [{ids}]{newline}{rest}"
