"""The form a run's input is typed in (run now, start a workflow, replay), built from the task's
``input_schema``.

A schema of the usual shape (an object whose properties are texts, numbers, whole numbers, true or
false, or a choice among a few values) gets a field per property, typed; any other schema (nested
objects, lists, combinations, references ...) and a task with none get a JSON box, the schema
shown beside it. Either way the input goes to the API's service, which checks it against the
schema (:func:`tasks_app.run_input.check_input`): its problems are put on the fields they are
about (:func:`tasks_app.run_input.input_problems`, the same validation), the rest above the form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django import forms

from tasks_app.run_input import check_input, input_problems
from tms_core.errors import InvalidInput
from tms_core.form_errors import add_service_errors

#: Keywords a property may use and still get a typed field (others: the JSON box).
FIELD_KEYWORDS = frozenset(
    {"type", "title", "description", "enum", "default", "format", "examples", "$comment"}
    | {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
    | {"minLength", "maxLength", "pattern"}
)
#: Keywords the schema itself may use and still get a field per property.
OBJECT_KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "title", "description", "$schema", "$id", "$comment"}
)
SCALAR_TYPES = frozenset({"string", "integer", "number", "boolean"})
#: The most properties shown as fields (more: the JSON box).
MAX_FIELDS = 30
#: Prefix of the property fields' names (``in-<property>``): no clash with the form's own fields.
PREFIX = "in"


def _scalar_property(spec: Any) -> bool:
    if not isinstance(spec, Mapping) or set(spec) - FIELD_KEYWORDS:
        return False
    if "enum" in spec:
        values = spec["enum"]
        return (
            isinstance(values, list)
            and 0 < len(values) <= 50
            and all(isinstance(v, str | int | float | bool) for v in values)
        )
    return spec.get("type") in SCALAR_TYPES


def simple_properties(schema: Any) -> dict[str, Mapping[str, Any]] | None:
    """The schema's properties when each gets a field of its own (see the module), else None."""
    if not isinstance(schema, Mapping) or set(schema) - OBJECT_KEYWORDS or schema.get("type") != "object":
        return None
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, Mapping) or not properties or len(properties) > MAX_FIELDS:
        return None
    if not isinstance(extra, bool) or not isinstance(schema.get("required", []), list):
        return None
    if not all(_scalar_property(spec) for spec in properties.values()):
        return None
    return {str(name): spec for name, spec in properties.items()}


def _field(name: str, spec: Mapping[str, Any], required: bool) -> forms.Field:
    label = str(spec.get("title") or name) + ("" if required else " (optional)")
    help_text = str(spec.get("description") or "")
    common: dict[str, Any] = {"required": False, "label": label, "help_text": help_text}
    kind = spec.get("type")
    if "enum" in spec:
        choices = [("", "\u2013")] + [(json.dumps(v), str(v)) for v in spec["enum"]]
        return forms.ChoiceField(choices=choices, **common)
    if kind == "boolean":
        return forms.ChoiceField(choices=[("", "\u2013"), ("true", "true"), ("false", "false")], **common)
    if kind == "integer":
        return forms.IntegerField(**common)
    if kind == "number":
        return forms.FloatField(**common)
    if spec.get("format") == "date":
        return forms.CharField(widget=forms.DateInput(attrs={"type": "date"}), **common)
    return forms.CharField(**common)


def _typed(spec: Mapping[str, Any], value: Any) -> Any:
    """A field's cleaned value as the JSON the schema reads (None: not given)."""
    if value in ("", None):
        return None
    if "enum" in spec:
        return json.loads(value)
    if spec.get("type") == "boolean":
        return value == "true"
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _text(spec: Mapping[str, Any], value: Any) -> Any:
    """A property's value as its field shows it (the reverse of :func:`_typed`)."""
    if "enum" in spec:
        return json.dumps(value)
    if spec.get("type") == "boolean" and isinstance(value, bool):
        return "true" if value else "false"
    return value


def _schema_refusal(exc: BaseException, run_input: Any) -> bool:
    """Whether ``exc`` is the schema's refusal of ``run_input`` (its shape and size passed)."""
    if not isinstance(exc, InvalidInput) or set(exc.errors) != {"input"}:
        return False
    try:
        check_input(run_input, None)
    except InvalidInput:
        return False
    return True


class RunInputForm(forms.Form):
    """A run's input: a field per property of a simple schema, or a JSON box (``input``).

    ``initial_input``: the input shown to start with (a replay's, masked). ``keep_choice``: the
    form offers to keep each replayed run's own input (``replace`` unticked: no input is sent)."""

    input = forms.CharField(
        required=False,
        label="Input (JSON)",
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "class": "mono"}),
    )

    def __init__(
        self,
        data: Any = None,
        *,
        schema: Any,
        initial_input: Any = None,
        keep_choice: bool = False,
    ) -> None:
        super().__init__(data)
        self.schema = schema
        self.properties = simple_properties(schema)
        self.keep_choice = keep_choice
        if keep_choice:
            self.fields["replace"] = forms.BooleanField(
                required=False, label="Replace the input (unticked: each run gets its own input again)"
            )
        if self.properties is not None:
            del self.fields["input"]
            required = set(schema.get("required") or [])
            for name, spec in self.properties.items():
                self.fields[f"{PREFIX}-{name}"] = _field(name, spec, name in required)
                if isinstance(initial_input, Mapping) and name in initial_input:
                    self.initial[f"{PREFIX}-{name}"] = _text(spec, initial_input[name])
        else:
            self.fields["input"].help_text = 'A JSON object, such as {"date": "2026-11-27"}.' + (
                " The task's input schema is shown beside it." if schema is not None else " Empty: no input."
            )
            if initial_input is not None:
                self.initial["input"] = json.dumps(initial_input, indent=2, sort_keys=True, ensure_ascii=False)

    def clean_input(self) -> Any:
        """The JSON box's text read as JSON (None: empty)."""
        text = (self.cleaned_data.get("input") or "").strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}.") from None

    @property
    def schema_text(self) -> str:
        return json.dumps(self.schema, indent=2, sort_keys=True, ensure_ascii=False) if self.schema is not None else ""

    def property_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.fields if name.startswith(f"{PREFIX}-")]

    def run_input(self) -> dict[str, Any] | None:
        """The input typed (valid form): an object, or None when nothing was given (or the
        replayed runs keep their own)."""
        data = self.cleaned_data
        if self.keep_choice and not data.get("replace"):
            return None
        if self.properties is None:
            value = data.get("input")
            if value is None:
                return {} if self.keep_choice else None
            return value  # not an object: the service says so, on the field
        given = {
            name: typed
            for name, spec in self.properties.items()
            if (typed := _typed(spec, data.get(f"{PREFIX}-{name}"))) is not None
        }
        return given or ({} if self.keep_choice else None)

    def add_input_errors(self, exc: BaseException, run_input: Any) -> None:
        """Put the service's refusal of ``run_input`` on the form: each schema problem on the
        field of the property it is about, everything else on the JSON box or above the form."""
        problems = input_problems(run_input, self.schema) if _schema_refusal(exc, run_input) else []
        if not problems:
            add_service_errors(self, exc)
            return
        if self.properties is None:
            self.add_error("input", [f"{name}: {words}" if name else words for name, words in problems])
            return
        for name, words in problems:
            field = f"{PREFIX}-{name}"
            if name is not None and field in self.fields:
                self.add_error(field, words)
            else:
                self.add_error(None, f"{name}: {words}" if name else words)
