"""The audit log: every user action, who took it, from where, and what changed.

The services write the entries (:func:`audit_record`), in the transaction of the change, so an
action from the API, the admin, the back office or a command is recorded the same way. Who and
where come from the *audit context*, a context variable set once at the edge instead of being
passed through every call:

* :class:`AuditContextMiddleware` sets it for every web request: the source is ``api`` (under
  ``/api/`` and the original ``/tasks`` API), ``admin`` (under ``/admin/``) or ``backoffice``,
  the address is the client's (:func:`tms_core.client_address.client_address`), and the actor
  is the request's user as it is when the entry is written (so DRF's token authentication,
  which runs in the view, counts).
* :class:`AuditedCommand`, the base of management commands that act, sets ``command:<name>``
  with the operating-system user who ran it (:func:`audit_context` does the same for any code).
* Without a context (the scheduler's own processes) the source is ``system``.

Other apps record their own objects with :func:`audit_record` (for example a notifications app:
``audit_record(action="channel.update", object_type="channel", object_id=..., owner=...,
changes=audit_diff(before, after))``), masking secrets in what they pass.
"""

from __future__ import annotations

import contextlib
import contextvars
import getpass
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.management.base import BaseCommand
from django.http import HttpRequest, HttpResponse

from tasks_app.models import AuditEntry
from tms_core.auth import acting_token_id
from tms_core.bulk import insert_columns
from tms_core.client_address import client_address


@dataclass(frozen=True)
class AuditContext:
    """Who acts and from where, for the entries written while it is set."""

    source: str
    actor: AbstractBaseUser | None = None
    #: An explicit name (a command's OS user); else the actor's username.
    actor_name: str = ""
    remote_addr: str | None = None
    #: The web request, whose ``user`` is read when an entry is written (set after authentication).
    request: HttpRequest | None = None

    def who(self) -> tuple[AbstractBaseUser | None, str]:
        user = self.actor
        if user is None and self.request is not None:
            candidate = getattr(self.request, "user", None)
            if candidate is not None and candidate.is_authenticated:
                user = candidate
        name = self.actor_name or (user.get_username() if user is not None else "")
        return user, name or "anonymous"


_context: contextvars.ContextVar[AuditContext | None] = contextvars.ContextVar("tms_audit_context", default=None)


def current_context() -> AuditContext | None:
    return _context.get()


def acting_token() -> int | None:
    """The personal access token the current actor acts through (None: a session, an account
    key, a command, the system): services record what a token makes as its own."""
    context = current_context()
    if context is None:
        return None
    actor, _ = context.who()
    return acting_token_id(actor) if actor is not None else None


@contextlib.contextmanager
def audit_context(
    *, source: str, actor: AbstractBaseUser | None = None, actor_name: str = "", remote_addr: str | None = None
) -> Iterator[AuditContext]:
    """Record the entries written inside as coming from ``source`` (and ``actor``)."""
    context = AuditContext(source=source, actor=actor, actor_name=actor_name, remote_addr=remote_addr)
    token = _context.set(context)
    try:
        yield context
    finally:
        _context.reset(token)


def request_source(path: str) -> str:
    """Where a web request comes from, by its path."""
    if path.startswith("/admin/"):
        return "admin"
    if path.startswith("/api/") or path == "/tasks" or path.startswith("/tasks/"):
        return "api"
    return "backoffice"


class AuditContextMiddleware:
    """Sets the audit context for each web request (see the module docstring)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        context = AuditContext(
            source=request_source(request.path), remote_addr=client_address(request), request=request
        )
        token = _context.set(context)
        try:
            return self.get_response(request)
        finally:
            _context.reset(token)


class AuditedCommand(BaseCommand):
    """Base of management commands that act on users' objects: their actions are recorded as
    ``command:<name>`` by the operating-system user who ran the command."""

    #: The operating-system user running the command (set by :meth:`execute`).
    os_user = "unknown"

    def execute(self, *args: Any, **options: Any) -> Any:
        name = type(self).__module__.rpartition(".")[2]
        try:
            self.os_user = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry (some containers)
            self.os_user = "unknown"
        with audit_context(source=f"command:{name}", actor_name=self.os_user):
            return super().execute(*args, **options)


# --- writing entries ----------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float):  # most values: nothing to convert
        return value
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if hasattr(value, "pk"):
        return None if value.pk is None else str(value.pk)
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return value


def audit_value(value: Any) -> Any:
    """One value as an audit entry stores it (see :func:`audit_values`)."""
    return _jsonable(value)


def audit_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as an audit entry stores them (durations in seconds, times in ISO 8601, ids as text)."""
    return {name: _jsonable(value) for name, value in values.items()}


def audit_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{field: {"from": ..., "to": ...}}`` for each field whose value differs (give both sides
    with secrets already masked)."""
    diff = {}
    for name in sorted(set(before) | set(after)):
        old, new = _jsonable(before.get(name)), _jsonable(after.get(name))
        if old != new:
            diff[name] = {"from": old, "to": new}
    return diff


def _who() -> dict[str, Any]:
    """The columns that say who acted, from the current context (a system action outside one)."""
    context = current_context()
    actor, actor_name = context.who() if context is not None else (None, "system")
    return {
        "actor_id": actor.pk if actor is not None else None,
        "actor_name": actor_name[:150],
        "source": (context.source if context is not None else "system")[:100],
        "remote_addr": context.remote_addr if context is not None else None,
    }


def audit_record(
    *,
    action: str,
    object_type: str,
    object_id: Any,
    owner: AbstractBaseUser | int | None,
    task_id: Any = None,
    changes: Mapping[str, Any] | None = None,
    detail: str = "",
) -> AuditEntry:
    """Write one audit entry for an action on an object of ``owner``, as the current context's
    actor and source. Call it inside the transaction of the change. ``changes`` must already
    have its secrets masked."""
    return AuditEntry.objects.create(
        **_who(),
        action=action,
        object_type=object_type,
        object_id=str(object_id),
        task_id=task_id,
        owner_id=owner if isinstance(owner, int) or owner is None else owner.pk,
        changes=_jsonable(dict(changes or {})),
        detail=detail[:500],
    )


def audit_record_many(entries: Sequence[Mapping[str, Any]]) -> None:
    """:func:`audit_record` for many objects at once, in one INSERT of column arrays (no model
    instance per entry): each mapping holds the arguments of one (``action``, ``object_type``,
    ``object_id``, ``owner`` as an id, and optionally ``task_id``, ``changes``, ``detail``).
    Every entry has the current context's actor and source, and the transaction's time.
    ``changes`` are stored as given: JSON-ready already, as :func:`audit_diff` and
    :func:`audit_values` return them (converting them again was a fifth of a bulk create)."""
    if not entries:
        return
    count = len(entries)
    insert_columns(
        AuditEntry,
        {
            **{column: [value] * count for column, value in _who().items()},
            "action": [entry["action"] for entry in entries],
            "object_type": [entry["object_type"] for entry in entries],
            "object_id": [str(entry["object_id"]) for entry in entries],
            "task_id": [entry.get("task_id") for entry in entries],
            "owner_id": [entry["owner"] for entry in entries],
            "changes": [entry.get("changes") or {} for entry in entries],
            "detail": [entry.get("detail", "")[:500] for entry in entries],
        },
    )
