"""OpenAPI schema: the error shape, error responses on every operation, duration fields.

:class:`AutoSchema` adds the errors every operation can answer (401, 403, 406, 429, 503; 400, 413 and 415 where
there is input to reject; 404 where the path names an object), each with the one error shape of
:mod:`tms_core.api.errors`, so a client (and schemathesis) knows every answer it can get.
Operations with their own errors (409, 422, ...) declare them with ``extend_schema``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeVar, cast

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.plumbing import force_instance, is_patched_serializer
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.settings import api_settings as drf_settings

from tms_core.api.base import CLOCK_TIME_PATTERN, BlankIsNone, StrictInputMixin


def _refuse_nul(schema: dict[str, Any]) -> None:
    """Add :data:`NO_NUL_PATTERN` to a plain string schema (formats, enums and patterns exclude NUL already)."""
    if schema.get("type") == "string" and not ({"format", "enum", "pattern"} & set(schema)):
        schema["pattern"] = NO_NUL_PATTERN


class ErrorSerializer(serializers.Serializer):
    """The one error shape of the API."""

    type = serializers.CharField(
        help_text="What went wrong, for programs: validation_error, not_found, conflict, throttled, ..."
    )
    detail = serializers.CharField(help_text="What went wrong, for people.")
    # The error body's key is "errors": DRF's serializer metaclass moves declared fields out of the
    # class body, so Serializer.errors is not shadowed at run time, only in the stubs' view.
    errors = serializers.DictField(  # type: ignore[assignment]
        child=serializers.JSONField(),
        required=False,
        help_text="Validation errors only: each bad field's list of messages (nested for nested input).",
    )


#: Description of each error status, as documented on every operation that can answer it.
ERROR_DESCRIPTIONS = {
    400: "Invalid input; nothing was changed. `errors` maps each bad field to its messages.",
    401: "Missing or invalid credentials (`Authorization: Token <key>` or `Authorization: Bearer <key>`).",
    403: "Not allowed: staff only, or a session request without its CSRF token.",
    404: "No such object, or it is not yours.",
    406: "The `Accept` header admits none of the types the API answers (`application/json`).",
    409: "The request conflicts with the object's current state; nothing was changed.",
    413: "The request body is larger than `TMS_MAX_REQUEST_BYTES`.",
    415: "Unsupported media type: send `application/json`.",
    422: "The `Idempotency-Key` was already used with a different request.",
    429: "Too many requests: throttled per user, or an hourly quota used up (`quota_exceeded`). "
    "`Retry-After` says when to try again.",
    503: "The database or the broker is briefly unavailable (`service_unavailable`); nothing was half-done. "
    "Send the request again after `Retry-After` seconds (`TMS_RETRY_AFTER`).",
}

#: The ``Retry-After`` header of the answers that carry one (429: when the throttle or the quota
#: can say; 503: always).
RETRY_AFTER_HEADERS: dict[str, dict[str, Any]] = {
    "429": {
        "schema": {"type": "integer", "minimum": 0},
        "description": "Seconds to wait before trying again.",
    },
    "503": {
        "schema": {"type": "integer", "minimum": 0},
        "description": "Seconds to wait before sending the request again.",
        "required": True,
    },
}


class KeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """:class:`tms_core.api.auth.TokenAuthentication` as two security schemes, either of which
    an operation accepts: ``tokenAuth`` (``Authorization: Token <key>``, DRF's spelling) and
    ``bearerAuth`` (HTTP bearer, what generated clients send). The keys are the same."""

    target_class = "tms_core.api.auth.TokenAuthentication"
    #: The class in the settings is a subclass that also reads personal access tokens
    #: (accounts.authentication): the same header, the same two schemes.
    match_subclasses = True
    name = ["tokenAuth", "bearerAuth"]

    def get_security_requirement(self, auto_schema: Any) -> list[dict[str, list[Any]]]:
        # One requirement per scheme: alternatives (a list of dicts), not both at once (one dict).
        return [{name: []} for name in self.name]

    def get_security_definition(self, auto_schema: Any) -> list[dict[str, Any]]:
        return [
            {
                "type": "apiKey",
                "in": "header",
                "name": "Authorization",
                "description": "An API key as `Authorization: Token <key>`: a personal access token "
                "(`tms_pat_...`, from `POST /api/v1/tokens`) or an account key (`manage.py tms_create_user "
                "<name>` prints one). The same key is accepted as `Authorization: Bearer <key>` (bearerAuth).",
            },
            {
                "type": "http",
                "scheme": "bearer",
                "description": "The same API key as tokenAuth (a personal access token or an account key), "
                "sent as `Authorization: Bearer <key>` (what generated clients send by default).",
            },
        ]


def error_response(code: int, description: str | None = None) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description or ERROR_DESCRIPTIONS[code])


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    """``responses=`` entries for errors an operation answers besides the ones added to all."""
    return {code: error_response(code) for code in codes}


_View = TypeVar("_View", bound=Callable[..., Any])


def detail_post(
    id_parameter: OpenApiParameter, *, url_path: str | None = None, url_name: str | None = None, **schema: Any
) -> Callable[[_View], _View]:
    """A viewset's POST action on one object (``<id>/<name>``, or ``url_path``) and its schema: what
    every such action declares alike, the object's id as a path parameter and DRF's
    ``action(detail=True, methods=["post"])``, said once; ``schema`` is the rest of its ``extend_schema``."""
    routing = {key: value for key, value in (("url_path", url_path), ("url_name", url_name)) if value is not None}

    def decorate(view: _View) -> _View:
        routed = action(detail=True, methods=["post"], **routing)(view)
        return cast(_View, extend_schema(parameters=[id_parameter], **schema)(routed))

    return decorate


class AutoSchema(SpectacularAutoSchema):
    """drf-spectacular's AutoSchema plus what the API checks that it would not say on its own: the
    error responses each operation can give, no unknown fields where they are refused, no NUL
    characters in text, no empty filter values."""

    def _map_basic_serializer(self, serializer: Any, direction: Any) -> dict[str, Any]:
        outer, self._direction = getattr(self, "_direction", None), direction
        try:
            schema = super()._map_basic_serializer(serializer, direction)
        finally:
            self._direction = outer
        if direction == "request" and self.refuses_unknown_fields(serializer):
            schema["additionalProperties"] = False
        if schema.get("description") == inspect.cleandoc(StrictInputMixin.__doc__ or ""):
            del schema["description"]  # the mixin's docstring, not the serializer's
        if is_patched_serializer(force_instance(serializer), direction):
            _drop_defaults(schema)
        return schema

    def refuses_unknown_fields(self, serializer: Any) -> bool:
        """Whether the API answers 400 to a field ``serializer`` does not declare (its request
        schema then says ``additionalProperties: false``). Subclasses add serializers that check
        this themselves."""
        return isinstance(serializer, StrictInputMixin)

    def _map_serializer_field(self, field: Any, direction: Any, bypass_extensions: bool = False) -> dict[str, Any]:
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if direction == "request" and isinstance(field, serializers.FileField) and not field.allow_empty_file:
            schema["minLength"] = 1
        return schema

    def _insert_field_validators(self, field: Any, schema: dict[str, Any]) -> None:
        super()._insert_field_validators(field, schema)
        # After the field's own validators: a pattern there would make drf-spectacular spell a
        # blank-allowing field as a oneOf, and this one matches the empty string anyway.
        if isinstance(field, serializers.CharField) and getattr(self, "_direction", None) == "request":
            _refuse_nul(schema)

    def _get_filter_parameters(self) -> list[dict[str, Any]]:
        parameters = super()._get_filter_parameters()
        # Empty search and ordering read as none; StrictFilterSet refuses empty filter values.
        lenient = {drf_settings.SEARCH_PARAM, drf_settings.ORDERING_PARAM}
        for parameter in parameters:
            schema = parameter.get("schema", {})
            if parameter.get("name") not in lenient and schema.get("type") == "string" and not schema.get("enum"):
                schema.setdefault("minLength", 1)
        return parameters

    def _get_parameters(self) -> list[dict[str, Any]]:
        parameters = super()._get_parameters()
        for parameter in parameters:
            if parameter.get("in") == "query":
                _refuse_nul(parameter.get("schema", {}))  # ApiViewMixin refuses them in any parameter
        return parameters

    def _get_response_headers_for_code(self, status_code: Any, direction: Any = "response") -> dict[str, Any]:
        headers = super()._get_response_headers_for_code(status_code, direction)
        if str(status_code) in RETRY_AFTER_HEADERS:
            headers = {**headers, "Retry-After": dict(RETRY_AFTER_HEADERS[str(status_code)])}
        return headers

    def _error_codes(self) -> set[int]:
        # 406: DRF's content negotiation, before any view code. 503: ops.middleware.OutageMiddleware
        # answers any view's database or broker outage.
        codes = {401, 403, 406, 429, 503}
        if self.method in ("POST", "PUT", "PATCH") and self.get_request_serializer() is not None:
            codes |= {400, 413, 415}
        if self.method == "GET" and self._is_list_view():
            codes.add(400)  # a bad filter, ordering or page parameter
        if "{" in self.path:
            codes.add(404)
        return codes

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        for code in sorted(self._error_codes()):
            if str(code) not in responses:
                responses[str(code)] = self._get_response_for_code(error_response(code), str(code), direction=direction)
        return responses


def _drop_defaults(schema: dict[str, Any]) -> None:
    """Remove ``default`` from a partial update's fields (every ``Patched*`` request schema).

    drf-spectacular states each serializer field's default wherever the serializer is used, but a
    partial update applies none (DRF skips defaults when ``partial``): a field left out keeps the
    stored value. A generated client reads ``default`` as the value to send when the caller gives
    none, so with it a PATCH of one field sent every other field at its creation default and reset
    the object (issue 26). Nested objects are left alone: one sent in a PATCH replaces the stored
    one whole (a task's ``config``, a limit's ``windows``), and its own defaults apply.
    """
    for field in schema.get("properties", {}).values():
        field.pop("default", None)


#: A string without NUL characters: PostgreSQL cannot store them, so every text input refuses them.
NO_NUL_PATTERN = r"^[^\u0000]*$"


#: RFC 3339 date-times as the API reads them (``T`` and ``Z`` in capitals, at most 9 fraction
#: digits, no leap second), with the year bounds of :class:`tms_core.api.base.BoundedDateTimeField`.
BOUNDED_DATETIME_PATTERN = (
    "^(?:19[7-9][0-9]|[2-8][0-9]{3})"  # MIN_DATETIME.year to MAX_DATETIME.year - 1 (a test checks)
    + r"-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?"
    + r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"
)


#: :data:`BOUNDED_DATETIME_PATTERN` without its UTC offset: a wall-clock time.
WALL_DATETIME_PATTERN = BOUNDED_DATETIME_PATTERN.removesuffix(r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$") + "$"


class BoundedDateTimeFieldExtension(OpenApiSerializerFieldExtension):
    """:class:`tms_core.api.base.BoundedDateTimeField`: its year bounds as a pattern."""

    target_class = "tms_core.api.base.BoundedDateTimeField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema = {"type": "string", "format": "date-time"}
        if direction == "request":
            schema["pattern"] = BOUNDED_DATETIME_PATTERN
            schema["description"] = "RFC 3339, with a year from 1970 to 8999 as written."
        return blank_allowed(self.target, schema) if direction == "request" else schema


class ClockTimeFieldExtension(OpenApiSerializerFieldExtension):
    """:class:`tms_core.api.base.ClockTimeField`: ``"22:00"``, a pattern rather than ``format:
    time`` (RFC 3339's full-time, with seconds and an offset, which the field does not take)."""

    target_class = "tms_core.api.base.ClockTimeField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return {
            "type": "string",
            "pattern": CLOCK_TIME_PATTERN,
            "description": 'A time of day, "HH:MM" or "HH:MM:SS" (24-hour).',
            "example": "22:00",
        }


def blank_allowed(field: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """The schema plus an empty string, for fields that read ``""`` as absent (the compat API)."""
    if isinstance(field, BlankIsNone):
        return {"oneOf": [schema, {"type": "string", "enum": [""], "description": "Absent."}]}
    return schema


# --- durations ----------------------------------------------------------------------------------

#: Seconds per unit of a duration string, as :mod:`tms_core.durations` reads them.
_DURATION_UNITS = {
    "d": Decimal(86400),
    "h": Decimal(3600),
    "m": Decimal(60),
    "s": Decimal(1),
    "ms": Decimal("0.001"),
    "us": Decimal("0.000001"),
}
#: Most parts (``1h30m`` has two) a duration string of the schema has.
_DURATION_MAX_PARTS = 6


def _number_pattern(below: Decimal, at_least: Decimal) -> str | None:
    """A decimal number (digits, optional fraction) that is surely ``>= at_least`` and ``< below``.

    Exact bounds on a decimal are not regular in general; this rounds them inwards to powers of
    ten (``at_least`` up, ``below`` down), so every number it matches is in range.
    """
    if below < 10:
        return None
    digits = below.adjusted()  # at most this many integer digits: < 10**digits <= below
    fraction = r"(?:\.[0-9]+)?"
    if at_least <= 0:
        return rf"[0-9]{{1,{digits}}}{fraction}"
    exponent = at_least.adjusted() + (0 if at_least == Decimal(10) ** at_least.adjusted() else 1)
    if exponent >= 0:
        if exponent + 1 > digits:
            return None
        return rf"[1-9][0-9]{{{exponent},{digits - 1}}}{fraction}"
    # A number below 1: a non-zero digit among the first -exponent decimals.
    return rf"(?:[1-9][0-9]{{0,{digits - 1}}}{fraction}|0\.[0-9]{{0,{-exponent - 1}}}[1-9][0-9]*)"


def _parts_pattern(minimum: Decimal, below: Decimal) -> str | None:
    """One ``<number><unit>`` part surely in ``[minimum, below)`` seconds."""
    options = []
    for unit, seconds in _DURATION_UNITS.items():
        number = _number_pattern(below / seconds, minimum / seconds)
        if number is not None:
            options.append(f"{number}{unit}")
    return "(?:" + "|".join(options) + ")" if options else None


def duration_pattern(minimum: timedelta | None, maximum: timedelta | None) -> str:
    """A pattern for duration strings that are surely within ``[minimum, maximum]``.

    :func:`tms_core.durations.parse_duration` adds up any number of parts, which no regular
    expression can bound; this pattern matches a bare number of seconds, one part, or up to
    :data:`_DURATION_MAX_PARTS` parts of which the first alone reaches ``minimum`` and each is
    small enough that together they stay within ``maximum``. Every string it matches is accepted;
    the description states the bounds for the other spellings.
    """
    from tms_core.durations import MAX_DURATION

    low = Decimal(str((minimum or timedelta(0)).total_seconds()))
    high = Decimal(str((maximum or MAX_DURATION).total_seconds()))
    forms = [_number_pattern(high, low), _parts_pattern(low, high)]
    share = high / _DURATION_MAX_PARTS
    first, other = _parts_pattern(low, share), _parts_pattern(Decimal(0), share)
    if first and other:
        forms.append(f"{first}{other}{{1,{_DURATION_MAX_PARTS - 1}}}")
    return "^(?:" + "|".join(form for form in forms if form) + ")$"


class DurationFieldExtension(OpenApiSerializerFieldExtension):
    """:class:`tms_core.durations.DurationField`: seconds or a duration string in, seconds out."""

    target_class = "tms_core.durations.DurationField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        from tms_core.durations import MAX_DURATION, format_duration

        if direction != "request":
            return {"type": "number", "format": "double", "description": "Seconds."}
        low, high = self.target.min_value or timedelta(0), self.target.max_value or MAX_DURATION
        bounds = f"from {format_duration(low)} to {format_duration(high)}"
        schema = {
            "oneOf": [
                {
                    "type": "number",
                    "minimum": low.total_seconds(),
                    "maximum": high.total_seconds(),
                    "description": "Seconds.",
                },
                {
                    "type": "string",
                    "pattern": duration_pattern(low, high),
                    "description": (
                        f'A duration such as "250ms", "90s", "5m", "1h30m" (units d, h, m, s, ms, us), {bounds} in all.'
                    ),
                    "example": "90s",
                },
            ]
        }
        return blank_allowed(self.target, schema)


#: The alternative that admits ``null``, in OpenAPI 3.0's terms: ``nullable`` adds null to the
#: ``type`` beside it, and the enum leaves nothing else.
NULL_ALTERNATIVE = {"type": "object", "nullable": True, "enum": [None]}


def _null_as_alternative(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _null_as_alternative(item)
        return
    if not isinstance(node, dict):
        return
    for value in node.values():
        _null_as_alternative(value)
    if node.get("nullable") is not True or "type" in node:
        return
    if "oneOf" in node or "anyOf" in node:
        key = "oneOf" if "oneOf" in node else "anyOf"
        node[key] = [*node[key], dict(NULL_ALTERNATIVE)]
    elif len(node.get("allOf", ())) == 1:
        node["oneOf"] = [node.pop("allOf")[0], dict(NULL_ALTERNATIVE)]
    else:  # pragma: no cover - nothing else in this schema is nullable without a type
        raise ValueError(f"a nullable schema without a type this hook cannot rewrite: {node}")
    del node["nullable"]


def null_as_alternative(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Make every nullable schema that has no ``type`` of its own admit ``null`` in OpenAPI 3.0.

    drf-spectacular writes a nullable nested object as ``allOf: [$ref], nullable: true`` and a
    nullable union as ``oneOf: [...], nullable: true``. In OpenAPI 3.0 ``nullable`` only widens a
    ``type`` in the same schema object, so strict validators (openapi-core) refused the ``null``
    the API really sends (``Why.skipped``, ``Occurrence.skip``: issue 26). Each becomes a
    ``oneOf`` (or ``anyOf``) whose last alternative admits exactly ``null``.
    """
    _null_as_alternative(result)
    return result


def strip_trailing_slashes(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Document paths without the optional trailing slash (``/api/v1/tasks``, as the README writes
    them); both forms resolve."""
    result["paths"] = {(path.rstrip("/") or "/"): item for path, item in result["paths"].items()}
    return result
