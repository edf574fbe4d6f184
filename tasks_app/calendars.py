"""Business calendars: which local dates are closed, and where a fire time on one goes.

A :class:`~tasks_app.models.Calendar` closes the public holidays of a country (and optionally a
subdivision) from the ``holidays`` package, extra dates and ranges with a label each, and
optionally its weekend days. This module answers, from plain values (:class:`CalendarRules`, so
that the materialiser and previews need no model instance):

- :meth:`CalendarRules.closed`: is this local date closed, and why (the holiday's name, the
  extra date's label, or ``weekend``);
- :func:`calendar_place`: what a task's policy makes of a fire time: it runs, it is skipped,
  or it moves to the same wall time on the next or previous open day, resolved through the
  task's time zone and DST rules.

A run of closed days longer than :data:`MAX_CLOSED_RUN` is refused when a calendar is saved:
``previous_business_day`` plans fire times that far ahead (a fire time may move back before
the materialiser's horizon), and a search for an open day stops there.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import holidays

from tasks_app.models import CalendarPolicy
from tasks_app.schedules import Schedule

#: The longest run of closed days in a row a calendar may have.
MAX_CLOSED_RUN = 31
#: The most extra dates or ranges a calendar holds.
MAX_EXTRA_DATES = 500
#: ISO weekday numbers, for messages.
WEEKDAY_NAMES = {1: "Monday", 2: "Tuesday", 3: "Wednesday", 4: "Thursday", 5: "Friday", 6: "Saturday", 7: "Sunday"}


@functools.lru_cache(maxsize=1)
def supported_countries() -> dict[str, tuple[str, ...]]:
    """Country codes the pinned ``holidays`` package knows, each with its subdivision codes."""
    return {code: tuple(subdivisions) for code, subdivisions in holidays.list_supported_countries().items()}


@functools.lru_cache(maxsize=1024)
def _holidays(country: str, subdivision: str, year: int) -> dict[date, str]:
    """The public holidays of one year, cached in-process: the package builds them in Python
    (tens of microseconds a year), and a materialiser pass asks about the same few calendars
    and years again and again."""
    found = holidays.country_holidays(country, subdiv=subdivision or None, years=year, language="en_US")
    return dict(found.items())


@dataclass(frozen=True)
class ExtraDate:
    start: date
    end: date
    label: str


@dataclass(frozen=True)
class CalendarRules:
    """What a calendar closes, as plain values (hashable: cached by day)."""

    name: str
    country: str = ""
    subdivision: str = ""
    weekends_closed: bool = False
    weekend_days: tuple[int, ...] = (6, 7)
    extra: tuple[ExtraDate, ...] = ()

    @classmethod
    def of(cls, calendar: Any) -> CalendarRules:
        """The rules of a :class:`~tasks_app.models.Calendar` (its fields already cleaned)."""
        return cls(
            name=calendar.name,
            country=calendar.country,
            subdivision=calendar.subdivision,
            weekends_closed=calendar.weekends_closed,
            weekend_days=tuple(calendar.weekend_days or ()),
            extra=tuple(
                ExtraDate(date.fromisoformat(item["start"]), date.fromisoformat(item["end"]), item.get("label", ""))
                for item in calendar.extra_dates or ()
            ),
        )

    def closed(self, day: date) -> str:
        """Why ``day`` (a local date) is closed: a holiday's name, an extra date's label (or
        ``closed``), ``weekend``; empty when it is a business day."""
        if self.country:
            name = _holidays(self.country, self.subdivision, day.year).get(day)
            if name:
                return name
        for extra in self.extra:
            if extra.start <= day <= extra.end:
                return extra.label or "closed"
        if self.weekends_closed and day.isoweekday() in self.weekend_days:
            return "weekend"
        return ""

    def closed_days(self, start: date, end: date) -> list[tuple[date, str]]:
        """Each closed day from ``start`` to ``end`` (inclusive) with its reason."""
        days = []
        for offset in range((end - start).days + 1):
            day = start + timedelta(days=offset)
            reason = self.closed(day)
            if reason:
                days.append((day, reason))
        return days

    def longest_run(self, start: date, end: date) -> tuple[int, date | None]:
        """The longest run of closed days in a row that touches ``[start, end]``, and its first day."""
        best, best_start, run, run_start = 0, None, 0, None
        day = start - timedelta(days=MAX_CLOSED_RUN + 1)
        while day <= end + timedelta(days=MAX_CLOSED_RUN + 1):
            if self.closed(day):
                run_start = day if run == 0 else run_start
                run += 1
                if run > best:
                    best, best_start = run, run_start
            else:
                run = 0
            day += timedelta(days=1)
        return best, best_start


@dataclass(frozen=True)
class Placement:
    """What a task's calendar makes of one fire time."""

    #: The fire time asked about.
    fire_time: datetime
    #: When it runs: the fire time, a moved instant, or None (skipped).
    run_at: datetime | None
    #: Why its day is closed (empty: it is not, and it runs as scheduled).
    reason: str = ""
    #: Why it could not be moved (a skipped move), in words.
    note: str = ""

    @property
    def moved(self) -> bool:
        return self.run_at is not None and self.run_at != self.fire_time


def _at_wall_time(day: date, wall: datetime, zone: str, *, gap: str, fold: str) -> datetime | None:
    """The instant ``day`` shows the wall time of ``wall``, through the task's DST rules: a wall
    time the clock skips that day follows ``gap`` (empty or ``shift``: right after the gap;
    ``skip``: None), one it shows twice follows ``fold`` (``second``: the later; else the first:
    a moved occurrence is one run). Resolved by the cron engine itself, with a one-day expression
    at that wall time, so that a moved time and a scheduled one agree on DST."""
    cron = f"{wall.second} {wall.minute} {wall.hour} {day.day} {day.month} *"
    fold = "second" if fold == "second" else "first"
    start = datetime.combine(day - timedelta(days=1), wall.time(), tzinfo=UTC)
    schedule = Schedule(start_at=start, cron=cron, timezone=zone, dst_gap=gap or "shift", dst_fold=fold)
    for when in schedule.fire_times(since=start):
        local = when.astimezone(ZoneInfo(zone))
        if local.date() != day:
            return None  # skipped by dst_gap skip: the expression's next day is a year later
        return when.replace(microsecond=wall.microsecond)
    return None


def calendar_place(
    rules: CalendarRules, policy: str, when: datetime, *, timezone: str, dst_gap: str = "", dst_fold: str = ""
) -> Placement:
    """Where the fire time ``when`` of a task with this calendar and ``policy`` runs.

    Its day is its local date in ``timezone``. An open day: it runs at ``when``. A closed day:
    ``skip`` runs nothing; ``next_business_day`` / ``previous_business_day`` run at the same wall
    time on the nearest open day after / before it (within :data:`MAX_CLOSED_RUN` days; further,
    or a wall time the clock skips that day under ``dst_gap`` skip, it is skipped with a note).
    """
    zone = ZoneInfo(timezone)
    local = when.astimezone(zone)
    reason = rules.closed(local.date())
    if not reason:
        return Placement(when, when)
    if policy not in (CalendarPolicy.NEXT_BUSINESS_DAY, CalendarPolicy.PREVIOUS_BUSINESS_DAY):
        return Placement(when, None, reason)
    step = timedelta(days=1 if policy == CalendarPolicy.NEXT_BUSINESS_DAY else -1)
    day = local.date()
    for _ in range(MAX_CLOSED_RUN + 1):
        day += step
        if not rules.closed(day):
            moved = _at_wall_time(day, local, timezone, gap=dst_gap, fold=dst_fold)
            if moved is None:
                note = f"{local:%H:%M:%S} does not exist on {day.isoformat()} (the clock skips it; dst_gap skip)"
                return Placement(when, None, reason, note)
            return Placement(when, moved, reason)
    return Placement(when, None, reason, f"no business day within {MAX_CLOSED_RUN} days")


def lookahead(rules: CalendarRules, until: datetime, timezone: str) -> timedelta:
    """How far past the horizon ``until`` ``previous_business_day`` must plan fire times so that
    every one moving back to before it is met: a fire time later on the horizon's own (local)
    day, and those of the closed days right after it. Such a fire time lies within that many
    days of the horizon plus one; a closed run that starts later moves back onto a day after
    the horizon's."""
    day = until.astimezone(ZoneInfo(timezone)).date()
    closed = 0
    while closed < MAX_CLOSED_RUN and rules.closed(day + timedelta(days=closed + 1)):
        closed += 1
    return timedelta(days=closed + 1)
