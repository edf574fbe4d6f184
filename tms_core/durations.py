"""Duration strings as users write them: ``"90s"``, ``"5m"``, ``"1h30m"``, ``"250ms"`` or seconds."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.dateparse import parse_duration as parse_django_duration
from rest_framework import serializers

_UNITS = {
    "us": Decimal("0.000001"),
    "µs": Decimal("0.000001"),
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}
_PART = re.compile(r"(\d+(?:\.\d+)?)(us|µs|ms|s|m|h|d)")
#: Upper bound for any duration, so arithmetic on datetimes can never overflow.
MAX_DURATION = timedelta(days=3650)


def parse_duration(value: Any) -> timedelta:
    """Parse ``value`` (a number of seconds or a string such as ``"1h30m"``) into a timedelta.

    Raises ``ValueError`` with a user-facing message when it is not a valid, non-negative duration.
    """
    if isinstance(value, bool):
        raise ValueError('Expected a number of seconds or a duration string such as "90s".')
    if isinstance(value, int | float | Decimal):
        seconds = _decimal(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not text:
            raise ValueError("Duration may not be empty.")
        try:
            seconds = Decimal(text)
        except InvalidOperation:
            seconds = _parse_parts(text)
    else:
        raise ValueError('Expected a number of seconds or a duration string such as "90s".')
    if seconds < 0:
        raise ValueError("Duration may not be negative.")
    if seconds > Decimal(MAX_DURATION.total_seconds()):
        raise ValueError("Duration may be at most 3650 days.")
    return timedelta(seconds=float(seconds))


def _decimal(value: int | float | Decimal) -> Decimal:
    try:
        result = Decimal(str(value))
    except InvalidOperation:
        raise ValueError("Not a number.") from None
    if not result.is_finite():
        raise ValueError("Duration must be finite.")
    return result


def _parse_parts(text: str) -> Decimal:
    position, total = 0, Decimal(0)
    for match in _PART.finditer(text):
        if match.start() != position:
            break
        total += Decimal(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position != len(text) or position == 0:
        raise ValueError(
            f'Invalid duration {text!r}: use a number of seconds or units such as "250ms", "90s", "5m", "1h30m".'
        )
    return total


def format_duration(value: timedelta) -> str:
    """Format a timedelta the way :func:`parse_duration` reads it (``"1h30m"``, ``"250ms"``)."""
    micros = round(value.total_seconds() * 1_000_000)
    if micros == 0:
        return "0s"
    parts = []
    for unit, size in (("h", 3_600_000_000), ("m", 60_000_000), ("s", 1_000_000), ("ms", 1000), ("us", 1)):
        count, micros = divmod(micros, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


class DurationField(serializers.Field):
    """DRF field for durations: accepts seconds or a duration string, renders seconds."""

    default_error_messages = {"invalid": "{message}"}

    def __init__(
        self, *, min_value: timedelta | None = None, max_value: timedelta | None = None, **kwargs: Any
    ) -> None:
        self.min_value = min_value
        self.max_value = max_value
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> timedelta:
        try:
            value = parse_duration(data)
        except ValueError as exc:
            self.fail("invalid", message=str(exc))
        if self.min_value is not None and value < self.min_value:
            self.fail("invalid", message=f"Must be at least {format_duration(self.min_value)}.")
        if self.max_value is not None and value > self.max_value:
            self.fail("invalid", message=f"Must be at most {format_duration(self.max_value)}.")
        return value

    def to_representation(self, value: timedelta) -> float:
        return value.total_seconds()


class DurationFormField(forms.Field):
    """Django form field for durations in the API's syntax (``"90s"``, ``"5m"``, ``"1h30m"``, or
    seconds), so that the admin takes what the API takes; Django's own ``"HH:MM:SS"`` still reads.
    Shows a value as :func:`format_duration` writes it."""

    widget = forms.TextInput

    def __init__(self, **kwargs: Any) -> None:
        kwargs.pop("max_length", None)  # model DurationFields pass none; be safe with overrides
        kwargs.setdefault("help_text", 'e.g. "90s", "5m", "1h30m" or seconds')
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        return format_duration(value) if isinstance(value, timedelta) else value

    def to_python(self, value: Any) -> timedelta | None:
        if value in self.empty_values:
            return None
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(value)
        except ValueError as exc:
            django_form = parse_django_duration(str(value).strip())
            if django_form is not None and django_form >= timedelta(0):
                return django_form
            raise ValidationError(str(exc), code="invalid") from None
