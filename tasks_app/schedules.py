"""When a task fires: one-shot, fixed interval, or cron in an IANA time zone.

:class:`Schedule` is a pure value (no database); :meth:`Schedule.fire_times` yields the fire
times, as aware UTC datetimes, in order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter


class ScheduleError(ValueError):
    """The schedule is invalid; the message is meant for the user."""


def validate_timezone(name: str) -> ZoneInfo:
    if name not in _zone_names():
        raise ScheduleError(f"Unknown time zone {name!r}: use an IANA name such as \"Europe/Berlin\".")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:  # pragma: no cover - guarded above
        raise ScheduleError(str(exc)) from None


_ZONES: frozenset[str] | None = None


def _zone_names() -> frozenset[str]:
    global _ZONES
    if _ZONES is None:
        _ZONES = frozenset(available_timezones()) | {"UTC"}
    return _ZONES


def validate_cron(expression: str) -> None:
    fields = expression.split()
    if len(fields) not in (5, 6):
        raise ScheduleError("A cron expression has 5 fields (minute hour day month weekday), or 6 with seconds.")
    if not croniter.is_valid(expression, second_at_beginning=len(fields) == 6):
        raise ScheduleError(f"Invalid cron expression {expression!r}.")


@dataclass(frozen=True)
class Schedule:
    start_at: datetime
    interval: timedelta | None = None
    cron: str = ""
    timezone: str = "UTC"
    end_at: datetime | None = None

    def __post_init__(self) -> None:
        if self.start_at.tzinfo is None:
            raise ScheduleError("start_at must carry a time zone offset.")
        if self.interval is not None and self.cron:
            raise ScheduleError("Give an interval or a cron expression, not both.")
        if self.interval is not None and self.interval <= timedelta(0):
            raise ScheduleError("The interval must be positive.")
        if self.cron:
            validate_cron(self.cron)
        validate_timezone(self.timezone)
        if self.end_at is not None and self.end_at < self.start_at:
            raise ScheduleError("end_at must not be before start_at.")

    @property
    def recurring(self) -> bool:
        return self.interval is not None or bool(self.cron)

    def fire_times(self, since: datetime | None = None) -> Iterator[datetime]:
        """Yield fire times at or after ``since`` (default: ``start_at``), up to ``end_at``."""
        since = max(since or self.start_at, self.start_at)
        for when in self._unbounded(since):
            if self.end_at is not None and when > self.end_at:
                return
            yield when

    def _unbounded(self, since: datetime) -> Iterator[datetime]:
        if self.cron:
            yield from self._cron_times(since)
        elif self.interval is not None:
            # Fire times stay on the start_at grid, so a late pass never drifts the schedule.
            steps = max(0, math.ceil((since - self.start_at) / self.interval))
            while True:
                yield (self.start_at + steps * self.interval).astimezone(UTC)
                steps += 1
        elif since <= self.start_at:
            yield self.start_at.astimezone(UTC)

    def _cron_times(self, since: datetime) -> Iterator[datetime]:
        zone = ZoneInfo(self.timezone)
        with_seconds = len(self.cron.split()) == 6
        # croniter yields strictly after its start, so start just before `since`.
        start = since.astimezone(zone) - timedelta(microseconds=1)
        iterator = croniter(self.cron, start, ret_type=datetime, second_at_beginning=with_seconds)
        previous: datetime | None = None
        while True:
            when = iterator.get_next(datetime).astimezone(UTC)
            if previous is not None and when <= previous:
                continue
            previous = when
            yield when
