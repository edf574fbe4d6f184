"""What the services of a team's named objects (named limits, business calendars) share: a new
one saved with its audit entry, a partial change's fields checked, a change audited, a deletion
audited.

Each object is unique by name within its team; the services check the name first and say so
on ``name``, and a concurrent create of the same name (the unique constraint) says the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from django.db import IntegrityError, models, transaction

from tasks_app.audit import audit_diff, audit_record
from tms_core.errors import InvalidInput

ModelT = TypeVar("ModelT", bound=models.Model)


def name_taken(kind: str, name: str) -> InvalidInput:
    """The error on ``name`` for a ``kind`` ("limit", "calendar") whose name its team has already."""
    return InvalidInput.on("name", f"A {kind} named {name!r} exists already.")


def create_audited(
    obj: models.Model, *, kind: str, owner_id: int | None, snapshot: Callable[[Any], Mapping[str, Any]]
) -> None:
    """Save the new ``obj`` (a ``kind``, with a ``name``) and audit ``<kind>.create`` with its
    ``snapshot``, in one transaction; a concurrent create of the same name is :func:`name_taken`."""
    try:
        with transaction.atomic():
            obj.save()
            audit_record(
                action=f"{kind}.create",
                object_type=kind,
                object_id=obj.pk,
                owner=owner_id,
                changes=audit_diff({}, snapshot(obj)),
            )
    except IntegrityError:  # a concurrent create of the same name won
        raise name_taken(kind, obj.name) from None  # type: ignore[attr-defined]


def listed(value: Any, *, field: str, expected: str, most: int, too_many: str) -> list[Any]:
    """A JSON field that holds a list of at most ``most`` entries (a limit's windows, a calendar's
    extra dates): None or "" is the empty list; anything else but a list is an error on ``field``
    saying what was ``expected``, a longer list one saying ``too_many``."""
    if value in (None, ""):
        return []
    if not isinstance(value, list):
        raise InvalidInput.on(field, f"Expected a list of {expected}.")
    if len(value) > most:
        raise InvalidInput.on(field, too_many)
    return value


def refuse_unknown(changes: Mapping[str, Any], fields: Iterable[str]) -> None:
    """InvalidInput naming each field of a partial change that is not one of ``fields``."""
    unknown = set(changes) - set(fields)
    if unknown:
        raise InvalidInput({name: ["This field cannot be changed."] for name in sorted(unknown)})


def change_locked(
    obj: ModelT,
    changes: Mapping[str, Any],
    *,
    fields: Iterable[str],
    snapshot: Callable[[Any], Mapping[str, Any]],
    clean: Mapping[str, Callable[[Any], Any]] | None = None,
) -> tuple[ModelT, Mapping[str, Any]]:
    """The first steps of a partial change, in the caller's transaction: ``changes`` checked
    against ``fields`` (:func:`refuse_unknown`), ``obj``'s row locked and read again, each change
    set on it (through ``clean[field]`` where given). Returns the locked object, not saved yet,
    and its ``snapshot`` from before the change (for :func:`audit_update`)."""
    refuse_unknown(changes, fields)
    locked = type(obj)._default_manager.select_for_update().get(pk=obj.pk)
    before = snapshot(locked)
    for name, value in changes.items():
        setattr(locked, name, (clean or {}).get(name, _as_is)(value))
    return locked, before


def _as_is(value: Any) -> Any:
    return value


def audit_update(obj: Any, *, kind: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Audit ``<kind>.update`` with what changed between the two snapshots, if anything did."""
    diff = audit_diff(before, after)
    if diff:
        audit_record(action=f"{kind}.update", object_type=kind, object_id=obj.pk, owner=obj.owner_id, changes=diff)


def delete_audited(obj: Any, *, kind: str, snapshot: Callable[[Any], Mapping[str, Any]]) -> None:
    """Audit ``<kind>.delete`` with what ``obj`` held, then delete it (in the caller's transaction)."""
    audit_record(
        action=f"{kind}.delete",
        object_type=kind,
        object_id=obj.pk,
        owner=obj.owner_id,
        changes=audit_diff(snapshot(obj), {}),
    )
    obj.delete()
