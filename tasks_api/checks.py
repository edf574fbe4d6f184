"""The rules a task's settings must satisfy, applied by the create and update services (so the API,
the admin and the pages share them) and called by the API's serializers too, to report them beside
their own field errors: the cross-field rules (:func:`task_check_rules`), a calendar and an
artifact of the task's own team, and the runner's minimum interval."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from runners.registry import UnknownRunner, get_runner
from tasks_app.models import MIN_MISFIRE_GRACE, Calendar, CalendarPolicy
from tasks_app.schedules import Schedule, shortest_gap
from tms_core.errors import InvalidInput

#: The settings :func:`task_check_rules` reads.
RULE_FIELDS = (
    "interval",
    "cron",
    "start_at",
    "end_at",
    "retry_backoff",
    "retry_backoff_max",
    "jitter",
    "max_age",
    "dst_gap",
    "dst_fold",
    "calendar",
    "calendar_policy",
)


def task_check_rules(settings: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidInput` unless a task's settings (those of :data:`RULE_FIELDS` given;
    for an update, all of the task's with the changes merged) agree with each other. The create and update
    services apply them, so the API, the admin and the pages share them; the API's serializers
    call this too, to report them beside their own field errors."""
    errors: dict[str, list[str]] = {}
    if settings.get("interval") is not None and settings.get("cron"):
        errors["cron"] = ["Give an interval or a cron expression, not both."]
    start, end = settings.get("start_at"), settings.get("end_at")
    if start and end and end < start:
        errors["end_at"] = ["Must not be before start_at."]
    backoff, most = settings.get("retry_backoff"), settings.get("retry_backoff_max")
    if backoff is not None and most is not None and most < backoff:
        errors["retry_backoff_max"] = ["Must not be less than retry_backoff."]
    jitter, interval = settings.get("jitter") or timedelta(0), settings.get("interval")
    if interval is not None and jitter > interval:
        # The start window of one run would reach past the next run's fire time.
        errors["jitter"] = ["The start window (jitter) must not be longer than the interval."]
    max_age = settings.get("max_age")
    if max_age is not None and max_age < jitter + MIN_MISFIRE_GRACE:
        errors["max_age"] = ["Must be at least the start window (jitter) plus 1 s, or every run could expire."]
    if not settings.get("cron"):
        # DST rules choose what a cron schedule does when the clock changes: an interval is real
        # elapsed time and a one-shot time one instant: there they would be accepted and do nothing.
        for name in ("dst_gap", "dst_fold"):
            if settings.get(name):
                errors[name] = [
                    "Applies to cron schedules only: an interval or a one-shot time is not read on a clock."
                ]
    if settings.get("calendar_policy") and not settings.get("calendar"):
        errors["calendar_policy"] = ["Applies only with a calendar: give calendar too (or no calendar_policy)."]
    if errors:
        raise InvalidInput(errors)


def calendar_resolve(*, team_id: int, calendar: Any) -> Calendar | None:
    """The calendar of team ``team_id`` named ``calendar`` (a name, or a Calendar already chosen:
    checked to be the team's). A calendar of another team is reported exactly as a missing one (on
    ``calendar``): a task uses its own team's calendars only, and another team's do not leak."""
    if calendar in (None, ""):
        return None
    if isinstance(calendar, Calendar):
        if calendar.team_id == team_id:
            return calendar
        calendar = calendar.name
    found = Calendar.objects.filter(team_id=team_id, name=calendar).first()
    if found is None:
        raise InvalidInput.on(
            "calendar", f"The task's team has no calendar named {calendar!r} (GET /api/v1/calendars?team=...)."
        )
    return found


def _calendar_settings(team_id: int, spec: dict[str, Any]) -> None:
    """Resolve a spec's ``calendar`` (a name) to the team's calendar and give it its default
    policy (skip); a policy without a calendar is left for :func:`task_check_rules` to report."""
    if "calendar" in spec:
        spec["calendar"] = calendar_resolve(team_id=team_id, calendar=spec["calendar"])
    if spec.get("calendar") is not None and not spec.get("calendar_policy"):
        spec["calendar_policy"] = CalendarPolicy.SKIP
    elif spec.get("calendar") is None and "calendar_policy" in spec and spec["calendar_policy"] is None:
        spec["calendar_policy"] = CalendarPolicy.NONE


def artifact_check_team(*, team_id: int, artifact: Any) -> None:
    """A task runs only an artifact of its own team: another team's is an error on ``artifact``
    (the serializers already hide those of teams the caller is not in)."""
    if artifact is not None and getattr(artifact, "team_id", team_id) != team_id:
        raise InvalidInput.on("artifact", "This artifact belongs to another team: upload it to the task's team.")


def task_check_min_interval(*, runner: str, schedule: Schedule, jitter: timedelta | None = None) -> None:
    """Raise :class:`InvalidInput` on ``schedule`` when it can fire more often than the runner's
    ``min_interval`` allows (its ``MIN_INTERVAL`` in ``TMS_RUNNERS``). A jitter can bring two
    fire times closer by up to itself, so it counts against the gap."""
    try:
        minimum = get_runner(runner).min_interval
    except UnknownRunner:
        return  # reported on "runner" by task_validate_runner
    gap = shortest_gap(schedule)
    if gap is None or not minimum:
        return
    effective = gap - (jitter or timedelta(0))
    if effective.total_seconds() < minimum:
        what = f"{gap.total_seconds():g} s apart"
        if jitter:
            what += f" ({effective.total_seconds():g} s with the jitter)"
        raise InvalidInput.on(
            "schedule",
            f"The {runner!r} runner allows at most one run every {minimum:g} s; this schedule fires {what}.",
        )
