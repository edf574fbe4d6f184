"""A task's schedule said in words, for people: "Every 5 minutes", "At 09:00, Monday through Friday".

Cron expressions are described by cron-descriptor (a library made for it; 6 fields read with
seconds first, as :mod:`tasks_app.schedules` reads them), with TMS's day rule put in words;
intervals and one-shot times here. The API returns these words as a task's and a preview's
``description``, so that a misread expression shows at once.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from cron_descriptor import DescriptionTypeEnum, ExpressionDescriptor, Options

from tasks_app.models import DependencyOn, TaskDependency, TaskStatus
from tasks_app.schedules import ScheduleError, parse_cron

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


@functools.lru_cache(maxsize=1024)
def cron_words(expression: str) -> str:
    """A cron expression in plain English, read as :mod:`tasks_app.schedules` reads it (the
    expression itself if it is invalid or cannot be described).

    Six fields are seconds first. A stepped day-of-week field is described from the days it
    selects (cron-descriptor cannot read ``*/7``: Sunday in cron). When neither
    day field starts with ``*`` a day matches on either, so the words say "or"; cron-descriptor
    would say "on day 13 of the month, only on Friday", which reads as both.
    """
    try:
        cron = parse_cron(expression)
    except ScheduleError:
        return expression
    fields = list(cron.fields)
    if "/" in fields[-1]:
        fields[-1] = _list_text(cron.weekdays)
    try:
        if not cron.day_or:
            return _describe(" ".join(fields))
        every_weekday = " ".join([*fields[:-1], "*"])
        text = _describe(every_weekday)
        by_date = _describe(every_weekday, DescriptionTypeEnum.DAYOFMONTH)
        by_weekday = _describe(" ".join(fields), DescriptionTypeEnum.DAYOFWEEK).removeprefix(", ")
        by_weekday = by_weekday.removeprefix("only on ")
        if not by_date or by_date not in text or not by_weekday:
            return _describe(" ".join(fields))
        return text.replace(by_date, f"{by_date} or on {by_weekday}", 1)
    except Exception:  # noqa: BLE001 - any expression the library cannot read is shown as it is
        return expression


def _describe(expression: str, kind: DescriptionTypeEnum = DescriptionTypeEnum.FULL) -> str:
    options = Options()
    options.use_24hour_time_format = True
    options.throw_exception_on_parse_error = True
    return str(ExpressionDescriptor(expression, options).get_description(kind))


def _list_text(values: frozenset[int]) -> str:
    """``{1, 2, 3, 4, 5}`` -> "1-5", ``{0, 6}`` -> "0,6": runs of three or more as ranges."""
    ordered, items = sorted(values), []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        if end - start >= 2:
            items.append(f"{ordered[start]}-{ordered[end]}")
        else:
            items.extend(str(value) for value in ordered[start : end + 1])
        start = end + 1
    return ",".join(items)


def schedule_description(*, cron: str, interval: timedelta | None, timezone: str) -> str:
    """A schedule in words: the cron expression as it is read, in its zone; the interval; or "Once"."""
    if cron:
        return f"{cron_words(cron)} ({timezone})"
    if interval is not None:
        return f"Every {duration_words(interval)}"
    return "Once"


#: How an upstream's run must end for a follower to run (``after``'s ``on``), in words.
AFTER_ENDS: dict[str, str] = {
    DependencyOn.SUCCESS: "succeeds",
    DependencyOn.FAILURE: "fails for good",
    DependencyOn.COMPLETION: "ends",
}


def runs_only_after(task: Any) -> bool:
    """Whether ``task`` runs only after other tasks (and on request): it follows some and has no
    fire time of its own (no interval or cron, and no one-shot time still to come)."""
    return bool(task.has_after) and task.interval is None and not task.cron and task.next_run_at is None


def after_words(task: Any) -> str:
    """What runs a task of :func:`runs_only_after`, in words: "After extract succeeds"; "After
    transform succeeds and check succeeds (same workflow run)" for a fan-in. One query."""
    links = (
        TaskDependency.objects.filter(task_id=task.pk)
        .exclude(upstream__status=TaskStatus.DELETED)
        .values_list("upstream__name", "upstream_id", "on")
    )
    parts = sorted(f"{name or upstream} {AFTER_ENDS.get(on, on)}" for name, upstream, on in links)
    if not parts:
        return "On request only (it follows no task now)"
    joined = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"After {joined}" + (" (same workflow run)" if len(parts) > 1 else "")


def schedule_words(task: Any) -> str:
    """How often ``task`` runs, in words (its zone named for cron schedules); for a workflow step
    with no schedule of its own, after what it runs (:func:`after_words`), not "Once"."""
    if runs_only_after(task):
        return after_words(task)
    return schedule_description(cron=task.cron, interval=task.interval, timezone=task.timezone)
