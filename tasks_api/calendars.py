"""Business calendars: the services that define them, and re-plan the tasks that use them.

A team's editors define calendars for the team's tasks (``POST /api/v1/calendars``); a task
names one of its own team's with a policy (:class:`~tasks_app.models.CalendarPolicy`). What a
calendar closes, and where a fire time on a closed day goes, is :mod:`tasks_app.calendars`; the
materialiser applies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from executions.models import ExecutionStatus
from tasks_api.named import audit_update, change_locked, create_audited, delete_audited, listed, name_taken
from tasks_api.replan import task_replan
from tasks_app.calendars import MAX_CLOSED_RUN, MAX_EXTRA_DATES, CalendarRules, supported_countries
from tasks_app.models import Calendar, Task, TaskStatus, Team
from tasks_app.teams.services import team_for_new
from tms_core.errors import ConflictError, InvalidInput

#: What a calendar's create, update and audit entries show.
CALENDAR_FIELDS = ("name", "country", "subdivision", "weekends_closed", "weekend_days", "extra_dates")
#: The years extra dates may lie in.
FIRST_YEAR, LAST_YEAR = 1900, 2999
#: How many of the tasks using a calendar an error names.
_NAMED = 10


def _snapshot(calendar: Calendar) -> dict[str, Any]:
    return {name: getattr(calendar, name) for name in CALENDAR_FIELDS}


def calendar_clean_extra(extra: Any) -> list[dict[str, str]]:
    """Normalise extra closed dates: ``[{"start": "2027-12-24", "end": "2027-12-31", "label":
    "shutdown"}]`` (``end`` optional: one day; ``date`` accepted for ``start``). Errors on
    ``extra_dates``."""
    items = listed(
        extra,
        field="extra_dates",
        expected='{"start": date, "end": date, "label": text}',
        most=MAX_EXTRA_DATES,
        too_many=f"At most {MAX_EXTRA_DATES} extra dates or ranges.",
    )
    cleaned = []
    for index, item in enumerate(items):
        where = f"Item {index}"
        if not isinstance(item, Mapping) or not set(item) <= {"start", "end", "date", "label"}:
            raise InvalidInput.on("extra_dates", f'{where}: expected {{"start": date, "end": date, "label": text}}.')
        start, end, label = item.get("start", item.get("date")), item.get("end"), item.get("label", "")
        try:
            first = start if isinstance(start, date) else date.fromisoformat(str(start))
            last = first if end in (None, "") else end if isinstance(end, date) else date.fromisoformat(str(end))
        except ValueError:
            raise InvalidInput.on("extra_dates", f"{where}: start and end are dates (YYYY-MM-DD).") from None
        if not (first.year >= FIRST_YEAR and last.year <= LAST_YEAR):
            raise InvalidInput.on("extra_dates", f"{where}: dates from {FIRST_YEAR} to {LAST_YEAR}.")
        if last < first:
            raise InvalidInput.on("extra_dates", f"{where}: end is before start.")
        if (last - first).days + 1 > MAX_CLOSED_RUN:
            raise InvalidInput.on("extra_dates", f"{where}: closes more than {MAX_CLOSED_RUN} days in a row.")
        if not isinstance(label, str) or len(label) > 100:
            raise InvalidInput.on("extra_dates", f"{where}: label is a text of at most 100 characters.")
        cleaned.append({"start": first.isoformat(), "end": last.isoformat(), "label": label})
    return sorted(cleaned, key=lambda item: (item["start"], item["end"]))


def _validate(calendar: Calendar) -> None:
    """Per-field errors of a calendar (its extra dates already cleaned), then the longest run of
    closed days it makes (at most :data:`MAX_CLOSED_RUN`)."""
    errors: dict[str, list[str]] = {}
    if not calendar.name or len(calendar.name) > 100:
        errors["name"] = ["A name of 1 to 100 characters is required."]
    countries = supported_countries()
    calendar.country = (calendar.country or "").upper()
    if calendar.country and calendar.country not in countries:
        errors["country"] = [
            f"{calendar.country!r} is not a country the holidays package knows (ISO 3166 alpha-2, e.g. DE, US)."
        ]
    if calendar.subdivision:
        if not calendar.country:
            errors["subdivision"] = ["A subdivision needs a country."]
        elif calendar.country in countries:
            known = {code.upper(): code for code in countries[calendar.country]}
            if calendar.subdivision.upper() not in known:
                choices = ", ".join(countries[calendar.country]) or "none"
                errors["subdivision"] = [
                    f"{calendar.subdivision!r} is not a subdivision of {calendar.country}: {choices}."
                ]
            else:
                calendar.subdivision = known[calendar.subdivision.upper()]
    days = calendar.weekend_days
    if (
        not isinstance(days, list)
        or not all(isinstance(day, int) and not isinstance(day, bool) and 1 <= day <= 7 for day in days)
        or len(set(days)) != len(days)
        or len(days) > 6
    ):
        errors["weekend_days"] = ["ISO weekdays (1 Monday ... 7 Sunday), each once, at most 6 of them."]
    else:
        calendar.weekend_days = sorted(days)
    if not calendar.country and not calendar.extra_dates and not calendar.weekends_closed and not errors:
        errors["country"] = ["A calendar closes something: give a country, extra_dates or weekends_closed."]
    if errors:
        raise InvalidInput(errors)
    rules = CalendarRules.of(calendar)
    for item in calendar.extra_dates:
        run, first = rules.longest_run(date.fromisoformat(item["start"]), date.fromisoformat(item["end"]))
        if run > MAX_CLOSED_RUN:
            raise InvalidInput.on(
                "extra_dates",
                f"With its holidays and weekends the calendar closes {run} days in a row from {first}: at most "
                f"{MAX_CLOSED_RUN} (previous_business_day plans that far ahead).",
            )


def calendar_create(
    *,
    owner: User,
    team: Team | None = None,
    name: str,
    country: str = "",
    subdivision: str = "",
    weekends_closed: bool = False,
    weekend_days: Any = None,
    extra_dates: Any = None,
) -> Calendar:
    """Define a business calendar for the tasks of ``team`` (default: ``owner``'s personal team;
    ``owner`` needs the editor role in it, else PermissionDenied), recorded as defined by ``owner``.
    A duplicate name in the team is an error on ``name``, an unknown country or subdivision on
    its field. Audited."""
    team = team_for_new(owner, team, permission="tasks_app.add_calendar", what="this team's calendars")
    calendar = Calendar(
        owner=owner,
        team=team,
        name=name,
        country=country,
        subdivision=subdivision,
        weekends_closed=weekends_closed,
        weekend_days=[6, 7] if weekend_days is None else weekend_days,
        extra_dates=calendar_clean_extra(extra_dates),
    )
    _validate(calendar)
    if Calendar.objects.filter(team=team, name=name).exists():
        raise name_taken("calendar", name)
    create_audited(calendar, kind="calendar", owner_id=owner.pk, snapshot=_snapshot)
    return calendar


def calendar_update(*, calendar: Calendar, changes: Mapping[str, Any], actor: str) -> Calendar:
    """Change a calendar (partial). A change of what it closes re-plans every task using it
    (not deleted): their SCHEDULED executions that never started are replaced by ones placed
    by the new calendar (:func:`~tasks_api.replan.task_replan`); running, published and
    finished ones are left alone. Audited."""
    with transaction.atomic():
        locked, before = change_locked(
            calendar, changes, fields=CALENDAR_FIELDS, snapshot=_snapshot, clean={"extra_dates": calendar_clean_extra}
        )
        if locked.weekend_days is None:
            locked.weekend_days = [6, 7]
        _validate(locked)
        if (
            "name" in changes
            and Calendar.objects.filter(team_id=locked.team_id, name=locked.name).exclude(pk=locked.pk).exists()
        ):
            raise name_taken("calendar", locked.name)
        locked.save()
        after = _snapshot(locked)
        audit_update(locked, kind="calendar", before=before, after=after)
        closes = {name: value for name, value in before.items() if name != "name"}
        if closes != {name: value for name, value in after.items() if name != "name"}:
            calendar_replan(calendar=locked, actor=actor)
    return locked


def calendar_replan(*, calendar: Calendar, actor: str) -> int:
    """Re-plan every task (not deleted) that uses ``calendar``: each one's SCHEDULED executions
    that never started are superseded and planned again by the calendar as it is now. One task
    at a time, each locked as a task update locks it. Returns how many executions were replaced."""
    replaced = 0
    ids = Task.objects.filter(calendar=calendar).exclude(status=TaskStatus.DELETED).values_list("pk", flat=True)
    for task_id in ids:
        task = Task.objects.select_for_update().filter(pk=task_id).exclude(status=TaskStatus.DELETED).first()
        if task is None:
            continue
        replaced += task_replan(
            task=task,
            actor=actor,
            reason=f"replaced: its calendar {calendar.name!r} changed",
            only_from=frozenset({ExecutionStatus.SCHEDULED}),
        )
    return replaced


def calendar_delete(*, calendar: Calendar) -> None:
    """Delete a calendar no task uses (deleted tasks let go of it); one in use is a conflict
    naming the tasks. Audited."""
    with transaction.atomic():
        locked = Calendar.objects.select_for_update().get(pk=calendar.pk)
        users = list(
            Task.objects.filter(calendar=locked)
            .exclude(status=TaskStatus.DELETED)
            .values_list("id", flat=True)[:_NAMED]
        )
        if users:
            names = ", ".join(str(task_id) for task_id in users)
            raise ConflictError(f"Calendar {locked.name!r} is used by tasks ({names}); change them first.")
        # Deleted tasks keep their history, not their calendar (the reference would keep it forever).
        Task.objects.filter(calendar=locked, status=TaskStatus.DELETED).update(calendar=None, calendar_policy="")
        delete_audited(locked, kind="calendar", snapshot=_snapshot)


def calendar_closed_days(*, calendar: Calendar, start: date, end: date) -> list[tuple[date, str]]:
    """The calendar's closed days from ``start`` to ``end`` (inclusive, at most 366 days: an
    error on ``to``), each with its reason."""
    if end < start:
        raise InvalidInput.on("to", "Must not be before from.")
    if end - start > timedelta(days=366):
        raise InvalidInput.on("to", "At most 366 days at once.")
    return CalendarRules.of(calendar).closed_days(start, end)
