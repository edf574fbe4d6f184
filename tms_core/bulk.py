"""Many rows in one INSERT, given as columns: on PostgreSQL one array literal per column, unnested
server-side.

Django's ``bulk_create`` costs, per row, a model instance, a ``pre_save`` and a
``get_db_prep_save`` per field and (when a field has a database default, such as the audit log's
``at``) a ``VALUES`` list of thousands of placeholders for the server to parse: a cProfile of
2,000 tasks created in bulk spent more time there than in everything else the service does
(issue 33). :func:`insert_columns` formats each value once, by its type, into the text of a
``%s::type[]`` parameter; the statement stays a few hundred bytes whatever the row count.

From :data:`COPY_FROM_ROWS` rows on it sends them by ``COPY ... FROM STDIN`` instead (text
format): PostgreSQL reads each value straight into its column, where the array parameters were
parsed as arrays first and then unnested; 1,000 tasks or audit entries took a fifth to two fifths
less server time (issue 50). A COPY is a round trip of its own, which a batch that large does not
notice; fewer rows keep to the one INSERT, which can go with the next statement.
"""

from __future__ import annotations

import functools
import io
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Field, ForeignKey, JSONField, Model

from tms_core.together import execute_soon, flush


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _interval_text(value: timedelta) -> str:
    # Exact (no float seconds) and accepted by PostgreSQL's interval input whatever the sign.
    return f"{value.days} days {value.seconds} seconds {value.microseconds} microseconds"


def _interval(value: timedelta) -> str:
    return f'"{_interval_text(value)}"'


#: How a Python value becomes an array element; a type not listed is written as quoted text.
_FORMATS: dict[type, Callable[[Any], str]] = {
    str: _quoted,
    bool: lambda value: "t" if value else "f",
    int: int.__repr__,
    float: float.__repr__,
    uuid.UUID: uuid.UUID.__str__,
    datetime: datetime.isoformat,
    date: date.isoformat,
    timedelta: _interval,
}


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    write = _FORMATS.get(type(value))
    return write(value) if write is not None else _quoted(str(value))


class JsonText(str):
    """A JSON column's value given as its JSON text, encoded already (a caller that writes many
    rows sharing most of their values encodes each shared part once): :func:`insert_columns`
    sends it as it is instead of encoding the string again."""

    __slots__ = ()


@functools.lru_cache(maxsize=16)
def json_encoder(cls: Any) -> Callable[[Any], str]:
    """The compact ``encode`` of ``cls`` (a ``json.JSONEncoder`` class; the standard one for
    None), made once: ``json.dumps`` with ``cls`` or ``separators`` builds a new encoder for
    every value. An encoder keeps no state between calls, so threads share it."""
    return (cls or json.JSONEncoder)(separators=(",", ":")).encode


def _json_column(field: JSONField, values: Sequence[Any]) -> str:
    encoder: Any = field.encoder  # a class or None: hashable, whatever the stubs say
    encode = json_encoder(encoder)
    return (
        "{"
        + ",".join(
            "NULL" if value is None else _quoted(value if isinstance(value, JsonText) else encode(value))
            for value in values
        )
        + "}"
    )


def array_literal(field: Field, values: Sequence[Any]) -> str:
    """The PostgreSQL array literal of ``values`` for a ``%s::type[]`` parameter of ``field``'s type."""
    if isinstance(field, JSONField):
        return _json_column(field, values)
    # Most columns of a batch repeat a few values (its owner, runner, defaults): each is formatted once.
    formatted: dict[Any, str] = {}
    elements = []
    for value in values:
        text = formatted.get(value)
        if text is None:
            text = formatted[value] = _element(value)
        elements.append(text)
    return "{" + ",".join(elements) + "}"


def _is_json(field: Field) -> bool:
    return isinstance(field, JSONField)


def _db_type(field: Field) -> str:
    target = field.target_field if isinstance(field, ForeignKey) else field
    # Without its size: varchar(200)[] would truncate silently where the column would refuse.
    return str(target.db_type(connection)).split("(")[0]


@functools.lru_cache(maxsize=64)
def _statement(model: type[Model], names: tuple[str, ...]) -> tuple[str, list[Field]]:
    """The INSERT of ``names`` into ``model``'s table (PostgreSQL), and their fields: built once
    per model and column list (a single task's create spent a tenth of its time building it)."""
    fields = {field.attname: field for field in model._meta.concrete_fields}
    targets = [fields[name] for name in names]
    column_list = ", ".join(connection.ops.quote_name(str(field.column)) for field in targets)
    aliases = [f"c{index}" for index in range(len(targets))]
    # JSON travels as text[] and is cast per element: parsing a jsonb[] literal took PostgreSQL
    # about three times as long (its elements are escaped twice).
    arrays = ", ".join(f"%s::{'text' if _is_json(field) else _db_type(field)}[]" for field in targets)
    selected = ", ".join(
        f"{alias}::{_db_type(field)}" if _is_json(field) else alias
        for alias, field in zip(aliases, targets, strict=True)
    )
    table = connection.ops.quote_name(model._meta.db_table)
    statement = (
        f"INSERT INTO {table} ({column_list}) SELECT {selected} FROM unnest({arrays}) AS v ({', '.join(aliases)})"  # noqa: S608 - names are the model's
    )
    return statement, targets


#: From this many rows on, :func:`insert_columns` sends them by COPY (on PostgreSQL through psycopg2).
COPY_FROM_ROWS = 200


def _copy_text(text: str) -> str:
    """``text`` as a value of COPY's text format (backslash, tab, newline and carriage return escaped)."""
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        text = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


#: How a Python value becomes a value of COPY's text format (as an array element, but for text
#: and intervals: no quotes); a type not listed is written as its text.
_COPY_FORMATS: dict[type, Callable[[Any], str]] = {**_FORMATS, str: _copy_text, timedelta: _interval_text}


def _copy_column(field: Field, values: Sequence[Any]) -> list[str]:
    """``values`` of ``field`` as COPY text values, each distinct one formatted once."""
    count = len(values)
    first = values[0]
    if all(value is first for value in values):  # a column of one value (a default, the owner ...)
        values = values[:1]
    if isinstance(field, JSONField):
        encoder: Any = field.encoder
        encode = json_encoder(encoder)
        encoded = [
            "\\N" if value is None else _copy_text(value if isinstance(value, JsonText) else encode(value))
            for value in values
        ]
        return encoded if len(encoded) == count else encoded * count
    formatted: dict[Any, str] = {}
    texts = []
    for value in values:
        text = formatted.get(value)
        if text is None:
            if value is None:
                text = "\\N"
            else:
                write = _COPY_FORMATS.get(type(value))
                text = write(value) if write is not None else _copy_text(str(value))
            formatted[value] = text
        texts.append(text)
    return texts if len(texts) == count else texts * count


def _copy(model: type[Model], targets: list[Field], columns: Mapping[str, Sequence[Any]]) -> bool:
    """COPY the rows in; False where COPY is not at hand (another database or driver)."""
    with connection.cursor() as cursor:
        raw: Any = getattr(cursor, "cursor", None)
        if connection.vendor != "postgresql" or not hasattr(raw, "copy_expert"):
            return False
        flush()  # the statements kept back go first, in order
        texts = [_copy_column(field, columns[field.attname]) for field in targets]
        body = "".join("\t".join(row) + "\n" for row in zip(*texts, strict=True))
        quote = connection.ops.quote_name
        column_list = ", ".join(quote(str(field.column)) for field in targets)
        raw.copy_expert(f"COPY {quote(model._meta.db_table)} ({column_list}) FROM STDIN", io.StringIO(body))
    return True


def insert_columns(model: type[Model], columns: Mapping[str, Sequence[Any]]) -> int:
    """Insert ``len`` rows of ``model`` given as ``{attname: values}`` (every list as long; the
    columns not given take their database defaults) in one statement, in the caller's
    transaction (inside :func:`tms_core.together.sent_together`, sent with the next statement).
    Values are the Python values of the fields (no expressions); a JSON column's may also be
    :class:`JsonText`. Returns the rows written."""
    names = list(columns)
    count = len(columns[names[0]]) if names else 0
    if not count:
        return 0
    statement, targets = _statement(model, tuple(names))
    if count >= COPY_FROM_ROWS and _copy(model, targets, columns):
        return count
    # Inside tms_core.together.sent_together() it goes with the next statement (every row is
    # inserted or the statement fails: the count is known).
    execute_soon(statement, [array_literal(field, columns[field.attname]) for field in targets])
    return count
