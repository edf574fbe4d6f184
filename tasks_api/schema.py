"""The OpenAPI schema of the task API's own fields: runner aliases as an enum of the configured
runners, runner configs as each runner's config serializer, and a new or changed task as one
variant per runner selected by ``runner``. drf-spectacular finds these extensions by their
``target_class`` once this module is imported: the settings name its :class:`AutoSchema` as
``DEFAULT_SCHEMA_CLASS``. The generic parts of the schema are :mod:`tms_core.api.schema`.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import ResolvedComponent

from runners.registry import all_runners, runner_aliases
from tms_core.api import schema


class RunnerAliasFieldExtension(OpenApiSerializerFieldExtension):
    """Runner aliases as an enum of the runners configured when the schema is generated."""

    target_class = "tasks_api.serializers.RunnerAliasField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return {"type": "string", "enum": runner_aliases()}


class LocalDateTimeFieldExtension(OpenApiSerializerFieldExtension):
    """:class:`tasks_api.serializers.LocalDateTimeField`: an instant with its offset, or a wall-clock
    time without one (read in the task's ``timezone``). OpenAPI's ``date-time`` requires the
    offset, so the wall-clock form is an alternative of its own: a client that validates its
    requests can send what the field's description promises."""

    target_class = "tasks_api.serializers.LocalDateTimeField"
    match_subclasses = True
    priority = 1  # before tms_core.api.schema.BoundedDateTimeFieldExtension, which matches this subclass too

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        if direction != "request":
            return {"type": "string", "format": "date-time"}
        alternatives = {
            "oneOf": [
                {"type": "string", "format": "date-time", "pattern": schema.BOUNDED_DATETIME_PATTERN},
                {
                    "type": "string",
                    "pattern": schema.WALL_DATETIME_PATTERN,
                    "description": "A wall-clock time in the task's `timezone` (no UTC offset).",
                    "example": "2030-01-15T09:00:00",
                },
            ],
        }
        return schema.blank_allowed(self.target, alternatives)


class RunnerConfigFieldExtension(OpenApiSerializerFieldExtension):
    """A runner config outside a per-runner variant: any of the runners' config schemas."""

    target_class = "tasks_api.serializers.RunnerConfigField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schemas = {id(schema): schema for schema in _runner_config_schemas(auto_schema, direction).values()}
        return {
            "anyOf": list(schemas.values()),
            "description": "The config of the task's runner, validated by it (unknown fields are an error).",
        }


def _runner_config_schemas(auto_schema: Any, direction: Any) -> dict[str, dict[str, Any]]:
    """Each runner's config schema by alias: its backend's config serializer as a component (the
    one the runner validates with), or an empty object for a runner that takes no config."""
    schemas = {}
    for alias, runner in sorted(all_runners().items()):
        if runner.config_serializer_class is None:
            schemas[alias] = {"type": "object", "properties": {}, "additionalProperties": False}
        else:
            schemas[alias] = auto_schema.resolve_serializer(runner.config_serializer_class, direction).ref
    return schemas


class AutoSchema(schema.AutoSchema):
    """The project's schema class (``DEFAULT_SCHEMA_CLASS``): the generic one, plus the runners'
    config serializers among those that refuse unknown fields (``BaseRunner.validate_config``)."""

    def refuses_unknown_fields(self, serializer: Any) -> bool:
        return super().refuses_unknown_fields(serializer) or type(serializer) in _runner_config_classes()


def _runner_config_classes() -> set[type]:
    return {runner.config_serializer_class for runner in all_runners().values() if runner.config_serializer_class}


def _runner_requires_config(alias: str) -> bool:
    serializer_class = all_runners()[alias].config_serializer_class
    return serializer_class is not None and any(field.required for field in serializer_class().fields.values())


def _camel(alias: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^0-9A-Za-z]+", alias) if part)


def _task_variants(extension: Any, auto_schema: Any, direction: Any, *, runner_required: bool) -> dict[str, Any]:
    """One component per runner: the task fields with ``runner`` fixed to its alias and ``config``
    its config schema. Returns ``{alias: component}``."""
    name = auto_schema._get_serializer_name(extension.target, direction, bypass_extensions=True)
    stem, suffix = (name[: -len("Request")], "Request") if name.endswith("Request") else (name, "")
    base = auto_schema._map_serializer(extension.target, direction, bypass_extensions=True)
    configs = _runner_config_schemas(auto_schema, direction)
    variants = {}
    for alias, config in configs.items():
        schema = copy.deepcopy(base)
        # A component of its own, as drf-spectacular makes for enums: the discriminator's value.
        enum = ResolvedComponent(
            name=f"{_camel(alias)}RunnerEnum",
            type=ResolvedComponent.SCHEMA,
            schema={"type": "string", "enum": [alias]},
            object=("runner", alias),
        )
        auto_schema.registry.register_on_missing(enum)
        schema["properties"]["runner"] = enum.ref
        schema["properties"]["config"] = config
        required = set(schema.get("required", [])) | {"runner"}
        if runner_required and _runner_requires_config(alias):
            required.add("config")
        schema["required"] = sorted(required)
        schema["description"] = f"A task on the `{alias}` runner."
        component = ResolvedComponent(
            name=f"{stem}{_camel(alias)}{suffix}", type=ResolvedComponent.SCHEMA, schema=schema, object=(name, alias)
        )
        auto_schema.registry.register_on_missing(component)
        variants[alias] = component
    return variants


class TaskCreateSerializerExtension(OpenApiSerializerExtension):
    """A new task: one schema per runner, selected by ``runner`` (oneOf with a discriminator), so
    that each runner's config, and which of its fields are required, is visible to clients."""

    target_class = "tasks_api.serializers.TaskCreateSerializer"

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        if direction != "request":
            return auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        variants = _task_variants(self, auto_schema, direction, runner_required=True)
        return {
            "oneOf": [component.ref for component in variants.values()],
            "discriminator": {
                "propertyName": "runner",
                "mapping": {alias: component.ref["$ref"] for alias, component in variants.items()},
            },
        }


class TaskUpdateSerializerExtension(OpenApiSerializerExtension):
    """A partial update: with ``runner``, one schema per runner as for a new task; without it, the
    task keeps its runner and ``config`` must suit that runner (which the schema cannot know)."""

    target_class = "tasks_api.serializers.TaskUpdateSerializer"

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        if direction != "request":
            return auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        variants = _task_variants(self, auto_schema, direction, runner_required=False)
        name = auto_schema._get_serializer_name(self.target, direction, bypass_extensions=True)
        keep = copy.deepcopy(auto_schema._map_serializer(self.target, direction, bypass_extensions=True))
        del keep["properties"]["runner"]
        keep["properties"]["config"]["description"] = (
            "The new config of the task's current runner: that runner's config schema."
        )
        keep["description"] = "A change that keeps the task's runner."
        component = ResolvedComponent(
            name=name.replace("Request", "KeepRunnerRequest") if name.endswith("Request") else f"{name}KeepRunner",
            type=ResolvedComponent.SCHEMA,
            schema=keep,
            object=(name, None),
        )
        auto_schema.registry.register_on_missing(component)
        return {"oneOf": [component.ref, *(variant.ref for variant in variants.values())]}
