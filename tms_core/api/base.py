"""What every API view and serializer shares: owner scoping, input hygiene, pagination."""

from __future__ import annotations

import contextlib
import copy
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db.models import QuerySet
from django.utils.dateparse import parse_datetime
from django_filters import rest_framework as filters
from rest_framework import serializers
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from tms_core.auth import sees_everything
from tms_core.roles import may_act_for

# The mixins below are only ever combined with DRF's GenericAPIView and Serializer (they come first
# in the bases, so their super() calls reach DRF): let the type checker see those bases.
if TYPE_CHECKING:
    from rest_framework.generics import GenericAPIView

    _ViewBase = GenericAPIView
    _SerializerBase = serializers.Serializer
    _FieldBase = serializers.Field
else:
    _ViewBase = _SerializerBase = _FieldBase = object


class ApiViewMixin(_ViewBase):
    """Base of every API view: rejects what the database cannot store or compare.

    PostgreSQL refuses NUL characters in text, so a query parameter holding one would otherwise
    fail deep in a filter with a server error; it answers 400 (404 in a path) instead.
    """

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        if any("\x00" in str(value) for value in kwargs.values()):
            raise NotFound()
        params = request.query_params.lists()
        bad = sorted({key for key, values in params if "\x00" in key or any("\x00" in v for v in values)})
        if bad:
            raise ValidationError({key.replace("\x00", "\\x00"): ["Null characters are not allowed."] for key in bad})

    def get_queryset(self) -> QuerySet:
        return self.owner_scope(super().get_queryset(), getattr(self, "owner_field", "owner"))

    def owner_scope(self, queryset: QuerySet, owner_field: str = "owner") -> QuerySet:
        """``queryset`` narrowed to what the requesting user may see (:meth:`visible_rows`). While
        drf-spectacular generates the schema its views are fakes, with no user and no path
        arguments: then nothing, without asking. Every view's queryset, and the code that scopes
        other querysets by the caller, go through here, so that guard is written once."""
        if getattr(self, "swagger_fake_view", False):
            return queryset.none()
        return self.visible_rows(queryset, owner_field)

    def visible_rows(self, queryset: QuerySet, owner_field: str) -> QuerySet:
        """What the requesting user may see of ``queryset``: all of it, unless a view narrows it."""
        return queryset


class IsSupportStaff(BasePermission):
    """Staff, as DRF's ``IsAdminUser``, but not through a token scoped to one team: such a key
    sees its team, not the platform's (workers, every owner's objects)."""

    message = "Staff only, and not with a token scoped to one team."

    def has_permission(self, request: Any, view: Any) -> bool:
        return bool(request.user and sees_everything(request.user))


class OwnerScopedMixin(ApiViewMixin):
    """Restricts a view's queryset to the requesting user's rows; staff see everything.

    Every view over user data inherits this, so another owner's ids answer 404. ``owner_field``
    names the lookup from the model to its owning user.

    Staff are read-only support: a write (any method but GET, HEAD and OPTIONS) on another
    owner's object answers 403 unless the user has the model's permission, as in the admin and
    the back office (``change_<model>``, ``delete_<model>`` for DELETE; superusers have them all:
    :func:`tms_core.roles.may_act_for`).
    """

    owner_field: str = "owner"

    def check_object_permissions(self, request: Request, obj: Any) -> None:
        super().check_object_permissions(request, obj)
        if request.method in SAFE_METHODS:
            return
        *path, last = self.owner_field.split("__")
        holder = obj
        for name in path:
            holder = getattr(holder, name)
        owner_id = getattr(holder, f"{last}_id")
        meta = obj._meta
        verb = "delete" if request.method == "DELETE" else "change"
        if not may_act_for(request.user, owner_id, f"{meta.app_label}.{verb}_{meta.model_name}"):
            raise PermissionDenied("You may read another owner's objects but not change them.")

    # DRF's APIView.options takes DRF's Request where Django's View takes an HttpRequest; the DRF
    # stubs ignore the same override on APIView itself.
    def options(self, request: Request, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        # Metadata about someone else's object would confirm that it exists: 404 first, as for
        # every other method (nested routes check their parent in get_queryset).
        lookup = getattr(self, "lookup_url_kwarg", None) or getattr(self, "lookup_field", "pk")
        if lookup in kwargs:
            self.get_object()
        elif kwargs:
            self.get_queryset()
        return super().options(request, *args, **kwargs)

    def visible_rows(self, queryset: QuerySet, owner_field: str) -> QuerySet:
        """The requesting user's rows (all of them for staff)."""
        user = self.request.user
        if sees_everything(user):  # staff, unless a team-scoped token narrows them
            return queryset
        return queryset.filter(**{owner_field: user})


def _clone(field: serializers.Field) -> serializers.Field:
    """An unbound copy of ``field`` for one serializer instance.

    A plain field keeps nothing of its serializer until it is bound (``bind`` sets its name,
    parent and source on the copy) and changes nothing of itself afterwards: a copy of its
    attributes does, many times cheaper than building it again as DRF does. A list's or a
    dictionary's ``child`` is copied too, with the copy as its parent (it reads the context
    through it); a nested serializer or a many-relation is built again, as DRF builds them."""
    if isinstance(field, serializers.BaseSerializer) or hasattr(field, "child_relation"):
        return copy.deepcopy(field)
    clone = object.__new__(type(field))
    clone.__dict__.update(field.__dict__)
    child = field.__dict__.get("child")
    if isinstance(child, serializers.BaseSerializer):
        clone.child = copy.deepcopy(child)  # type: ignore[attr-defined]
        clone.child.bind(field_name="", parent=clone)  # type: ignore[attr-defined]
    elif child is not None:
        # Bound to the original as it would be to the copy (no name, no source): only its parent differs.
        clone.child = _clone(child)  # type: ignore[attr-defined]
        clone.child.parent = clone  # type: ignore[attr-defined]
    return clone


class BuiltOnceFieldsMixin(_SerializerBase):
    """Builds a serializer class's fields once and gives each instance copies of them.

    DRF builds every field of every serializer instance anew (``ModelSerializer`` also reads the
    model for each): for the task create's input and answer, about 90 fields and a fifth of the
    request's time (docs/benchmarks.md, issue 33). For serializers whose fields depend only on
    their class, not on the instance or its context (``get_fields`` not overridden to vary)."""

    def get_fields(self) -> dict[str, serializers.Field]:
        cls = type(self)
        built: dict[str, serializers.Field] | None = cls.__dict__.get("_fields_built_once")
        if built is None:
            # Two threads may both build them the first time: either result will do.
            built = super().get_fields()
            cls._fields_built_once = built  # type: ignore[attr-defined]
        return {name: _clone(field) for name, field in built.items()}


class StrictInputMixin(_SerializerBase):
    """Rejects fields the serializer does not know, instead of silently ignoring them, and numbers
    sent for text fields.

    ``read_only_names`` lists fields that exist but cannot be written here.
    """

    read_only_names: frozenset[str] = frozenset()

    def to_internal_value(self, data: Any) -> Any:
        unknown: dict[str, list[str]] = {}
        if isinstance(data, dict):
            fields = self.fields
            unknown = {
                key: ["This field cannot be changed."] if key in self.read_only_names else ["Unknown field."]
                for key in data
                if key not in fields
            }
            # DRF's CharField takes a number as its text; the schema says string, so refuse it.
            unknown |= {
                key: ["Not a valid string."]
                for key, value in data.items()
                if isinstance(fields.get(key), serializers.CharField) and isinstance(value, int | float)
            }
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **unknown}) from None
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value


#: Date-times the API accepts: wide enough for any schedule, narrow enough that schedule
#: arithmetic (adding intervals, cron look-ahead, time-zone shifts) never leaves Python's range.
MIN_DATETIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_DATETIME = datetime(9000, 1, 1, tzinfo=UTC)


class BlankIsNone(_FieldBase):
    """A field mixin that reads an empty string as absent (``None``): the original ``/tasks`` API
    accepted ``""`` for an absent optional field. The OpenAPI schema adds ``""`` to such fields."""

    def to_internal_value(self, data: Any) -> Any:
        if data == "":
            return None
        return super().to_internal_value(data)


class BoundedDateTimeField(serializers.DateTimeField):
    """An RFC 3339 date-time written with a year from 1970 to 8999.

    The bound applies to the date as written, whatever its UTC offset, so that the OpenAPI schema
    can state it exactly (a pattern on the year): ``1970-01-01T00:30:00+01:00`` is accepted although
    it is 1969 in UTC. A day either side of the bounds is still far inside Python's range.
    """

    default_error_messages = {"range": "Must be between 1970-01-01 and 9000-01-01."}

    def to_internal_value(self, value: Any) -> datetime:
        parsed = super().to_internal_value(value)
        written = parsed
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                written = parse_datetime(value.strip()) or parsed
        elif isinstance(value, datetime):
            written = value
        wall_clock = written.replace(tzinfo=None)
        if not MIN_DATETIME.replace(tzinfo=None) <= wall_clock < MAX_DATETIME.replace(tzinfo=None):
            self.fail("range")
        return parsed


#: A trailing UTC offset after a space: the ``+`` of ``+02:00`` sent unescaped in a query string.
_SPACED_OFFSET = re.compile(r"^(.*T\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?) (\d{2}(?::?\d{2})?)$")


class OffsetDateTimeField(BoundedDateTimeField):
    """A :class:`BoundedDateTimeField` that must carry its UTC offset (``Z`` or ``+02:00``): a
    wall-clock time without one is ambiguous. A space before a trailing offset reads as ``+``
    (an unescaped ``+`` in a query string arrives as a space)."""

    default_error_messages = {
        "offset": "Give the UTC offset, e.g. 2026-03-29T01:00:00Z or 2026-03-29T03:00:00+02:00.",
    }

    def to_internal_value(self, value: Any) -> datetime:
        if isinstance(value, str):
            value = _SPACED_OFFSET.sub(r"\1+\2", value.strip())
            parsed = None
            with contextlib.suppress(ValueError):  # a bad date: the parent says so
                parsed = parse_datetime(value)
            if parsed is not None and parsed.tzinfo is None:
                self.fail("offset")
        return super().to_internal_value(value)


#: A wall-clock time as the API reads and writes it: ``HH:MM`` or ``HH:MM:SS``, 24-hour.
CLOCK_TIME_PATTERN = r"^(?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9])?$"
_CLOCK_TIME = re.compile(CLOCK_TIME_PATTERN)


class ClockTimeField(serializers.TimeField):
    """A wall-clock time of day, ``"22:00"`` or ``"22:00:30"``, read in a zone given elsewhere.

    DRF's TimeField takes anything ``time.fromisoformat`` does (``"2200"``, ``"22"``, and an
    offset it then drops), and the schema could only call it ``format: time``, which OpenAPI
    validators read as RFC 3339's full-time (``22:00:00Z``): a client checking its requests
    refused ``"22:00"``. This field takes exactly what its pattern says, and answers the same
    form (seconds only when they are not zero).
    """

    default_error_messages = {"clock": 'A time of day as "HH:MM" or "HH:MM:SS" (24-hour), e.g. "22:00".'}

    def to_internal_value(self, value: Any) -> Any:
        if not isinstance(value, str) or not _CLOCK_TIME.match(value):
            self.fail("clock")
        return super().to_internal_value(value)

    def to_representation(self, value: Any) -> str:
        # DRF answers null for a null value without calling this.
        return value.strftime("%H:%M:%S" if value.second else "%H:%M")


class StrictFilterSet(filters.FilterSet):
    """A FilterSet that refuses an empty filter value (``?task=``) instead of ignoring the filter.

    django-filter reads an empty value as "no filter", so a client that lost the value would get
    everything back; the schema says each filter value is non-empty, and this holds the API to it.
    """

    def get_form_class(self) -> Any:
        form_class: Any = super().get_form_class()
        names = list(self.filters)

        class Form(form_class):
            def clean(self) -> Any:
                cleaned = super().clean()
                for name in names:
                    values = self.data.getlist(name) if hasattr(self.data, "getlist") else [self.data.get(name)]
                    if "" in values:
                        self.add_error(name, "This field may not be blank.")
                return cleaned

        return Form


_WHOLE_NUMBER = re.compile(r"-?[0-9]+")


class Pagination(LimitOffsetPagination):
    """``?limit=`` (at least 1; more than 500 reads as 500) and ``?offset=`` (at least 0; past the
    end is an empty page). Anything else in them is a 400, not silently the first page."""

    max_limit = 500
    #: Beyond this an offset cannot address a row anyway; capped so the database never overflows.
    max_offset = 10**12

    def _whole_number(self, request: Request, name: str, minimum: int) -> int | None:
        values = request.query_params.getlist(name)
        if not values:
            return None
        for value in values:
            if not _WHOLE_NUMBER.fullmatch(value):
                raise ValidationError({name: ["A whole number is required."]})
            if int(value) < minimum:
                raise ValidationError({name: [f"Must be at least {minimum}."]})
        return int(values[-1])

    def get_limit(self, request: Request) -> int | None:
        limit = self._whole_number(request, self.limit_query_param, minimum=1)
        return self.default_limit if limit is None else min(limit, self.max_limit)

    def get_offset(self, request: Request) -> int:
        offset = self._whole_number(request, self.offset_query_param, minimum=0)
        return 0 if offset is None else min(offset, self.max_offset)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.limit_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1}
                parameter["description"] = (
                    f"Results per page (default {self.default_limit}); more than {self.max_limit} reads as "
                    f"{self.max_limit}."
                )
            elif parameter["name"] == self.offset_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 0}
                parameter["description"] = "How many results to skip; past the end is an empty page."
        return parameters
