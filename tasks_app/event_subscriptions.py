"""A task's subscriptions to named events (``Task.on_events``): which names start a run of it and
how a burst of them is debounced. Checked here for the API, the admin and the back office alike."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tms_core.durations import DurationField
from tms_core.json_paths import json_path_parse

#: An event's name: letters, digits, and ``. _ - :``, starting with a letter or digit (``order.paid``).
EVENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")
EVENT_NAME_HELP = "1-200 letters, digits and . _ - :, starting with a letter or digit, e.g. order.paid."
#: The most names a task may subscribe to.
MAX_SUBSCRIPTIONS = 20
#: The longest debounce window and maximum wait.
MAX_DEBOUNCE = timedelta(days=1)


@dataclass(frozen=True)
class Subscription:
    """One name a task subscribes to, and its debounce (None: each event starts its own run)."""

    name: str
    debounce: timedelta | None = None
    debounce_key: str = ""
    debounce_max_wait: timedelta | None = None


def event_name_check(name: Any) -> str:
    """``name`` if it is a valid event name, else :class:`serializers.ValidationError`."""
    if not isinstance(name, str) or not EVENT_NAME.match(name):
        raise serializers.ValidationError(f"Not an event name: {EVENT_NAME_HELP}")
    return name


def _debounce_length(help_text: str) -> DurationField:
    """An optional length of a debounce window (null: none), from 1 s to :data:`MAX_DEBOUNCE`:
    the window and its maximum wait have the same bounds."""
    return DurationField(
        required=False,
        allow_null=True,
        default=None,
        min_value=timedelta(seconds=1),
        max_value=MAX_DEBOUNCE,
        help_text=help_text,
    )


class SubscriptionSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, help_text=EVENT_NAME_HELP)
    debounce = _debounce_length(
        "Events of the same debounce_key within this long make one run, due this long after the last."
    )
    debounce_key = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=500,
        help_text='A JSON path into the payload ("$.customer_id"): the events debounced together (empty: all).',
    )
    debounce_max_wait = _debounce_length(
        "The run is never due later than this long after the first event of its window (null: no limit)."
    )

    def validate_name(self, value: str) -> str:
        return event_name_check(value)

    def validate_debounce_key(self, value: str) -> str:
        if value:
            try:
                json_path_parse(value)
            except ValueError as exc:
                raise serializers.ValidationError(str(exc)) from None
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("debounce") is None and (attrs.get("debounce_key") or attrs.get("debounce_max_wait")):
            raise serializers.ValidationError(
                {"debounce": ["Set a debounce to use debounce_key or debounce_max_wait."]}
            )
        return attrs


_SUBSCRIPTION_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "debounce": {"type": "number", "nullable": True},
        "debounce_key": {"type": "string"},
        "debounce_max_wait": {"type": "number", "nullable": True},
    },
    "required": ["name"],
}


@extend_schema_field({"type": "array", "items": {"oneOf": [{"type": "string"}, _SUBSCRIPTION_SCHEMA]}})
class SubscriptionsField(serializers.JSONField):
    """A task's ``on_events``: event names, or subscriptions with a debounce."""


def subscriptions_clean(value: Any) -> list[dict[str, Any]]:
    """The stored form of ``on_events`` (a list of names or ``{"name", "debounce", ...}``
    objects): a list of objects with durations in seconds, one per name. Raises
    :class:`serializers.ValidationError` (per item) on bad input."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise serializers.ValidationError("Expected a list of event names or subscriptions.")
    if len(value) > MAX_SUBSCRIPTIONS:
        raise serializers.ValidationError(f"At most {MAX_SUBSCRIPTIONS} subscriptions.")
    cleaned: list[dict[str, Any]] = []
    errors: dict[int, Any] = {}
    seen: set[str] = set()
    for index, item in enumerate(value):
        serializer = SubscriptionSerializer(data={"name": item} if isinstance(item, str) else item)
        if not isinstance(item, str | dict):
            errors[index] = ["Expected an event name or an object."]
            continue
        if not serializer.is_valid():
            errors[index] = serializer.errors
            continue
        unknown = sorted(set(item) - set(serializer.fields)) if isinstance(item, dict) else []
        if unknown:
            errors[index] = {name: ["Unknown field."] for name in unknown}
            continue
        data = serializer.validated_data
        if data["name"] in seen:
            errors[index] = {"name": ["Subscribed twice."]}
            continue
        seen.add(data["name"])
        cleaned.append(
            {
                "name": data["name"],
                "debounce": _seconds(data["debounce"]),
                "debounce_key": data["debounce_key"],
                "debounce_max_wait": _seconds(data["debounce_max_wait"]),
            }
        )
    if errors:
        raise serializers.ValidationError({str(index): problem for index, problem in errors.items()})
    return cleaned


def subscription_of(on_events: Any, name: str) -> Subscription | None:
    """The stored subscription of ``on_events`` to ``name``, if any."""
    for item in on_events or []:
        if isinstance(item, dict) and item.get("name") == name:
            return Subscription(
                name=name,
                debounce=_delta(item.get("debounce")),
                debounce_key=item.get("debounce_key") or "",
                debounce_max_wait=_delta(item.get("debounce_max_wait")),
            )
    return None


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _delta(value: Any) -> timedelta | None:
    return None if value is None else timedelta(seconds=float(value))
