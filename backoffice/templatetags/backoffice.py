"""Small template filters for the back office's pages."""

from __future__ import annotations

from typing import Any

from django import template

from tasks_app.schedule_words import short_duration

register = template.Library()


@register.filter
def seconds(value: Any) -> str:
    """Seconds (or a timedelta) in a compact form: "850 ms", "12.3 s", "4m05s"."""
    if value is None or value == "":
        return "\u2013"
    if hasattr(value, "total_seconds"):
        value = value.total_seconds()
    return short_duration(float(value))


@register.filter
def percent(value: Any) -> str:
    return "\u2013" if value is None else f"{float(value) * 100:.1f}%"


@register.filter
def get(mapping: Any, key: Any) -> Any:
    """``mapping[key]`` in a template (0 when missing)."""
    try:
        return mapping.get(key, 0)
    except AttributeError:
        return 0


@register.filter
def lower_status(value: Any) -> str:
    return str(value or "").lower()
