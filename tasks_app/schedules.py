"""When a task fires: once, on a fixed interval, or on a cron expression in an IANA time zone.

:class:`Schedule` is a pure value (no database). :meth:`Schedule.fire_times` yields its fire
times as aware UTC datetimes in strictly increasing order: an instant is never repeated and
the sequence never goes backwards.

One-shot and interval schedules
-------------------------------
A one-shot schedule fires once, at ``start_at``. An interval schedule fires at
``start_at + k * interval`` (k = 0, 1, 2, ...): the times stay on that grid, so a late or
repeated pass never drifts the schedule. Both ignore the time zone (an interval is real
elapsed time).

Cron syntax
-----------
Five fields, ``minute hour day-of-month month day-of-week``, or six with ``second`` FIRST
(``second minute hour day-of-month month day-of-week``), separated by ASCII spaces or tabs. An
expression is ASCII only: any other character (another script's digit, a superscript, a
no-break space) is refused with its code point named. Each field is a comma-separated list of:

* ``*`` (every value), a number, or a range ``a-b`` (inclusive, ``a <= b``);
* a step: ``*/n``, ``a-b/n``, or ``a/n`` (from ``a`` to the field's maximum), every n-th value;
* month names ``JAN``-``DEC`` and weekday names ``SUN``-``SAT`` (any case), also in ranges.

Weekdays run 0-7, where 0 and 7 are both Sunday (``*`` and ``a/n`` stop at 6, Saturday);
Sunday closing a range counts as 7 (``FRI-SUN``).
``?`` means ``*`` in the two day fields. The shortcuts ``@yearly`` (``@annually``),
``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and ``@hourly`` stand for their usual
five-field expressions.

Quartz's day extensions, with Quartz's meaning (issue 32); each stands alone in its field:

* day of month ``L``: the month's last day; ``L-n`` (n 0-30): n days before it (``L-3`` on
  28 January, 26 February 2028); ``nW``: the weekday (Monday-Friday) nearest day n: a
  Saturday moves to the Friday before and a Sunday to the Monday after, but never into another
  month (``1W`` on Saturday 1 February 2025 is Monday the 3rd), and a month without day n has
  none; ``LW``: the month's last weekday.
* day of week ``d#n`` (n 1-5): the n-th weekday d of the month (``MON#2``, ``1#2``; a month with
  no fifth Monday has no ``MON#5``); ``dL``: the month's last weekday d (``FRIL``, ``5L``).
  Weekday numbers are this engine's (0 or 7 Sunday, 1 Monday ... 6 Saturday), not Quartz's 1-7
  (Quartz's ``6#3`` is ``FRI#3`` here). ``L`` alone in the day-of-week field (Quartz: Saturday)
  is refused as ambiguous.

They are restricted day fields for the day rule below (``0 0 L * MON`` fires on the last day and
on Mondays; ``0 0 L * *`` on the last day). Rejected with a :class:`ScheduleError`: the
Jenkins ``H`` and croniter ``R`` extensions, a year field, an extension in a list or range
(``1,L``), ranges that run backwards (``22-2``: write
``22-23,0-2``), a field that selects nothing (``7/7``: no weekday from 7 to 6), and
expressions that can never fire (``0 0 30 2 *``: February has no 30th; ``0 0 30W 2 *``). The search for the
next fire time is bounded too: it gives up after 41 years without one (a valid expression fires
at least every 40 years: ``0 0 29 2 */7``, 29 February on a Sunday).

Walking a cron schedule costs time in proportion to the span of time walked, not to the number
of fire times met (``0 0 29 2 *`` meets one every four years), so one walk of
:meth:`Schedule.fire_times` reaches at most :data:`MAX_WALK_YEARS` past where it starts: asking
for a fire time beyond raises :class:`WalkTooLong` (callers answer it as a bad request on the
field that asked for too much). Interval schedules are not bounded this way: each fire time costs
the same, however far apart, and callers bound how many they take.

Day of month and day of week follow Vixie cron and cronie (what crontab users know): a day field
that starts with ``*`` (``*``, ``*/7``, ``*/2,15``; ``?`` is ``*``) is UNRESTRICTED. When neither
day field starts with ``*``, a day matches if EITHER matches (``0 0 13 * FRI`` fires on every 13th
and on every Friday). When one of them starts with ``*``, a day must match BOTH: ``1 1 1-7 * */7``
(``*/7`` is Sunday) fires on the first Sunday of each month, and ``0 0 */2 * MON`` on Mondays that
fall on an odd day. A field that selects every value without starting with ``*`` (``0-6``,
``1-31``) is restricted: ``0 0 1 * 0-6`` fires every day. Until issue 26 a field counted as
restricted unless it was exactly ``*`` (as croniter does); migration 0015 rewrote stored tasks
whose meaning that changed, so that they keep firing as before (``*/2`` became ``1-31/2``).

Time zone and daylight saving time
----------------------------------
The expression is matched against the wall clock of the schedule's IANA time zone (default
``UTC``), to the second. A cron schedule's first fire time is the first fire time at or after
``start_at``. Where the zone's clock jumps, one of two rules applies, chosen by the HOUR field:

* Clock-following expressions -- the hour field is ``*`` or contains a step (``*``, ``*/2``,
  ``8-18/2``; ``@hourly`` is one) -- fire at every instant at which the wall clock shows a
  matching time. When the clock is set back, the repeated wall times fire again, at their
  second occurrence too, so an every-15-minutes job keeps firing every 15 real minutes through
  the repeated hour. Wall times that the clock skips when it is set forward never fire; the
  job carries on with the first matching time after the jump.
* Fixed-hour expressions -- any other hour field (``2``, ``1,13``, ``1-5``) -- fire ONCE for
  each matching wall time, at the first instant at which the wall clock shows that time or a
  later one. Hence a wall time that occurs twice (clock set back) fires only at its first
  occurrence, the earlier UTC instant (``fold=0``); a wall time that does not exist (clock set
  forward) fires once, at the first instant after the gap; and several skipped wall times of
  the same gap fire together, once.

Examples, 2026, Europe/Berlin (CET +01:00, CEST +02:00): ``30 2 * * *`` fires on 29 March at
03:00 CEST (01:00 UTC), as 02:30 does not exist; on 25 October only at the first 02:30 (CEST,
00:30 UTC), not again at 02:30 CET. ``*/15 * * * *`` fires at 01:45 CET (00:45 UTC) and next at
03:00 CEST (01:00 UTC) on 29 March, and on 25 October every 15 minutes from 00:00 to 01:45 UTC
(02:00-02:45 CEST, then 02:00-02:45 CET) without a pause.

The rule is the Vixie cron rule ("jobs specified with wildcards are run based on the new
time"; fixed-time jobs are neither skipped nor repeated), with "wildcard" decided by the hour
field. It holds for any zone and any size of jump (30-minute shifts as on Lord Howe Island,
whole skipped days as in Samoa in 2011). It assumes that a zone never changes its UTC offset
twice within :data:`_PROBE_STEP` (6 hours); the closest pair in the tz database since 1900 is
a week apart.
"""

from __future__ import annotations

import bisect
import calendar
import functools
import hashlib
import re
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from itertools import chain, islice, pairwise
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from tms_core.errors import InvalidInput

__all__ = [
    "CRON_BLANKS",
    "CRON_FIELDS_HELP",
    "CRON_HELP",
    "DST_FOLD_RULES",
    "DST_GAP_RULES",
    "MAX_WALK",
    "MAX_WALK_YEARS",
    "CronExpression",
    "MonthDays",
    "Schedule",
    "ScheduleError",
    "WalkTooLong",
    "dst_note",
    "dst_rules",
    "jitter_for",
    "parse_cron",
    "validate_cron",
    "validate_timezone",
    "walk_limit",
]


class ScheduleError(ValueError):
    """The schedule is invalid; the message is meant for the user."""


#: Furthest one walk over a cron schedule's fire times reaches past where it starts, in years.
#: A walk costs about 2 ms of CPU per year walked (more in a zone with daylight saving time),
#: so this bounds the work behind one preview, "why" or materialiser step.
MAX_WALK_YEARS = 100
MAX_WALK = timedelta(days=365 * MAX_WALK_YEARS + MAX_WALK_YEARS // 4)


class WalkTooLong(ScheduleError):
    """A walk over a cron schedule's fire times was asked to reach more than :data:`MAX_WALK_YEARS`
    past ``since``."""

    def __init__(self, since: datetime) -> None:
        self.since = since
        super().__init__(
            f"The fire times asked for reach more than {MAX_WALK_YEARS} years past {since.isoformat()}; "
            "a walk over a cron schedule stops there."
        )


@contextmanager
def walk_limit(field: str, what: str) -> Iterator[None]:
    """Answer a walk over a cron schedule that would reach too far (:class:`WalkTooLong`) as
    :class:`InvalidInput` on ``field``: ``what`` names what asked for it."""
    try:
        yield
    except WalkTooLong as exc:
        raise InvalidInput.on(
            field,
            f"{what} reach more than {MAX_WALK_YEARS} years past {exc.since.isoformat()}, "
            "further than a cron schedule is walked; ask for less.",
        ) from None


# --------------------------------------------------------------------------- time zones


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(available_timezones()) | {"UTC"}


def validate_timezone(name: str) -> ZoneInfo:
    """Return the IANA time zone ``name``, or raise :class:`ScheduleError`."""
    if not isinstance(name, str) or name not in _zone_names():
        raise ScheduleError(f'Unknown time zone {name!r}: use an IANA name such as "Europe/Berlin" or "UTC".')
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:  # pragma: no cover - guarded above
        raise ScheduleError(str(exc)) from None


# --------------------------------------------------------------------------- cron parsing

_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_WEEKDAY_NAMES = {name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_SHORTCUTS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: Longest month by number, counting 29 February (a leap year comes at least every 8 years).
_MONTH_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int  # highest value a number may have
    star_high: int  # where ``*`` and ``a/n`` stop (differs from ``high`` for weekdays: 7 is Sunday again)
    names: dict[str, int] | None = None


_SECOND = _Field("second", 0, 59, 59)
_MINUTE = _Field("minute", 0, 59, 59)
_HOUR = _Field("hour", 0, 23, 23)
_DAY = _Field("day-of-month", 1, 31, 31)
_MONTH = _Field("month", 1, 12, 12, _MONTH_NAMES)
_WEEKDAY = _Field("day-of-week", 0, 7, 6, _WEEKDAY_NAMES)
#: The six fields in the order they are written; five-field expressions leave out the first.
_FIELDS = (_SECOND, _MINUTE, _HOUR, _DAY, _MONTH, _WEEKDAY)


def _bad(expression: str, detail: str) -> ScheduleError:
    return ScheduleError(f"Invalid cron expression {expression!r}: {detail}")


def _is_number(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also takes superscripts (U+00B9, which ``int`` then refuses)
    and the digits of other scripts (U+0665, U+FF10, U+1D7D3, which ``int`` reads as numbers)."""
    return text.isascii() and text.isdigit()


def _value(expression: str, field: _Field, text: str) -> int:
    if _is_number(text):
        number = int(text)
    elif field.names and text.lower() in field.names:
        number = field.names[text.lower()]
    else:
        hint = ""
        if field.names:
            hint = " or a name such as " + ("JAN" if field is _MONTH else "MON")
        if "H" in text.upper() and not (field.names and text.lower() in field.names):
            hint += " (the H extension is not supported)"
        elif any(marker in text.upper() for marker in "LW#") and field not in (_DAY, _WEEKDAY):
            hint += f" (L, W and # are for the day fields only: {_EXTENSIONS_HELP})"
        raise _bad(expression, f"{text!r} in the {field.name} field is not a number{hint}.")
    if not field.low <= number <= field.high:
        raise _bad(expression, f"{field.name} {number} is out of range {field.low}-{field.high}.")
    return number


#: The Quartz extensions of each day field, said where a misuse is refused.
_DAY_HELP = "L (the last day), L-3 (3 days before it), 15W (the weekday nearest the 15th), LW (the last weekday)"
_WEEKDAY_HELP = "FRI#2 or 5#2 (the second Friday of the month), FRIL or 5L (the last Friday)"
_EXTENSIONS_HELP = f"day of month {_DAY_HELP}; day of week {_WEEKDAY_HELP}"
_NAME_WORDS = re.compile("|".join([*_MONTH_NAMES, *_WEEKDAY_NAMES]), re.IGNORECASE)
_LAST_OFFSET = re.compile(r"L(?:-(\d{1,2}))?", re.IGNORECASE)
_NEAREST = re.compile(r"(\d{1,2})W", re.IGNORECASE)
_NTH = re.compile(r"([A-Za-z]{3}|\d)#(\d+)")
_LAST_OF_MONTH = re.compile(r"([A-Za-z]{3}|\d)L", re.IGNORECASE)


@dataclass(frozen=True)
class MonthDays:
    """Day rules that depend on the month (Quartz's extensions), beside a day field's plain values.

    A day matches if any rule does; an empty one matches nothing."""

    #: Day of month: days before the month's last (``L`` is 0, ``L-3`` is 3).
    last_offsets: frozenset[int] = frozenset()
    #: Day of month ``nW``: the weekday nearest day n, never across the month's first or last day;
    #: a month without day n has none.
    nearest_weekdays: frozenset[int] = frozenset()
    #: Day of month ``LW``: the month's last weekday (Monday to Friday).
    last_weekday: bool = False
    #: Day of week ``d#n``: (weekday, n), the n-th such weekday of the month (0 = Sunday).
    nth_weekdays: frozenset[tuple[int, int]] = frozenset()
    #: Day of week ``dL``: the month's last such weekday.
    last_weekdays: frozenset[int] = frozenset()

    def __bool__(self) -> bool:
        return bool(
            self.last_offsets or self.nearest_weekdays or self.last_weekday or self.nth_weekdays or self.last_weekdays
        )

    def matches(self, day: date) -> bool:
        if not self:
            return False
        last = calendar.monthrange(day.year, day.month)[1]
        weekday = day.isoweekday() % 7
        return (
            (last - day.day) in self.last_offsets
            or (self.last_weekday and day.day == _weekday_near(day, last, last))
            or any(n <= last and day.day == _weekday_near(day, n, last) for n in self.nearest_weekdays)
            or (weekday, (day.day - 1) // 7 + 1) in self.nth_weekdays
            or (weekday in self.last_weekdays and day.day + 7 > last)
        )


def _weekday_near(day: date, n: int, last: int) -> int:
    """The day of ``day``'s month nearest to day ``n`` that is a weekday (Quartz's ``nW``): a
    Saturday moves to the Friday before, a Sunday to the Monday after, except across the month's
    edge (a Saturday the 1st moves to Monday the 3rd, a Sunday the last to the Friday before)."""
    weekday = day.replace(day=n).weekday()  # Monday 0 .. Sunday 6
    if weekday == 5:
        return n - 1 if n > 1 else n + 2
    if weekday == 6:
        return n + 1 if n < last else n - 2
    return n


def _extension_item(expression: str, field: _Field, item: str, found: dict[str, set[Any]]) -> bool:
    """Read ``item`` into ``found`` if it is one of the day fields' extensions; False if it is not one."""
    upper = item.upper()
    if field is _DAY:
        if upper == "LW":
            found["last_weekday"].add(True)
            return True
        if match := _LAST_OFFSET.fullmatch(item):
            offset = int(match.group(1) or 0)
            if offset > 30:
                raise _bad(expression, f"{item!r}: the n in L-n is 0 to 30 (a month has at most 31 days).")
            found["last_offsets"].add(offset)
            return True
        if match := _NEAREST.fullmatch(item):
            found["nearest_weekdays"].add(_value(expression, field, match.group(1)))
            return True
    elif field is _WEEKDAY:
        if upper == "L":
            raise _bad(
                expression,
                "L alone in the day-of-week field is refused: Quartz reads it as Saturday, other crons as nothing; "
                "write SAT, or FRIL for the last Friday of the month.",
            )
        if match := _NTH.fullmatch(item):
            weekday, nth = _value(expression, field, match.group(1)) % 7, int(match.group(2))
            if not 1 <= nth <= 5:
                raise _bad(expression, f"{item!r}: the n in #n is 1 to 5 (a month has at most 5 of each weekday).")
            found["nth_weekdays"].add((weekday, nth))
            return True
        if match := _LAST_OF_MONTH.fullmatch(item):
            found["last_weekdays"].add(_value(expression, field, match.group(1)) % 7)
            return True
    bare = _NAME_WORDS.sub("", item) if field.names else item  # WED and JUL are names, not W or L
    if any(marker in bare.upper() for marker in "LW#"):
        extensions = _DAY_HELP if field is _DAY else _WEEKDAY_HELP
        raise _bad(expression, f"{item!r} in the {field.name} field is neither a value nor one of {extensions}.")
    return False


def _parse_field(expression: str, field: _Field, text: str) -> tuple[frozenset[int], bool, MonthDays]:
    """Return the values a field allows, whether it is restricted (it does not start with ``*``;
    ``?`` is ``*``), and its month-dependent day rules (the day fields' extensions)."""
    if text == "?" and field in (_DAY, _WEEKDAY):
        text = "*"
    values: set[int] = set()
    found: dict[str, set[Any]] = {
        "last_offsets": set(),
        "nearest_weekdays": set(),
        "last_weekday": set(),
        "nth_weekdays": set(),
        "last_weekdays": set(),
    }
    items = text.split(",")
    for item in items:
        if field in (_DAY, _WEEKDAY) and _extension_item(expression, field, item, found):
            if len(items) > 1:
                # Quartz's rule, and what keeps the words exact: "1,L" would read "day 1 and L".
                raise _bad(
                    expression,
                    f"{item!r} stands alone in the {field.name} field, as in Quartz ({text!r} lists it with "
                    "other values): give each rule a task of its own.",
                )
            continue
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _is_number(step_text) or int(step_text) < 1:
                raise _bad(
                    expression, f"the step in {item!r} ({field.name} field) must be a whole number of at least 1."
                )
            step = int(step_text)
        if base == "*":
            first, last = field.low, field.star_high
        elif "-" in base:
            first_text, _, last_text = base.partition("-")
            first, last = _value(expression, field, first_text), _value(expression, field, last_text)
            if field is _WEEKDAY and last == 0 < first:
                last = 7  # SAT-SUN, 5-0: Sunday ends the week
            if first > last:
                raise _bad(
                    expression,
                    f"the range {base!r} in the {field.name} field runs backwards; "
                    f"write it as two ranges, for example {first_text}-{field.high},{field.low}-{last_text}.",
                )
        elif base:
            first = _value(expression, field, base)
            last = field.star_high if slash else first
        else:
            raise _bad(expression, f"the {field.name} field {text!r} has an empty item.")
        values.update(range(first, last + 1, step))
    if field is _WEEKDAY and 7 in values:
        values = (values - {7}) | {0}
    rules = MonthDays(
        last_offsets=frozenset(found["last_offsets"]),
        nearest_weekdays=frozenset(found["nearest_weekdays"]),
        last_weekday=bool(found["last_weekday"]),
        nth_weekdays=frozenset(found["nth_weekdays"]),
        last_weekdays=frozenset(found["last_weekdays"]),
    )
    if not values and not rules:
        raise _bad(expression, f"{text!r} selects no {field.name} value.")
    # Vixie cron/cronie: a field starting with "*" is unrestricted, even stepped ("*/7") or listed.
    return frozenset(values), not text.startswith("*"), rules


@dataclass(frozen=True)
class CronExpression:
    """A parsed cron expression: the values each field allows (see the module docstring).

    Weekdays count from 0 = Sunday. Use :func:`parse_cron` to build one.
    """

    expression: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    #: Neither day field starts with ``*``: a day matches if either matches (else if both do).
    day_or: bool
    #: The hour field is neither ``*`` nor stepped: the fixed-hour DST rule applies.
    fixed_hour: bool
    #: The fields as written (5, or 6 with seconds first), a shortcut such as ``@daily`` expanded.
    fields: tuple[str, ...] = ()
    #: The day-of-month field's month-dependent rules (``L``, ``L-3``, ``15W``, ``LW``).
    month_days: MonthDays = MonthDays()
    #: The day-of-week field's month-dependent rules (``FRI#2``, ``FRIL``).
    month_weekdays: MonthDays = MonthDays()

    def day_matches(self, day: date) -> bool:
        """Whether the expression fires on some time of ``day`` (month, day of month, weekday)."""
        if day.month not in self.months:
            return False
        by_date = day.day in self.days or self.month_days.matches(day)
        by_weekday = day.isoweekday() % 7 in self.weekdays or self.month_weekdays.matches(day)
        return (by_date or by_weekday) if self.day_or else (by_date and by_weekday)

    def matches(self, wall: datetime) -> bool:
        """Whether the naive wall-clock time ``wall`` matches (microseconds must be zero)."""
        return (
            wall.microsecond == 0
            and wall.second in self.seconds
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and self.day_matches(wall.date())
        )

    def walls(self, start: datetime, stop: datetime) -> Iterator[datetime]:
        """Yield the matching naive wall-clock times ``w`` with ``start <= w < stop``, in order."""
        day, last_day = start.date(), stop.date()
        while day <= last_day:
            if day.month not in self.months:
                day = (day.replace(day=1) + timedelta(days=32)).replace(day=1)
                continue
            if self.day_matches(day):
                for moment in self._times(start.time() if day == start.date() else None):
                    wall = datetime.combine(day, moment)
                    if wall >= stop:
                        return
                    if wall >= start:
                        yield wall
            day += timedelta(days=1)

    def _times(self, floor: time | None) -> Iterator[time]:
        """Matching times of day, in order, from ``floor``'s whole second on (all if None)."""
        # Without a floor, -1 matches no hour, minute or second: every time of day.
        floor_h, floor_m, floor_s = (-1, -1, -1) if floor is None else (floor.hour, floor.minute, floor.second)
        hours = self.hours if floor is None else self.hours[bisect.bisect_left(self.hours, floor_h) :]
        for hour in hours:
            same_hour = hour == floor_h
            minutes = self.minutes[bisect.bisect_left(self.minutes, floor_m) :] if same_hour else self.minutes
            for minute in minutes:
                same_minute = same_hour and minute == floor_m
                seconds = self.seconds[bisect.bisect_left(self.seconds, floor_s) :] if same_minute else self.seconds
                for second in seconds:
                    yield time(hour, minute, second)


#: What separates (and may surround) fields: ASCII spaces and tabs, as in crontab(5). ``str.split``
#: would also split on a no-break space and the other Unicode spaces.
CRON_BLANKS = _BLANKS = " \t"
_BLANK_RUN = re.compile(f"[{_BLANKS}]+")
#: The field order, said next to every place a cron expression is entered: a six-field expression
#: is read seconds FIRST, and croniter's are seconds last ("0 0 * * * 1" is hourly on Mondays
#: here, not second 1 of every midnight).
CRON_FIELDS_HELP = (
    "5 fields: minute hour day-of-month month day-of-week; "
    "or 6 with SECONDS FIRST: second minute hour day-of-month month day-of-week"
)
#: The API's help on a cron field.
CRON_HELP = (
    f'Cron expression, {CRON_FIELDS_HELP}. For example "*/5 * * * *" (every 5 minutes) or "30 0 9 * * MON-FRI" '
    "(09:00:30 on weekdays). Read on the wall clock of `timezone`; ASCII only. The response's `description` "
    "says it in words: check that it says what you meant."
)


def _check_characters(expression: str) -> None:
    """Raise :class:`ScheduleError` at the first character that is neither printable ASCII nor a tab.

    Digits, names and separators are ASCII only: anything else is named with its code point and
    the field it is in, rather than read as a number (U+0665 ARABIC-INDIC DIGIT FIVE), failed on
    (U+00B9 SUPERSCRIPT ONE: ``int`` refuses what ``isdigit`` accepted) or taken as a field
    separator (U+00A0 NO-BREAK SPACE).
    """
    for position, char in enumerate(expression):
        if " " <= char <= "~" or char == "\t":
            continue
        before = expression[:position].lstrip(_BLANKS)
        tokens = _BLANK_RUN.split(expression.strip(_BLANKS))
        index = len(_BLANK_RUN.split(before)) - 1 if before else 0
        fields = _FIELDS[1:] if len(tokens) == 5 else _FIELDS if len(tokens) == 6 else ()
        where = f"in the {fields[index].name} field" if index < len(fields) else f"at character {position + 1}"
        label = " ".join(filter(None, (f"U+{ord(char):04X}", unicodedata.name(char, ""))))
        raise _bad(
            expression,
            f"{char!r} ({label}) {where} is not allowed: a cron expression is written in "
            "ASCII (digits 0-9, names such as MON or JAN, and * , - / ?), its fields separated by spaces or tabs.",
        )


@functools.lru_cache(maxsize=512)
def parse_cron(expression: str) -> CronExpression:
    """Parse a 5- or 6-field cron expression (see the module docstring), or raise :class:`ScheduleError`."""
    if not isinstance(expression, str) or not expression.strip(_BLANKS):
        raise ScheduleError("A cron expression is required, for example '*/15 * * * *'.")
    _check_characters(expression)
    text = expression.strip(_BLANKS)
    if text.startswith("@"):
        if text.lower() not in _SHORTCUTS:
            raise ScheduleError(f"Unknown cron shortcut {text!r}: use one of {', '.join(_SHORTCUTS)}.")
        text = _SHORTCUTS[text.lower()]
    parts = _BLANK_RUN.split(text)
    if len(parts) not in (5, 6):
        raise ScheduleError(
            f"Invalid cron expression {expression!r}: a cron expression has 5 fields "
            f"(minute hour day-of-month month day-of-week), or 6 with seconds first; this one has {len(parts)}."
        )
    written = parts
    if len(parts) == 5:
        parts = ["0", *parts]
    parsed = [_parse_field(expression, field, part) for field, part in zip(_FIELDS, parts, strict=True)]
    (seconds, _, _), (minutes, _, _), (hours, _, _), (days, day_restricted, month_days), (months, _, _) = parsed[:5]
    weekdays, weekday_restricted, month_weekdays = parsed[5]
    cron = CronExpression(
        expression=expression,
        seconds=tuple(sorted(seconds)),
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=days,
        months=months,
        weekdays=weekdays,
        day_or=day_restricted and weekday_restricted,
        fixed_hour="*" not in parts[2] and "/" not in parts[2],
        fields=tuple(written),
        month_days=month_days,
        month_weekdays=month_weekdays,
    )
    if month_days or month_weekdays:
        # Whether some day ever matches: the calendar repeats every 400 years, and 28 years of
        # it hold every (leap) year and weekday of 1 January, which is all the day rules ask.
        if not any(cron.day_matches(day) for day in _CALENDAR_CYCLE):
            raise _bad(expression, "it never fires: no day of the chosen months matches the day fields.")
        return cron
    # Without a weekday to fall back on, some chosen month must have one of the chosen days.
    if not cron.day_or and not any(day <= _MONTH_DAYS[month] for month in months for day in days):
        month_names = ", ".join(date(2000, month, 1).strftime("%B") for month in sorted(months))
        day_numbers = ", ".join(str(day) for day in sorted(days))
        raise _bad(expression, f"it never fires: there is no day {day_numbers} in {month_names}.")
    return cron


#: Every day of 28 years that start with a leap year: each month begins on each weekday in both a
#: common and a leap year somewhere in them.
_CALENDAR_CYCLE = tuple(date(2000, 1, 1) + timedelta(days=n) for n in range((date(2028, 1, 1) - date(2000, 1, 1)).days))


def validate_cron(expression: str) -> None:
    """Raise :class:`ScheduleError` with a user-facing message unless ``expression`` is valid."""
    parse_cron(expression)


# --------------------------------------------------------------------------- cron fire times

#: Largest gap between two probes of a zone's UTC offset: it must be shorter than any stretch
#: between two offset changes (a week at least in the tz database since 1900).
_PROBE_STEP = timedelta(hours=6)
#: How far before ``since`` the wall clock is replayed, to know which wall times were already
#: shown: longer than any clock set-back in the tz database (23 hours, Kwajalein 1969).
_LOOKBACK = timedelta(days=3)
#: Fire times stop here rather than overflow :class:`datetime`.
_LAST_INSTANT = datetime(9998, 1, 1, tzinfo=UTC)
#: The search gives up after this long without a fire time. A valid expression fires at least
#: every 40 years: both day fields must match when one starts with ``*``, and 29 February falls on
#: a given weekday at most 40 years apart (``0 0 29 2 */7``: Sundays 2004, 2032, 2060, 2088, 2128).
#: Validation rejects expressions that never fire, so this only bounds the work if that ever failed.
_LONGEST_SILENCE = timedelta(days=366 * 41)


def _offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    return instant.astimezone(zone).utcoffset() or timedelta(0)


def _next_change(zone: ZoneInfo, before: datetime, after: datetime, offset: timedelta) -> datetime:
    """The first instant in ``(before, after]`` whose offset is not ``offset`` (``after``'s is not)."""
    while after - before > timedelta(microseconds=1):
        middle = before + (after - before) // 2
        if _offset(zone, middle) == offset:
            before = middle
        else:
            after = middle
    return after


#: Zone offsets are looked up per stretch of this length since the epoch, each worked out once
#: per process (a materialiser pass plans many tasks in the same few zones and weeks).
_BUCKET = timedelta(days=28)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@functools.lru_cache(maxsize=4096)
def _bucket_offsets(zone: ZoneInfo, bucket: int) -> tuple[tuple[datetime, timedelta], ...]:
    """``(instant, offset)`` pairs for the bucket: its start with the offset there, then each
    change of offset inside it."""
    begin = _EPOCH + bucket * _BUCKET
    limit = begin + _BUCKET
    offset = _offset(zone, begin)
    points = [(begin, offset)]
    probe = begin
    while probe < limit:
        following = min(probe + _PROBE_STEP, limit)
        if _offset(zone, following) != offset:
            change = _next_change(zone, probe, following, offset)
            if change >= limit:  # exactly at the boundary: the next bucket starts with it
                break
            offset = _offset(zone, change)
            points.append((change, offset))
            probe = change
        else:
            probe = following
    return tuple(points)


def _segments(zone: ZoneInfo, start: datetime) -> Iterator[tuple[datetime, datetime, timedelta]]:
    """Yield ``(begin, end, offset)``: consecutive UTC stretches from ``start`` with a constant
    offset (a stretch may be cut in two at a bucket boundary; both halves share the offset)."""
    bucket = (start - _EPOCH) // _BUCKET
    begin = start
    while begin < _LAST_INSTANT:
        points = _bucket_offsets(zone, bucket)
        bucket_end = _EPOCH + (bucket + 1) * _BUCKET
        for index, (at, offset) in enumerate(points):
            end = points[index + 1][0] if index + 1 < len(points) else bucket_end
            if end > begin:
                yield max(at, begin), end, offset
        begin = bucket_end
        bucket += 1


#: A task's choice for wall times the clock skips when it is set forward: ``shift`` (they fire
#: once, right after the gap) or ``skip`` (they do not fire).
DST_GAP_RULES = ("shift", "skip")
#: A task's choice for wall times the clock shows twice when it is set back: at their ``first``
#: occurrence, their ``second``, or ``both``.
DST_FOLD_RULES = ("first", "second", "both")


def dst_rules(cron: CronExpression, gap: str = "", fold: str = "") -> tuple[str, str]:
    """The DST rules that apply: the task's own, else the hour field's (see the module docstring):
    ``shift``/``first`` for a fixed-hour expression, ``skip``/``both`` for a clock-following one."""
    if gap and gap not in DST_GAP_RULES:
        raise ScheduleError(f"dst_gap must be one of {', '.join(DST_GAP_RULES)} (or empty: by the hour field).")
    if fold and fold not in DST_FOLD_RULES:
        raise ScheduleError(f"dst_fold must be one of {', '.join(DST_FOLD_RULES)} (or empty: by the hour field).")
    return gap or ("shift" if cron.fixed_hour else "skip"), fold or ("first" if cron.fixed_hour else "both")


def _cron_times(
    cron: CronExpression, zone: ZoneInfo, since: datetime, *, gap: str = "", fold: str = ""
) -> Iterator[datetime]:
    """Fire times of ``cron`` in ``zone`` at or after ``since``, by the DST rules ``gap`` and
    ``fold`` (:func:`dst_rules`; empty: the hour field's rule of the module docstring).

    The UTC timeline is cut into stretches of constant offset. In each, the wall clock runs
    from ``low`` to ``high`` (``high`` excluded) and maps back to UTC by subtracting the offset.
    ``shown`` is the wall time up to which the clock has already been: a stretch that starts
    above it follows a gap (the clock was set forward), one that starts below it repeats wall
    times (the clock was set back). The stretch after the current one is looked at too: a
    ``second`` rule leaves the wall times it will repeat to it.
    """
    gap, fold = dst_rules(cron, gap, fold)
    since = since.astimezone(UTC)
    shown: datetime | None = None
    last: datetime | None = None
    segments = _segments(zone, since - _LOOKBACK)
    current = next(segments, None)
    while current is not None:
        following = next(segments, None)
        begin, end, offset = current
        current = following
        if begin - (last or since) > _LONGEST_SILENCE:
            return
        low = (begin + offset).replace(tzinfo=None)
        high = (end + offset).replace(tzinfo=None)
        if shown is None:
            shown = low
        if end > since:
            gap_fire: list[datetime] = []
            if gap == "shift" and low > shown and begin >= since and next(cron.walls(shown, low), None):
                gap_fire.append(begin)  # the wall times the gap skipped fire once, at its end
            first = max(low, (since + offset).replace(tzinfo=None))
            if fold == "first":
                first = max(first, shown)  # a repeated wall time does not fire again
            stop = high
            if fold == "second" and following is not None:
                # The clock is set back at this stretch's end: what it shows again from there
                # fires in the next stretch, not here.
                stop = min(high, max(first, (following[0] + following[2]).replace(tzinfo=None)))
            walls = ((wall - offset).replace(tzinfo=UTC) for wall in cron.walls(first, stop))
            for when in chain(gap_fire, walls):
                if last is None or when > last:
                    last = when
                    yield when
        shown = max(shown, high)


def dst_note(cron: str, timezone: str, when: datetime, *, gap: str = "", fold: str = "") -> str:
    """Which DST rule decided the fire time ``when`` of ``cron`` in ``timezone``, in words; empty
    when the clock was not being changed around it. For previews and "why" (issue 32)."""
    parsed = parse_cron(cron)
    gap, fold = dst_rules(parsed, gap, fold)
    zone = ZoneInfo(timezone)
    when = when.astimezone(UTC)
    wall = when.astimezone(zone)
    just_before = (when - timedelta(microseconds=1)).astimezone(zone)
    before_offset, offset = just_before.utcoffset(), wall.utcoffset()
    if before_offset is not None and offset is not None and before_offset < offset:
        skipped_from = (when + before_offset).replace(tzinfo=None)
        skipped_to = wall.replace(tzinfo=None)
        skipped = list(islice(parsed.walls(skipped_from, skipped_to), 3))
        if skipped:
            times = ", ".join(f"{moment:%H:%M:%S}" for moment in skipped) + (" ..." if len(skipped) == 3 else "")
            return (
                f"dst_gap={gap}: the clock skipped {skipped_from:%H:%M}-{skipped_to:%H:%M} on {skipped_to:%Y-%m-%d}; "
                f"the skipped {times} fired once here, when the clock showed {skipped_to:%H:%M}"
            )
    naive = wall.replace(tzinfo=None)
    earlier, later = naive.replace(fold=0, tzinfo=zone), naive.replace(fold=1, tzinfo=zone)
    if earlier.utcoffset() != later.utcoffset():
        which = "second" if wall.fold else "first"
        others = {"first": "not at its second", "second": "not at its first", "both": "and at its other one too"}
        return (
            f"dst_fold={fold}: {naive:%H:%M:%S} occurs twice on {naive:%Y-%m-%d} (the clock is set back); this is its "
            f"{which} occurrence ({wall.tzname()}), {others[fold]}"
        )
    return ""


#: The longest stretch between two fire times searched for a skipped DST gap (a yearly cron's).
_GAP_SEARCH = timedelta(days=800)


def dst_gap_skipped_note(
    cron: str, timezone: str, after: datetime, before: datetime, *, gap: str = "", fold: str = ""
) -> str:
    """Under ``dst_gap`` skip, the wall times of ``cron`` that a spring-forward gap between the
    fire times ``after`` and ``before`` swallowed, in words (empty: none, or another rule).

    A preview lists fire times: a day whose only fire time fell in the gap simply has none, and
    nothing said why (issue 44). The note goes on the fire time after the gap."""
    parsed = parse_cron(cron)
    if dst_rules(parsed, gap, fold)[0] != "skip" or not after < before or before - after > _GAP_SEARCH:
        return ""
    zone = ZoneInfo(timezone)
    notes = []
    cursor, offset = after, after.astimezone(zone).utcoffset()
    while cursor < before and offset is not None:
        step = min(cursor + timedelta(days=1), before)
        later = step.astimezone(zone).utcoffset()
        if later is not None and later > offset:
            low, high = cursor, step  # the change lies in (low, high]: narrowed to the second
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) / 2
                low, high = (
                    (low, middle) if (middle.astimezone(zone).utcoffset() or offset) > offset else (middle, high)
                )
            change = high.replace(microsecond=0)
            skipped_from, skipped_to = (change + offset).replace(tzinfo=None), (change + later).replace(tzinfo=None)
            walls = list(islice(parsed.walls(skipped_from, skipped_to), 3))
            if walls:
                times = ", ".join(f"{wall:%H:%M:%S}" for wall in walls) + (" ..." if len(walls) == 3 else "")
                notes.append(
                    f"dst_gap=skip: the clock skipped {skipped_from:%H:%M}-{skipped_to:%H:%M} on "
                    f"{skipped_to:%Y-%m-%d}; {times} did not fire that day"
                )
        if later is not None:
            offset = later
        cursor = step
    return "; ".join(notes)


# --------------------------------------------------------------------------- schedules


@dataclass(frozen=True)
class Schedule:
    """When a task fires: at ``start_at`` once, every ``interval``, or on ``cron`` in ``timezone``.

    ``end_at`` (inclusive) bounds recurring schedules. Construction validates everything and
    raises :class:`ScheduleError` with a user-facing message.
    """

    start_at: datetime
    interval: timedelta | None = None
    cron: str = ""
    timezone: str = "UTC"
    end_at: datetime | None = None
    #: DST rules (:func:`dst_rules`); empty: by the cron expression's hour field.
    dst_gap: str = ""
    dst_fold: str = ""

    def __post_init__(self) -> None:
        if self.start_at.tzinfo is None or self.start_at.utcoffset() is None:
            raise ScheduleError("start_at must carry a time zone offset.")
        if self.end_at is not None and (self.end_at.tzinfo is None or self.end_at.utcoffset() is None):
            raise ScheduleError("end_at must carry a time zone offset.")
        if self.interval is not None and self.cron:
            raise ScheduleError("Give an interval or a cron expression, not both.")
        if self.interval is not None and self.interval <= timedelta(0):
            raise ScheduleError("The interval must be positive.")
        if self.cron:
            dst_rules(parse_cron(self.cron), self.dst_gap, self.dst_fold)
        elif self.dst_gap or self.dst_fold:
            raise ScheduleError("dst_gap and dst_fold apply to cron schedules only (an interval is real elapsed time).")
        validate_timezone(self.timezone)
        if self.end_at is not None and self.end_at.astimezone(UTC) < self.start_at.astimezone(UTC):
            raise ScheduleError("end_at must not be before start_at.")

    @property
    def recurring(self) -> bool:
        """Whether the schedule fires more than once (an interval or a cron expression)."""
        return self.interval is not None or bool(self.cron)

    def fire_times(self, since: datetime | None = None) -> Iterator[datetime]:
        """Yield the fire times at or after ``since`` and ``start_at``, up to ``end_at`` inclusive.

        Times are aware UTC datetimes in strictly increasing order. A recurring schedule without
        ``end_at`` yields without end: take what you need (``itertools.islice``, :meth:`preview`).
        A cron schedule raises :class:`WalkTooLong` instead of yielding a fire time more than
        :data:`MAX_WALK_YEARS` after ``since`` (see the module docstring).
        """
        if since is not None and (since.tzinfo is None or since.utcoffset() is None):
            raise ValueError("since must be an aware datetime.")
        # Work in UTC: Python compares and subtracts two datetimes that share a tzinfo by their
        # wall clocks, which is wrong across a DST change.
        start = self.start_at.astimezone(UTC)
        end = None if self.end_at is None else self.end_at.astimezone(UTC)
        since = start if since is None else max(since.astimezone(UTC), start)
        # A cron walk meets a fire time at least every 41 years (or gives up), so checking each
        # one it yields bounds the span walked to the limit plus that.
        limit = since + MAX_WALK if self.cron and since < _LAST_INSTANT - MAX_WALK else None
        for when in self._unbounded(start, since):
            if end is not None and when > end:
                return
            if limit is not None and when > limit:
                raise WalkTooLong(since)
            yield when

    def preview(self, n: int, since: datetime | None = None) -> list[datetime]:
        """The first ``n`` fire times of :meth:`fire_times` (fewer if the schedule ends)."""
        return list(islice(self.fire_times(since), max(n, 0)))

    def _unbounded(self, start: datetime, since: datetime) -> Iterator[datetime]:
        """Fire times at or after ``since`` (both arguments in UTC), without the ``end_at`` bound."""
        if self.cron:
            cron = parse_cron(self.cron)
            yield from _cron_times(cron, ZoneInfo(self.timezone), since, gap=self.dst_gap, fold=self.dst_fold)
        elif self.interval is not None:
            # Fire times stay on the start_at grid, so a late pass never drifts the schedule.
            # Integer division: a float quotient can round down and yield a time before `since`.
            steps = max(0, -((start - since) // self.interval))
            while True:
                try:
                    when = start + steps * self.interval
                except OverflowError:
                    return
                yield when
                steps += 1
        elif since <= start:
            yield start


def wall_time_to_utc(local: datetime, timezone: str) -> datetime:
    """The instant a wall-clock time (no offset) names in ``timezone``, in UTC.

    A time the clock skips (the hour lost when it is set forward) names no instant: ScheduleError.
    A time the clock shows twice (the hour repeated when it is set back) is read as its first
    occurrence (``fold=0``, the earlier instant, still on the summer offset).
    """
    zone = validate_timezone(timezone)
    naive = local.replace(tzinfo=None)
    aware = naive.replace(tzinfo=zone, fold=0)
    instant = aware.astimezone(UTC)
    if instant.astimezone(zone).replace(tzinfo=None) != naive:
        raise ScheduleError(
            f"{naive.isoformat()} does not exist in {timezone} (the clock skips it when it is set forward); "
            "give another time or a UTC offset."
        )
    return instant


def jitter_for(*, key: str, max_jitter: timedelta) -> timedelta:
    """A delay in ``[0, max_jitter]`` that depends only on ``key``, to spread tasks that share a time.

    Deterministic, so that materialising the same occurrence twice (or in two processes) gives
    the same due time: use a key such as ``f"{task.id}:{scheduled_for.isoformat()}"``.
    """
    span = max_jitter // timedelta(microseconds=1)
    if span <= 0:
        return timedelta(0)
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return timedelta(microseconds=int.from_bytes(digest, "big") % (span + 1))


def shortest_gap(schedule: Schedule) -> timedelta | None:
    """The shortest time between two fire times the schedule can have (None for a one-shot).

    For an interval, the interval. For a cron expression, read from the expression rather than
    from a walk (a walk from today may miss a dense burst months away): the smallest step between
    two consecutive times of day it selects, and from the last time of a day to the first of the
    next, as if every day matched. That is exact for ``* * * * *`` (60 s), ``*/5 * * * *``
    (300 s) and any expression firing daily, and errs short (stricter) when the day fields skip
    days. The clock changes of a zone can only lengthen these gaps (skipped wall times do not
    fire; repeated ones repeat the same steps).
    """
    if schedule.interval is not None:
        return schedule.interval
    if not schedule.cron:
        return None
    cron = parse_cron(schedule.cron)
    times = [(h * 60 + m) * 60 + s for h in cron.hours for m in cron.minutes for s in cron.seconds]  # sorted
    gap = 86400 - times[-1] + times[0]
    for earlier, later in pairwise(times):
        gap = min(gap, later - earlier)
    return timedelta(seconds=gap)
