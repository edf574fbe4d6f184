"""A task's schedule said in words, for people: "Every 5 minutes", "At 09:00, Monday through Friday".

Cron expressions are described by cron-descriptor (a library made for it; 6 fields read with
seconds first, as :mod:`tasks_app.schedules` reads them); intervals and one-shot times here.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from cron_descriptor import ExpressionDescriptor, Options

_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def duration_words(value: timedelta | float | None) -> str:
    """``timedelta(seconds=5400)`` -> "1 hour 30 minutes"; sub-second values in milliseconds."""
    if value is None:
        return ""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        return "-" + duration_words(-seconds)
    if seconds < 1:
        return f"{seconds * 1000:g} ms" if seconds else "0 seconds"
    whole, fraction = divmod(seconds, 1)
    parts = []
    remaining = int(whole)
    for name, size in _UNITS:
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count} {name}{'s' if count != 1 else ''}")
    text = " ".join(parts)
    if fraction >= 0.001:
        text += f" {fraction * 1000:.0f} ms"
    return text


def short_duration(seconds: float | None) -> str:
    """Compact duration for tables and charts: "850 ms", "12.3 s", "4m05s", "2h10m"."""
    if seconds is None:
        return "\u2013"
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    if seconds < 1:
        return f"{sign}{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{sign}{seconds:.1f} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{sign}{minutes}m{rest:02d}s"
    hours, rest = divmod(round(seconds), 3600)
    return f"{sign}{hours}h{rest // 60:02d}m"


def cron_words(expression: str) -> str:
    """A cron expression described in plain English (the expression itself if it cannot be)."""
    options = Options()
    options.use_24hour_time_format = True
    options.throw_exception_on_parse_error = True
    try:
        return ExpressionDescriptor(expression, options).get_description()
    except Exception:  # noqa: BLE001 - any expression the library cannot read is shown as it is
        return expression


def schedule_words(task: Any) -> str:
    """How often ``task`` runs, in words (its zone named for cron schedules)."""
    if task.cron:
        return f"{cron_words(task.cron)} ({task.timezone})"
    if task.interval is not None:
        return f"Every {duration_words(task.interval)}"
    return "Once"
