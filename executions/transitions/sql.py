"""How the transitions write: one data-modifying statement and its events.

Every status change of the package goes through :func:`with_events` (through :func:`write` for an
UPDATE): the statement returns the rows it changed (``id, attempt`` first) and one
:class:`~executions.models.ExecutionEvent` is written per row, in the same statement
(``WITH done AS (… RETURNING …) INSERT INTO event … SELECT … FROM done``). An event's time
is the time of its write (``clock_timestamp()``), not its transaction's start: a write that waited
behind a lock is recorded when it happened.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import connection
from django.db.models import DateTimeField, ExpressionWrapper, Field, Model, Q, QuerySet, Value, sql
from django.db.models.functions import Now

from executions.models import Execution, ExecutionEvent
from executions.transitions.states import Edge
from tasks_app.models import Task

EXECUTIONS = Execution._meta.db_table
TASKS = Task._meta.db_table
EVENTS = ExecutionEvent._meta.db_table
#: The columns of an event row, in the order :func:`with_events` writes them.
EVENT_COLUMNS = "execution_id, from_status, to_status, attempt, at, actor, detail"
#: What every statement returns first: the event is written from these.
ID_ATTEMPT = "id, attempt"


def key_share(alias: str) -> str:
    """The lock a statement that inserts executions takes on the task row ``alias`` it reads:
    ``FOR KEY SHARE``, as a foreign key's check would (see ``Execution.task``), so that the task
    cannot be deleted before the insert commits."""
    return f" FOR KEY SHARE OF {alias}"


@dataclass(frozen=True)
class Event:
    """The audit event written for each row a statement changed (its attempt is the row's, after
    the write)."""

    from_status: str
    to_status: str
    actor: str
    detail: str = ""

    def params(self) -> tuple[str, str, str, str]:
        return self.from_status, self.to_status, self.actor[:200], self.detail


def pg_event_cte(done: str = "done", *, detail_sql: str | None = None) -> str:
    """The CTE that writes one event per row of ``done`` (parameters: :meth:`Event.params`; with
    ``detail_sql``, an expression over ``done``'s columns, each row's detail is its value and the
    event's own detail is not a parameter)."""
    return (
        f"logged AS (INSERT INTO {EVENTS} ({EVENT_COLUMNS}) "  # noqa: S608 - table names are ours
        f"SELECT id, %s, %s, attempt, clock_timestamp(), %s, {detail_sql or '%s'} FROM {done})"
    )


def with_events(
    statement: str,
    params: Sequence[Any],
    event: Event,
    *,
    returning: str = ID_ATTEMPT,
    select: str = "SELECT * FROM done",
    detail_sql: str | None = None,
) -> list[tuple]:
    """Run ``statement`` (an UPDATE or INSERT without RETURNING) and write ``event`` for each row
    it changed; return those rows (``returning``, which starts with ``id, attempt``).

    ``select`` (over the CTE ``done``) may shape what is returned, and ``detail_sql`` (an
    expression over ``returning``'s columns) gives each row's event its own detail."""
    text = f"WITH done AS ({statement} RETURNING {returning}), {pg_event_cte(detail_sql=detail_sql)} {select}"
    event_params = event.params()
    with connection.cursor() as cursor:
        cursor.execute(text, (*params, *(event_params[:3] if detail_sql else event_params)))
        return cursor.fetchall()


def compile_update(queryset: QuerySet, values: Mapping[str, Any]) -> tuple[str, tuple]:
    """Compile ``queryset.update(**values)`` to SQL without running it."""
    query = queryset.query.chain(sql.UpdateQuery)
    assert isinstance(query, sql.UpdateQuery)  # chain(klass) returns a copy of that class
    query.add_update_values(dict(values))
    return query.get_compiler(connection=connection).as_sql()


def where(edge: Edge, source: str | None = None) -> Q:
    """The status part of a transition's WHERE clause, from its edge: the edge's sources, or the
    one ``source`` of them the caller saw (it must be one)."""
    if source is not None:
        if source not in edge.sources:
            raise ValueError(f"{edge.name} does not leave {source}")
        return Q(status=source)
    if len(edge.sources) == 1:
        return Q(status=next(iter(edge.sources)))
    return Q(status__in=sorted(edge.sources))


def write(
    edge: Edge,
    condition: Q,
    values: Mapping[str, Any],
    *,
    actor: str,
    detail: str = "",
    source: str | None = None,
    returning: str = ID_ATTEMPT,
    select: str = "SELECT * FROM done",
) -> list[tuple]:
    """The one way a transition writes: ``UPDATE … SET status = edge.target, values WHERE
    condition AND status IN (edge's sources)`` with its event; returns the rows it won (``id,
    attempt`` first, see :func:`with_events`), none if it lost.

    An edge with several sources needs ``source``: the status the caller saw, which the event
    records (the UPDATE then accepts that one only)."""
    statement, params = _compile(edge, condition, values, source)
    return with_events(statement, params, _event(edge, source, actor, detail), returning=returning, select=select)


def _compile(edge: Edge, condition: Q, values: Mapping[str, Any], source: str | None) -> tuple[str, tuple]:
    if source is None and len(edge.sources) > 1:
        raise ValueError(f"{edge.name} leaves several statuses: say which")
    queryset = Execution.objects.filter(condition, where(edge, source))
    changes = dict(values) if edge.keeps else {**values, "status": edge.target}
    return compile_update(queryset, changes)


def _event(edge: Edge, source: str | None, actor: str, detail: str) -> Event:
    return Event(source or next(iter(edge.sources)), edge.target, actor, detail)


# --- transitions on the hot path, compiled once ---------------------------------------------

#: A marker stands for a bound value while a prepared statement is compiled: a value no constant
#: of the statement has, so its positions in the compiled parameters are found by equality. An
#: int marker stays within a 32-bit column's range (Django compiles an out-of-range integer
#: lookup to "no rows").
_MARKER_BASE: Mapping[type, Callable[[int], Any]] = {
    int: lambda n: 2_147_483_000 + n,
    str: lambda n: f"\x00tms-bind-{n}\x00",
    timedelta: lambda n: timedelta(days=900_000_000 + n),
}
#: How a call's value is passed for each kind of marker.
_COERCE: Mapping[type, Callable[[Any], Any]] = {int: int, str: str, timedelta: lambda value: value}


@dataclass(frozen=True)
class _Prepared:
    statement: str
    params: tuple
    #: (position in ``params``, name of the bound value) for each marker found.
    slots: tuple[tuple[int, str], ...]
    kinds: Mapping[str, type]


_PREPARED: dict[tuple, _Prepared] = {}


def _prepare(
    edge: Edge, build: Callable[..., tuple[Q, Mapping[str, Any]]], binds: Mapping[str, Any], source: str | None
) -> _Prepared:
    # A bound value is an int, a str or a timedelta (a bool or None changes the statement's text:
    # it belongs in the shape).
    kinds = {name: type(value) for name, value in binds.items()}
    markers = {name: _MARKER_BASE[kind](n) for n, (name, kind) in enumerate(kinds.items())}
    condition, values = build(**markers)
    statement, params = _compile(edge, condition, values, source)
    slots = tuple(
        (index, name)
        for index, param in enumerate(params)
        for name, marker in markers.items()
        if type(param) is type(marker) and param == marker
    )
    unbound = set(binds) - {name for _, name in slots}
    if unbound:  # a value the build dropped or transformed: binding it would be silently wrong
        raise ValueError(f"{edge.name}: {sorted(unbound)} did not reach the statement's parameters")
    return _Prepared(statement, tuple(params), slots, kinds)


def write_prepared(
    edge: Edge,
    shape: Hashable,
    build: Callable[..., tuple[Q, Mapping[str, Any]]],
    binds: Mapping[str, Any],
    *,
    actor: str,
    detail: str = "",
    source: str | None = None,
    returning: str = ID_ATTEMPT,
    select: str = "SELECT * FROM done",
) -> list[tuple]:
    """:func:`write` for a transition on the hot path: its UPDATE is compiled by the ORM once per
    process and ``shape`` (what changes the statement's text), from ``build(**binds)`` with a
    marker in place of each bound value; each call then puts its own ``binds`` (int, str or
    timedelta; what varies from call to call) at the markers' places. The same statement as
    :func:`write` would run: Django compiling the UPDATEs was most of the worker service's CPU per
    execution (cProfile, docs/benchmarks.md)."""
    key = (edge.name, source, returning, shape)
    prepared = _PREPARED.get(key)
    if prepared is None:
        prepared = _PREPARED[key] = _prepare(edge, build, binds, source)
    params = list(prepared.params)
    for index, name in prepared.slots:
        params[index] = _COERCE[prepared.kinds[name]](binds[name])
    return with_events(
        prepared.statement, params, _event(edge, source, actor, detail), returning=returning, select=select
    )


def write_quiet(edge: Edge, condition: Q, values: Mapping[str, Any]) -> int:
    """A write that changes no status and records no event (a lease, a poll time); returns how
    many rows it changed."""
    assert edge.keeps, "a status change writes its event"
    return Execution.objects.filter(condition, where(edge)).update(**values)


def db_now_plus(seconds: float) -> ExpressionWrapper:
    return db_now_after(timedelta(seconds=seconds))


def db_now_after(interval: timedelta) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + Value(interval), output_field=DateTimeField())


def bounded(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = f"\n… [{len(text) - limit} characters cut]"
    return text[: max(0, limit - len(marker))] + marker


def _quoted(value: object) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


#: How an array element of each type is written: text is quoted; numbers, booleans, UUIDs and
#: timestamps (ISO 8601: digits and -:.+T) need not be.
_ELEMENT_FORMATS: Mapping[type, Callable[[Any], str]] = {
    datetime: datetime.isoformat,
    bool: lambda value: "t" if value else "f",
    int: int.__repr__,
    uuid.UUID: uuid.UUID.__str__,
}


def pg_array(values: Iterable[object]) -> str:
    """A PostgreSQL array literal (``{"a","b",NULL}``) for a ``%s::type[]`` parameter; the
    values are of one type, or None.

    Bulk writes pass one such text per column and ``unnest`` them server-side: the statement
    stays a few hundred bytes whatever the row count, where a VALUES list of thousands of rows
    costs the client its quoting and the server its parsing.
    """
    values = list(values)
    kind = next((type(value) for value in values if value is not None), str)
    write = _ELEMENT_FORMATS.get(kind, _quoted)
    return "{" + ",".join(["NULL" if value is None else write(value) for value in values]) + "}"


_M = TypeVar("_M", bound=Model)


def from_row(model: type[_M], fields: Sequence[Field], values: Sequence[Any]) -> _M:
    """A model instance from raw column values, through the same converters a query applies."""
    converters = _converters(model, tuple(fields))
    converted = []
    for value, (column, field_converters) in zip(values, converters, strict=True):
        for converter in field_converters:
            value = converter(value, column, connection)
        converted.append(value)
    return model.from_db(connection.alias, [f.attname for f in fields], converted)


_CONVERTERS: dict[tuple, list[tuple[Any, list[Callable[..., Any]]]]] = {}


def _converters(model: type[Model], fields: tuple[Field, ...]) -> list[tuple[Any, list[Callable[..., Any]]]]:
    """Each field's column and converters, looked up once per process."""
    key = (model, fields)
    found = _CONVERTERS.get(key)
    if found is None:
        found = []
        for field in fields:
            column = field.get_col(model._meta.db_table)
            found.append((column, connection.ops.get_db_converters(column) + field.get_db_converters(connection)))
        _CONVERTERS[key] = found
    return found
