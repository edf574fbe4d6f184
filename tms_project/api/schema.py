"""OpenAPI schema: the error shape, error responses on every operation, duration fields.

:class:`AutoSchema` adds the errors every operation can answer (401, 403, 429; 400 and 415 where
there is input to reject; 404 where the path names an object), each with the one error shape of
:mod:`tms_project.api.errors`, so a client (and schemathesis) knows every answer it can get.
Operations with their own errors (409, 422, ...) declare them with ``extend_schema``.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    """The one error shape of the API."""

    type = serializers.CharField(
        help_text="What went wrong, for programs: validation_error, not_found, conflict, throttled, ..."
    )
    detail = serializers.CharField(help_text="What went wrong, for people.")
    errors = serializers.DictField(
        child=serializers.JSONField(),
        required=False,
        help_text="Validation errors only: each bad field's list of messages (nested for nested input).",
    )


#: Description of each error status, as documented on every operation that can answer it.
ERROR_DESCRIPTIONS = {
    400: "Invalid input; nothing was changed. `errors` maps each bad field to its messages.",
    401: "Missing or invalid credentials (`Authorization: Token <key>`).",
    403: "Not allowed: staff only, or a session request without its CSRF token.",
    404: "No such object, or it is not yours.",
    409: "The request conflicts with the object's current state; nothing was changed.",
    415: "Unsupported media type: send `application/json`.",
    422: "The `Idempotency-Key` was already used with a different request.",
    429: "Too many requests: throttled per user. `Retry-After` says when to try again.",
}


def error_response(code: int, description: str | None = None) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description or ERROR_DESCRIPTIONS[code])


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    """``responses=`` entries for errors an operation answers besides the ones added to all."""
    return {code: error_response(code) for code in codes}


class AutoSchema(SpectacularAutoSchema):
    """drf-spectacular's AutoSchema plus the error responses each operation can give."""

    def _error_codes(self) -> set[int]:
        codes = {401, 403, 429}
        if self.method in ("POST", "PUT", "PATCH") and self.get_request_serializer() is not None:
            codes |= {400, 415}
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


class DurationFieldExtension(OpenApiSerializerFieldExtension):
    """:class:`tms_core.durations.DurationField`: seconds or a duration string in, seconds out."""

    target_class = "tms_core.durations.DurationField"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        from tms_core.durations import MAX_DURATION

        if direction == "request":
            minimum = self.target.min_value.total_seconds() if self.target.min_value else 0
            maximum = (self.target.max_value or MAX_DURATION).total_seconds()
            return {
                "oneOf": [
                    {
                        "type": "number",
                        "minimum": minimum,
                        "maximum": maximum,
                        "description": "Seconds.",
                    },
                    {
                        "type": "string",
                        "pattern": r"^(\d+(\.\d+)?|(\d+(\.\d+)?(us|ms|s|m|h|d))+)$",
                        "description": 'A duration such as "250ms", "90s", "5m", "1h30m".',
                        "example": "90s",
                    },
                ]
            }
        return {"type": "number", "format": "double", "description": "Seconds."}


class RunnerAliasFieldExtension(OpenApiSerializerFieldExtension):
    """Runner aliases as an enum of the runners configured when the schema is generated."""

    target_class = "tasks_app.serializers.RunnerAliasField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        from runners.registry import runner_aliases

        return {"type": "string", "enum": runner_aliases()}


class RunnerConfigFieldExtension(OpenApiSerializerFieldExtension):
    """A runner config: an object, whose fields each runner documents (listed in the description)."""

    target_class = "tasks_app.serializers.RunnerConfigField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": {}, "description": runner_config_help()}


def runner_config_help() -> str:
    """One line per configured runner: the config fields it takes."""
    from runners.registry import all_runners

    lines = ["The runner's config, validated by the runner (unknown fields are an error):"]
    for alias, runner in sorted(all_runners().items()):
        if runner.config_serializer_class is None:
            lines.append(f"- `{alias}`: none (`{{}}`).")
            continue
        fields = []
        for name, field in runner.config_serializer_class().fields.items():
            text = f"`{name}`" + (" (required)" if field.required else "")
            if field.help_text:
                text += f": {str(field.help_text).strip().rstrip('.')}"
            fields.append(text)
        lines.append(f"- `{alias}`: " + "; ".join(fields) + ".")
    return "\n".join(lines)


def strip_trailing_slashes(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Document paths without the optional trailing slash (``/api/v1/tasks``, as the README writes
    them); both forms resolve."""
    result["paths"] = {(path.rstrip("/") or "/"): item for path, item in result["paths"].items()}
    return result
