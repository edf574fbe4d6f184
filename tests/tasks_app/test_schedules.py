"""Schedules: cron syntax, the DST rule of ``tasks_app.schedules``, intervals, validation.

Pure functions: no database. The property tests compare the module with a brute-force
reference written here independently: it steps through every UTC minute (or second), reads
the local wall clock with ``astimezone`` and matches the fields with its own little parser.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice, pairwise, takewhile
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tasks_app.schedules import (
    Schedule,
    ScheduleError,
    jitter_for,
    parse_cron,
    validate_cron,
    validate_timezone,
)
from tasks_app.schedules import _cron_times as _cron_times  # the bounded search is private


def utc(text: str) -> datetime:
    """``"2026-03-29T01:00"`` (or with seconds) as an aware UTC datetime."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def cron_preview(expression: str, zone: str, start: str, count: int) -> list[datetime]:
    return Schedule(start_at=utc(start), cron=expression, timezone=zone).preview(count)


# --------------------------------------------------------------------------- written-out DST cases
#
# 2026 transitions used below (all instants UTC):
#   Europe/Berlin        03-29 01:00  02:00 CET -> 03:00 CEST (gap 02:00-02:59)
#                        10-25 01:00  03:00 CEST -> 02:00 CET (02:00-02:59 twice)
#   America/New_York     03-08 07:00  02:00 EST -> 03:00 EDT (gap 02:00-02:59)
#                        11-01 06:00  02:00 EDT -> 01:00 EST (01:00-01:59 twice)
#   Australia/Lord_Howe  04-04 15:00  02:00 +11 -> 01:30 +10:30 (01:30-01:59 twice)
#                        10-03 15:30  02:00 +10:30 -> 02:30 +11 (gap 02:00-02:29)

DST_CASES = [
    # --- Europe/Berlin, fixed-hour jobs
    pytest.param(
        "30 2 * * *",
        "Europe/Berlin",
        "2026-03-28T00:00",
        ["2026-03-28T01:30", "2026-03-29T01:00", "2026-03-30T00:30"],
        id="berlin-daily-in-gap-fires-at-gap-end",
    ),
    pytest.param(
        "30 2 * * *",
        "Europe/Berlin",
        "2026-10-24T00:00",
        ["2026-10-24T00:30", "2026-10-25T00:30", "2026-10-26T01:30"],
        id="berlin-daily-in-fold-fires-once-first-occurrence",
    ),
    pytest.param(
        "*/15 2 * * *",
        "Europe/Berlin",
        "2026-03-29T00:00",
        ["2026-03-29T01:00", "2026-03-30T00:00", "2026-03-30T00:15"],
        id="berlin-fixed-hour-times-in-gap-collapse-to-one",
    ),
    pytest.param(
        "*/15 2 * * *",
        "Europe/Berlin",
        "2026-10-25T00:00",
        ["2026-10-25T00:00", "2026-10-25T00:15", "2026-10-25T00:30", "2026-10-25T00:45", "2026-10-26T01:00"],
        id="berlin-fixed-hour-repeated-hour-not-repeated",
    ),
    # --- Europe/Berlin, clock-following jobs
    pytest.param(
        "0 * * * *",
        "Europe/Berlin",
        "2026-03-28T22:30",
        ["2026-03-28T23:00", "2026-03-29T00:00", "2026-03-29T01:00", "2026-03-29T02:00"],
        id="berlin-hourly-spring-forward",
    ),
    pytest.param(
        "0 * * * *",
        "Europe/Berlin",
        "2026-10-24T22:30",
        ["2026-10-24T23:00", "2026-10-25T00:00", "2026-10-25T01:00", "2026-10-25T02:00"],
        id="berlin-hourly-fall-back-both-passes",
    ),
    pytest.param(
        "30 * * * *",
        "Europe/Berlin",
        "2026-03-29T00:00",
        ["2026-03-29T00:30", "2026-03-29T01:30", "2026-03-29T02:30"],
        id="berlin-hourly-at-30-skips-missing-0230",
    ),
    pytest.param(
        "*/15 * * * *",
        "Europe/Berlin",
        "2026-03-29T00:20",
        ["2026-03-29T00:30", "2026-03-29T00:45", "2026-03-29T01:00", "2026-03-29T01:15"],
        id="berlin-15min-spring-forward",
    ),
    pytest.param(
        "*/15 * * * *",
        "Europe/Berlin",
        "2026-10-24T23:40",
        [
            "2026-10-24T23:45",
            "2026-10-25T00:00",
            "2026-10-25T00:15",
            "2026-10-25T00:30",
            "2026-10-25T00:45",
            "2026-10-25T01:00",
            "2026-10-25T01:15",
            "2026-10-25T01:30",
            "2026-10-25T01:45",
            "2026-10-25T02:00",
        ],
        id="berlin-15min-fall-back-no-pause",
    ),
    # --- America/New_York
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T00:00",
        ["2026-03-07T07:30", "2026-03-08T07:00", "2026-03-09T06:30"],
        id="new-york-daily-in-gap",
    ),
    pytest.param(
        "0 2 * * *",
        "America/New_York",
        "2026-03-08T00:00",
        ["2026-03-08T07:00", "2026-03-09T06:00"],
        id="new-york-daily-at-gap-start",
    ),
    pytest.param(
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T00:00",
        ["2026-10-31T05:30", "2026-11-01T05:30", "2026-11-02T06:30"],
        id="new-york-daily-in-fold",
    ),
    pytest.param(
        "0 * * * *",
        "America/New_York",
        "2026-11-01T03:30",
        ["2026-11-01T04:00", "2026-11-01T05:00", "2026-11-01T06:00", "2026-11-01T07:00"],
        id="new-york-hourly-fall-back",
    ),
    pytest.param(
        "*/15 * * * *",
        "America/New_York",
        "2026-03-08T06:40",
        ["2026-03-08T06:45", "2026-03-08T07:00", "2026-03-08T07:15"],
        id="new-york-15min-spring-forward",
    ),
    pytest.param(
        "*/15 * * * *",
        "America/New_York",
        "2026-11-01T05:40",
        ["2026-11-01T05:45", "2026-11-01T06:00", "2026-11-01T06:15"],
        id="new-york-15min-fall-back",
    ),
    # --- Australia/Lord_Howe (30-minute shifts)
    pytest.param(
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T00:00",
        ["2026-04-03T14:45", "2026-04-04T14:45", "2026-04-05T15:15"],
        id="lord-howe-daily-in-fold",
    ),
    pytest.param(
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-02T00:00",
        ["2026-10-02T15:45", "2026-10-03T15:30", "2026-10-04T15:15"],
        id="lord-howe-daily-in-gap",
    ),
    pytest.param(
        "0 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T00:00",
        ["2026-10-03T15:30", "2026-10-04T15:00"],
        id="lord-howe-daily-at-gap-start",
    ),
    pytest.param(
        "*/15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T15:00",
        ["2026-10-03T15:30", "2026-10-03T15:45", "2026-10-04T15:00"],
        id="lord-howe-fixed-hour-gap-collapses-into-0230",
    ),
    pytest.param(
        "*/15 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T13:00",
        ["2026-04-04T14:00", "2026-04-04T14:15", "2026-04-04T14:30", "2026-04-04T14:45", "2026-04-05T14:30"],
        id="lord-howe-fixed-hour-half-hour-fold-not-repeated",
    ),
    pytest.param(
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-04-04T14:10",
        [
            "2026-04-04T14:15",
            "2026-04-04T14:30",
            "2026-04-04T14:45",
            "2026-04-04T15:00",
            "2026-04-04T15:15",
            "2026-04-04T15:30",
        ],
        id="lord-howe-15min-fall-back-both-passes",
    ),
    pytest.param(
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2026-10-03T15:00",
        ["2026-10-03T15:00", "2026-10-03T15:15", "2026-10-03T15:30", "2026-10-03T15:45"],
        id="lord-howe-15min-spring-forward",
    ),
    pytest.param(
        "0 * * * *",
        "Australia/Lord_Howe",
        "2026-10-03T13:00",
        ["2026-10-03T13:30", "2026-10-03T14:30", "2026-10-03T16:00", "2026-10-03T17:00"],
        id="lord-howe-hourly-spring-forward-skips-0200",
    ),
    pytest.param(
        "0 * * * *",
        "Australia/Lord_Howe",
        "2026-04-04T12:30",
        ["2026-04-04T13:00", "2026-04-04T14:00", "2026-04-04T15:30", "2026-04-04T16:30"],
        id="lord-howe-hourly-fall-back",
    ),
    # --- six fields, seconds first
    pytest.param(
        "*/20 * * * * *",
        "Europe/Berlin",
        "2026-03-29T00:59:30",
        ["2026-03-29T00:59:40", "2026-03-29T01:00:00", "2026-03-29T01:00:20"],
        id="seconds-every-20s-spring-forward",
    ),
    pytest.param(
        "0 30 2 * * *",
        "Europe/Berlin",
        "2026-03-28T12:00",
        ["2026-03-29T01:00:00", "2026-03-30T00:30:00"],
        id="seconds-daily-in-gap",
    ),
    pytest.param(
        "*/30 * 2 * * *",
        "Europe/Berlin",
        "2026-10-25T00:59:00",
        ["2026-10-25T00:59:00", "2026-10-25T00:59:30", "2026-10-26T01:00:00"],
        id="seconds-fixed-hour-fold-not-repeated",
    ),
]


@pytest.mark.parametrize(("expression", "zone", "start", "expected"), DST_CASES)
def test_cron_fire_times_across_dst_transitions(expression, zone, start, expected):
    assert cron_preview(expression, zone, start, len(expected)) == [utc(text) for text in expected]


@pytest.mark.parametrize(
    ("expression", "start", "expected"),
    [
        # Resuming after the first 02:30 (CEST) must not fire 02:30 again at its CET occurrence.
        pytest.param("30 2 * * *", "2026-10-25T00:40", "2026-10-26T01:30", id="fixed-after-first-occurrence"),
        pytest.param("30 2 * * *", "2026-10-25T01:10", "2026-10-26T01:30", id="fixed-inside-second-pass"),
        pytest.param("*/15 * * * *", "2026-10-25T01:10", "2026-10-25T01:15", id="clock-following-inside-second-pass"),
        pytest.param("30 2 * * *", "2026-03-29T01:00", "2026-03-29T01:00", id="fixed-gap-fire-is-inclusive"),
        pytest.param("30 2 * * *", "2026-03-29T01:00:01", "2026-03-30T00:30", id="fixed-gap-fire-already-past"),
    ],
)
def test_cron_first_fire_is_first_instant_at_or_after_start(expression, start, expected):
    assert cron_preview(expression, "Europe/Berlin", start, 1) == [utc(expected)]


def test_whole_skipped_day_fires_fixed_jobs_once_after_it():
    # Samoa skipped 30 December 2011: 29 Dec 23:59:59 -10:00 was followed by 31 Dec 00:00 +14:00.
    times = cron_preview("0 12 * * *", "Pacific/Apia", "2011-12-29T00:00", 3)
    assert times == [utc("2011-12-29T22:00"), utc("2011-12-30T10:00"), utc("2011-12-30T22:00")]
    assert cron_preview("0 * * * *", "Pacific/Apia", "2011-12-30T09:30", 2) == [
        utc("2011-12-30T10:00"),
        utc("2011-12-30T11:00"),
    ]


def test_cron_defaults_to_utc_and_fire_times_are_utc():
    schedule = Schedule(start_at=datetime(2026, 1, 1, 9, 0, tzinfo=ZoneInfo("Asia/Kolkata")), cron="0 4 * * *")
    times = schedule.preview(2)
    assert times == [utc("2026-01-01T04:00"), utc("2026-01-02T04:00")]
    assert all(when.tzinfo is UTC for when in times)


def test_fire_times_since_is_inclusive_and_never_before_start():
    schedule = Schedule(start_at=utc("2026-05-01T00:00"), cron="0 * * * *")
    assert schedule.preview(1, since=utc("2026-05-02T03:00")) == [utc("2026-05-02T03:00")]
    assert schedule.preview(1, since=utc("2026-05-02T03:00:00.000001")) == [utc("2026-05-02T04:00")]
    assert schedule.preview(1, since=utc("2020-01-01T00:00")) == [utc("2026-05-01T00:00")]


def test_fire_times_stop_after_end_at_inclusive():
    schedule = Schedule(start_at=utc("2026-05-01T00:00"), cron="0 */6 * * *", end_at=utc("2026-05-01T18:00"))
    assert list(schedule.fire_times()) == [utc(f"2026-05-01T{hour:02}:00") for hour in (0, 6, 12, 18)]


def test_leap_day_expression_finds_the_next_leap_year():
    # 2100 is not a leap year: the search has to cross eight years.
    assert cron_preview("0 0 29 2 *", "UTC", "2097-01-01T00:00", 2) == [
        utc("2104-02-29T00:00"),
        utc("2108-02-29T00:00"),
    ]


def test_naive_since_is_rejected():
    schedule = Schedule(start_at=utc("2026-01-01T00:00"), cron="* * * * *")
    with pytest.raises(ValueError, match="aware"):
        schedule.preview(1, since=datetime(2026, 1, 1))


# --------------------------------------------------------------------------- cron syntax


@pytest.mark.parametrize(
    ("expression", "start", "expected"),
    [
        ("5-5 * * * *", "2026-01-01T00:00", ["2026-01-01T00:05", "2026-01-01T01:05"]),  # croniter reads this as *
        ("0 0 * * 1-1", "2026-01-01T00:00", ["2026-01-05T00:00", "2026-01-12T00:00"]),  # Mondays (croniter: daily)
        ("10/20 * * * *", "2026-01-01T00:00", ["2026-01-01T00:10", "2026-01-01T00:30", "2026-01-01T00:50"]),
        ("0 0 * * 7", "2026-01-01T00:00", ["2026-01-04T00:00", "2026-01-11T00:00"]),  # 7 is Sunday
        ("0 0 * * sat-sun", "2026-01-01T00:00", ["2026-01-03T00:00", "2026-01-04T00:00", "2026-01-10T00:00"]),
        ("0 0 * * FRI-7", "2026-01-01T00:00", ["2026-01-02T00:00", "2026-01-03T00:00", "2026-01-04T00:00"]),
        ("0 0 1 jan,Jul ?", "2026-01-01T00:00", ["2026-01-01T00:00", "2026-07-01T00:00"]),
        ("0 12 13 * FRI", "2026-02-01T00:00", ["2026-02-06T12:00", "2026-02-13T12:00", "2026-02-20T12:00"]),
        # "*/10" starts with "*": days 1, 11, 21, 31 that are Mondays (cronie); "1-31/10" does not: either.
        ("0 0 */10 * MON", "2026-06-01T00:00", ["2026-06-01T00:00", "2026-08-31T00:00", "2026-09-21T00:00"]),
        ("0 0 1-31/10 * MON", "2026-06-01T00:00", ["2026-06-01T00:00", "2026-06-08T00:00", "2026-06-11T00:00"]),
        ("0 0 */10 * *", "2026-06-01T00:00", ["2026-06-01T00:00", "2026-06-11T00:00", "2026-06-21T00:00"]),
        # Vixie cron and cronie: a day field that starts with "*" is unrestricted, so both must match.
        ("0 0 */2 * */1", "2026-06-01T00:00", ["2026-06-01T00:00", "2026-06-03T00:00"]),
        ("1 1 1-7 * */7", "2026-01-01T00:00", ["2026-01-04T01:01", "2026-02-01T01:01", "2026-03-01T01:01"]),
        ("0 0 */2 * MON", "2026-06-01T00:00", ["2026-06-01T00:00", "2026-06-15T00:00", "2026-06-29T00:00"]),
        ("0 0 1 * 0-6", "2026-06-01T00:00", ["2026-06-01T00:00", "2026-06-02T00:00"]),  # 0-6: restricted, OR
        ("0 0 29 2 */7", "2026-01-01T00:00", ["2032-02-29T00:00", "2060-02-29T00:00"]),  # Sundays, 28 years
        ("0 0 29 2 */7", "2061-01-01T00:00", ["2088-02-29T00:00", "2128-02-29T00:00"]),  # 40 years apart
        ("0 0 13 * *", "2026-02-01T00:00", ["2026-02-13T00:00", "2026-03-13T00:00"]),
        ("@hourly", "2026-01-01T00:30", ["2026-01-01T01:00", "2026-01-01T02:00"]),
        ("@Weekly", "2026-01-01T00:00", ["2026-01-04T00:00", "2026-01-11T00:00"]),
        ("@yearly", "2026-01-01T00:00:01", ["2027-01-01T00:00"]),
        ("  15   3  * * *  ", "2026-01-01T00:00", ["2026-01-01T03:15"]),
        ("7 0 0 * * *", "2026-01-01T00:00", ["2026-01-01T00:00:07", "2026-01-02T00:00:07"]),  # seconds come first
    ],
)
def test_cron_syntax(expression, start, expected):
    assert cron_preview(expression, "UTC", start, len(expected)) == [utc(text) for text in expected]


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "required"),
        ("* * * *", "has 5 fields.*this one has 4"),
        ("* * * * * * *", "this one has 7"),
        ("61 * * * *", "minute 61 is out of range 0-59"),
        ("* 24 * * *", "hour 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month 0 is out of range 1-31"),
        ("* * * 13 *", "month 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week 8 is out of range 0-7"),
        ("60 * * * * *", "second 60 is out of range"),
        ("*/0 * * * *", "step .* at least 1"),
        ("22-2 * * * *", "runs backwards.*22-59,0-2"),
        ("* * * * FRI-MON", "runs backwards"),
        ("* * * foo *", "'foo' in the month field is not a number or a name such as JAN"),
        ("* * L,1 * *", "stands alone in the day-of-month field"),
        ("* * 15W-20 * *", "is neither a value nor one of L"),
        ("* * * * 1#2/2", "is neither a value nor one of FRI#2"),
        ("H * * * *", "the H extension is not supported"),
        ("1,,2 * * * *", "empty item"),
        ("@reboot", "Unknown cron shortcut"),
        ("0 0 30 2 *", "never fires: there is no day 30 in February"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("* * 1 * 7/7", "'7/7' selects no day-of-week value"),
    ],
)
def test_invalid_cron_expressions_are_explained(expression, message):
    with pytest.raises(ScheduleError, match=message):
        validate_cron(expression)
    with pytest.raises(ScheduleError):
        Schedule(start_at=utc("2026-01-01T00:00"), cron=expression or "x")


def test_never_firing_day_is_fine_when_weekday_may_fire_instead():
    validate_cron("0 0 30 2 MON")  # OR semantics: every Monday
    assert cron_preview("0 0 30 2 MON", "UTC", "2026-02-01T00:00", 1) == [utc("2026-02-02T00:00")]


def test_fixed_hour_classification_follows_the_hour_field():
    assert parse_cron("30 2 * * *").fixed_hour
    assert parse_cron("* 1-5 * * *").fixed_hour
    assert parse_cron("0 1,13 * * *").fixed_hour
    assert not parse_cron("30 * * * *").fixed_hour
    assert not parse_cron("0 */2 * * *").fixed_hour
    assert not parse_cron("0 8-18/2 * * *").fixed_hour
    assert not parse_cron("@hourly").fixed_hour


# --------------------------------------------------------------------------- zones and schedules


@pytest.mark.parametrize("name", ["Mars/Olympus", "europe/berlin", "", "CEST", "+02:00"])
def test_unknown_time_zones_are_rejected(name):
    with pytest.raises(ScheduleError, match=r"Unknown time zone.*IANA"):
        validate_timezone(name)
    with pytest.raises(ScheduleError, match="Unknown time zone"):
        Schedule(start_at=utc("2026-01-01T00:00"), cron="* * * * *", timezone=name)


def test_known_time_zones_are_returned():
    assert validate_timezone("Australia/Lord_Howe") == ZoneInfo("Australia/Lord_Howe")
    assert validate_timezone("UTC") == ZoneInfo("UTC")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"start_at": utc("2026-01-02T00:00"), "end_at": utc("2026-01-01T00:00")}, "end_at must not be before"),
        ({"start_at": datetime(2026, 1, 1)}, "start_at must carry a time zone"),
        ({"start_at": utc("2026-01-01T00:00"), "end_at": datetime(2026, 1, 2)}, "end_at must carry"),
        ({"start_at": utc("2026-01-01T00:00"), "interval": timedelta(0)}, "interval must be positive"),
        ({"start_at": utc("2026-01-01T00:00"), "interval": timedelta(hours=1), "cron": "* * * * *"}, "not both"),
    ],
)
def test_invalid_schedules_are_rejected(fields, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule(**fields)


def test_one_shot_fires_once_at_start():
    schedule = Schedule(start_at=datetime(2026, 3, 1, 10, 0, tzinfo=ZoneInfo("Europe/Berlin")))
    assert not schedule.recurring
    assert list(schedule.fire_times()) == [utc("2026-03-01T09:00")]
    assert list(schedule.fire_times(since=utc("2026-03-01T09:00:01"))) == []


def test_interval_stays_on_the_start_at_grid():
    schedule = Schedule(start_at=utc("2026-01-01T00:00:10"), interval=timedelta(minutes=7))
    assert schedule.recurring
    assert schedule.preview(3) == [utc("2026-01-01T00:00:10"), utc("2026-01-01T00:07:10"), utc("2026-01-01T00:14:10")]
    # A late pass resumes on the grid, inclusive of a grid point, without drift.
    # 10:00 is 85.7 steps of 7 minutes after 00:00:10: the next grid point is step 86, 10:02:10.
    assert schedule.preview(2, since=utc("2026-01-01T10:00")) == [
        utc("2026-01-01T10:02:10"),
        utc("2026-01-01T10:09:10"),
    ]
    assert schedule.preview(1, since=utc("2026-01-01T10:02:10")) == [utc("2026-01-01T10:02:10")]


def test_interval_is_elapsed_time_across_dst():
    berlin = ZoneInfo("Europe/Berlin")
    schedule = Schedule(start_at=datetime(2026, 3, 29, 1, 30, tzinfo=berlin), interval=timedelta(hours=1))
    assert schedule.preview(3) == [utc("2026-03-29T00:30"), utc("2026-03-29T01:30"), utc("2026-03-29T02:30")]


def test_interval_grid_is_exact_for_huge_ratios():
    # (since - start) / interval as a float rounds 10**17 + 1 down to 10**17; the grid must not.
    start = utc("2000-01-01T00:00")
    schedule = Schedule(start_at=start, interval=timedelta(microseconds=1))
    since = start + timedelta(microseconds=10**17 + 1)
    assert since.year < 9999
    assert schedule.preview(1, since=since) == [since]


def test_interval_schedule_respects_end_at():
    schedule = Schedule(start_at=utc("2026-01-01T00:00"), interval=timedelta(hours=1), end_at=utc("2026-01-01T02:00"))
    assert list(schedule.fire_times()) == [utc("2026-01-01T00:00"), utc("2026-01-01T01:00"), utc("2026-01-01T02:00")]


def test_jitter_is_deterministic_and_bounded():
    cap = timedelta(seconds=30)
    first = jitter_for(key="task-1:2026-01-01T00:00:00+00:00", max_jitter=cap)
    assert first == jitter_for(key="task-1:2026-01-01T00:00:00+00:00", max_jitter=cap)
    delays = {jitter_for(key=f"task-{number}", max_jitter=cap) for number in range(200)}
    assert all(timedelta(0) <= delay <= cap for delay in delays)
    assert len(delays) > 150
    assert jitter_for(key="anything", max_jitter=timedelta(0)) == timedelta(0)


# --------------------------------------------------------------------------- brute-force reference

_REF_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_REF_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
# (low, high, where "*" and "a/n" stop, names)
_REF_FIELDS = {
    "second": (0, 59, 59, None),
    "minute": (0, 59, 59, None),
    "hour": (0, 23, 23, None),
    "dom": (1, 31, 31, None),
    "month": (1, 12, 12, {name: number + 1 for number, name in enumerate(_REF_MONTHS)}),
    "dow": (0, 7, 6, {name: number for number, name in enumerate(_REF_DAYS)}),
}
_REF_ITEM = re.compile(r"^(?:(?P<star>[*?])|(?P<a>\w+)(?:-(?P<b>\w+))?)(?:/(?P<step>\d+))?$")


def _ref_allowed(text: str, kind: str) -> set[int]:
    low, _high, star_high, names = _REF_FIELDS[kind]

    def number(token: str) -> int:
        return names[token.lower()] if names and token.lower() in names else int(token)

    allowed: set[int] = set()
    for item in text.split(","):
        found = _REF_ITEM.match(item)
        assert found, item
        step = int(found["step"] or 1)
        if found["star"]:
            first, last = low, star_high
        else:
            first = number(found["a"])
            last = number(found["b"]) if found["b"] else (star_high if found["step"] else first)
            if kind == "dow" and found["b"] and last == 0 < first:
                last = 7
        value = first
        while value <= last:
            allowed.add(0 if kind == "dow" and value == 7 else value)
            value += step
    return allowed


class RefCron:
    """The reference reading of an expression: a naive predicate on wall-clock datetimes."""

    def __init__(self, expression: str) -> None:
        parts = expression.split()
        if len(parts) == 5:
            parts = ["0", *parts]
        kinds = ("second", "minute", "hour", "dom", "month", "dow")
        self.sets = {kind: _ref_allowed(part, kind) for kind, part in zip(kinds, parts, strict=True)}
        # Vixie cron and cronie: a day field starting with "*" (or "?") is unrestricted.
        self.either_day = not parts[3].startswith(("*", "?")) and not parts[5].startswith(("*", "?"))
        self.fixed_hour = "*" not in parts[2] and "/" not in parts[2]

    def day_ok(self, when: datetime) -> bool:
        by_date = when.day in self.sets["dom"]
        by_weekday = (when.weekday() + 1) % 7 in self.sets["dow"]
        days_ok = (by_date or by_weekday) if self.either_day else (by_date and by_weekday)
        return when.month in self.sets["month"] and days_ok

    def matches(self, wall: datetime) -> bool:
        return (
            wall.second in self.sets["second"]
            and wall.minute in self.sets["minute"]
            and wall.hour in self.sets["hour"]
            and self.day_ok(wall)
        )


def reference_fires(
    ref: RefCron, zone: ZoneInfo, low: datetime, high: datetime, step: timedelta, pad: timedelta
) -> list[datetime]:
    """Brute force: walk every ``step`` from ``low - pad``, read the clock, apply the documented rule.

    Clock-following: fire at every instant whose wall clock matches. Fixed-hour: at each
    instant, fire if some matching wall time is shown (or passed) for the first time, i.e. lies
    in (highest reading so far, current reading].
    """
    instant = low - pad
    shown = (instant - step).astimezone(zone).replace(tzinfo=None)
    fires = []
    while instant < high:
        reading = instant.astimezone(zone).replace(tzinfo=None)
        if ref.fixed_hour:
            fire, wall = False, shown + step
            while wall <= reading and not fire:
                fire = ref.matches(wall)
                wall += step
        else:
            fire = ref.matches(reading)
        shown = max(shown, reading)
        if fire and instant >= low:
            fires.append(instant)
        instant += step
    return fires


ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "America/Sao_Paulo",  # DST at midnight until 2019
    "America/Havana",  # midnight transitions
    "America/Santiago",
    "Pacific/Apia",  # skipped 30 December 2011
    "Pacific/Chatham",  # +12:45 / +13:45
    "Europe/Dublin",  # negative DST in the tz database
    "Antarctica/Troll",  # two-hour shift
    "Africa/Casablanca",  # Ramadan transitions
]


@functools.cache
def offset_changes(zone_name: str, year: int) -> tuple[datetime, ...]:
    """Instants (whole seconds) at which the zone's UTC offset changes in ``year``."""
    zone = ZoneInfo(zone_name)

    def offset(instant: datetime) -> timedelta | None:
        return instant.astimezone(zone).utcoffset()

    changes = []
    day = datetime(year, 1, 1, tzinfo=UTC)
    while day.year == year:
        following = day + timedelta(days=1)
        if offset(day) != offset(following):
            before, after = day, following
            while after - before > timedelta(seconds=1):
                middle = before + timedelta(seconds=(after - before) // timedelta(seconds=2))
                before, after = (middle, after) if offset(middle) == offset(day) else (before, middle)
            changes.append(after)
        day = following
    return tuple(changes)


@dataclass(frozen=True)
class Case:
    """An expression, a zone and a UTC range [low, high), usually around ``anchor``, an offset change."""

    expression: str
    zone: str
    anchor: datetime
    low: datetime
    high: datetime


def _names(kind: str) -> list[str]:
    return _REF_MONTHS if kind == "month" else _REF_DAYS


@st.composite
def field_item(draw, kind: str, *, plain: bool = False, stepped: bool | None = None) -> str:
    """One list item of a field; ``plain`` keeps to what croniter reads correctly."""
    low, high, star_high, names = _REF_FIELDS[kind]
    if plain:
        high = star_high  # croniter rejects weekday 7 in ranges

    def value(at_least: int = low) -> tuple[int, str]:
        number = draw(st.integers(at_least, high))
        if names and number <= star_high and draw(st.booleans()):
            name = _names(kind)[number - low]
            return number, name.upper() if draw(st.booleans()) else name
        return number, str(number)

    shapes = {None: ["value", "value", "range", "star-step", "range-step", "start-step"]}
    shapes[True], shapes[False] = shapes[None][3:], shapes[None][:3]
    shape = draw(st.sampled_from(shapes[stepped]))
    step = draw(st.integers(1, high - low + 2))
    first, first_text = value()
    if shape == "value":
        return first_text
    if shape == "star-step":
        return f"*/{step}"
    if shape == "start-step":
        return f"{first_text}/{step}"
    if plain and first == high:
        return first_text  # croniter expands an equal range "a-a" to the whole field
    _, last_text = value(first + 1 if plain else first)
    return f"{first_text}-{last_text}" + (f"/{step}" if shape == "range-step" else "")


@st.composite
def field(draw, kind: str, star_percent: int, *, plain: bool = False) -> str:
    if draw(st.integers(0, 99)) < star_percent:
        return "*" if plain or kind not in ("dom", "dow") else draw(st.sampled_from(["*", "*", "?"]))
    return ",".join(draw(st.lists(field_item(kind, plain=plain), min_size=1, max_size=3)))


@st.composite
def hour_field(draw, core: list[int], near: list[int]) -> str:
    """Often fixed hours that the offset change skips or repeats (``core``) or that lie around it."""
    kind = draw(st.sampled_from(["*", "*", "stepped", "core", "core", "core", "near", "fixed"]))
    if kind == "*":
        return "*"
    if kind == "stepped":
        return draw(field_item("hour", stepped=True))
    if kind in ("core", "near"):
        chosen = sorted(set(draw(st.lists(st.sampled_from(core if kind == "core" else near), min_size=1, max_size=2))))
        if len(chosen) == 2 and draw(st.booleans()):
            return f"{chosen[0]}-{chosen[1]}"
        return ",".join(map(str, chosen))
    return ",".join(draw(st.lists(field_item("hour", stepped=False), min_size=1, max_size=2)))


@st.composite
def expressions(draw, *, seconds: bool, plain: bool = False, hours: tuple[list[int], list[int]] | None = None) -> str:
    parts = [
        draw(field("minute", 25, plain=plain)),
        draw(hour_field(*hours) if hours else field("hour", 40, plain=plain)),
        draw(field("dom", 70, plain=plain)),
        draw(field("month", 85, plain=plain)),
        draw(field("dow", 70, plain=plain)),
    ]
    if seconds:
        parts.insert(0, draw(field("second", 30, plain=plain)))
    return " ".join(parts)


def _wall_hours(first: datetime, last: datetime) -> list[int]:
    """The hours a naive clock passes from ``first`` to ``last`` (either order)."""
    first, last = min(first, last), max(first, last)
    hours, wall = set(), first.replace(minute=0, second=0, microsecond=0)
    while wall <= last:
        hours.add(wall.hour)
        wall += timedelta(hours=1)
    return sorted(hours)


@st.composite
def cases(draw, *, seconds: bool, before: timedelta, after: timedelta) -> Case:
    """Mostly a range from up to ``before`` an offset change to up to ``after`` it."""
    zone = draw(st.sampled_from(ZONES))
    local = ZoneInfo(zone)
    year = draw(st.integers(1995, 2037))
    changes = offset_changes(zone, year)
    if changes and draw(st.integers(0, 9)) > 0:
        anchor = draw(st.sampled_from(changes))
    else:
        anchor = datetime(year, 1, 1, tzinfo=UTC) + timedelta(minutes=draw(st.integers(0, 365 * 24 * 60)))

    def wall(instant: datetime) -> datetime:
        return instant.astimezone(local).replace(tzinfo=None)

    core = _wall_hours(wall(anchor - timedelta(seconds=1)), wall(anchor))  # skipped or repeated
    near = _wall_hours(wall(anchor - timedelta(hours=2)), wall(anchor + timedelta(hours=2)))
    expression = draw(expressions(seconds=seconds, hours=(core, near)))
    unit = timedelta(seconds=1) if seconds else timedelta(minutes=1)
    low = anchor - unit * draw(st.integers(0, before // unit))
    low = low.replace(microsecond=0) if seconds else low.replace(second=0, microsecond=0)
    high = max(low + unit, anchor + unit * draw(st.integers(0, after // unit)))
    return Case(expression, zone, anchor, low, high)


def _module_fires(expression: str, zone: str, low: datetime, high: datetime) -> list[datetime] | str:
    """The module's fire times in [low, high), or its error if it rejects the expression."""
    try:
        schedule = Schedule(start_at=low, cron=expression, timezone=zone)
    except ScheduleError as exc:
        return str(exc)
    return list(takewhile(lambda when: when < high, schedule.fire_times()))


def _assert_rightly_rejected(ref: RefCron, error: str) -> None:
    """The generated syntax is valid: the module may only reject an empty field or a date that never comes."""
    if "selects no" in error:
        assert not all(ref.sets.values()), error
        return
    assert "never fires" in error, error
    day = datetime(2000, 1, 1)  # naive: a calendar walk, and 2000-2008 holds every shape of month
    while day.year < 2009:
        assert not ref.day_ok(day), f"rejected as never firing, yet {day:%Y-%m-%d} matches"
        day += timedelta(days=1)


def _check_against_reference(case: Case, step: timedelta) -> None:
    ref = RefCron(case.expression)
    actual = _module_fires(case.expression, case.zone, case.low, case.high)
    if isinstance(actual, str):
        _assert_rightly_rejected(ref, actual)
        return
    pad = timedelta(days=1) if step >= timedelta(minutes=1) else timedelta(hours=3)
    expected = reference_fires(ref, ZoneInfo(case.zone), case.low, case.high, step, pad)
    event("fixed-hour" if ref.fixed_hour else "clock-following")
    event("fires" if expected else "no fire")
    if any(abs(when - case.anchor) <= timedelta(hours=3) for when in expected):
        event("fires within 3 hours of the offset change")
    assert actual == expected
    assert all(a < b for a, b in pairwise(actual))


_PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


@settings(_PROPERTY, max_examples=250)
@given(case=cases(seconds=False, before=timedelta(hours=30), after=timedelta(hours=30)))
def test_five_field_fire_times_match_brute_force_reference(case):
    _check_against_reference(case, timedelta(minutes=1))


@settings(_PROPERTY, max_examples=50)
@given(case=cases(seconds=True, before=timedelta(hours=2), after=timedelta(hours=2)))
def test_six_field_fire_times_match_brute_force_reference(case):
    _check_against_reference(case, timedelta(seconds=1))


@settings(_PROPERTY, max_examples=120)
@given(
    case=cases(seconds=False, before=timedelta(hours=12), after=timedelta(hours=12)),
    since_offset=st.integers(-3 * 3600 * 10**6, 3 * 3600 * 10**6),
)
def test_fire_times_from_any_since_are_a_suffix_of_the_sequence(case, since_offset):
    # Resuming anywhere (inside a gap, in either pass of a repeated hour, mid-second) neither
    # repeats nor skips a fire time.
    try:
        schedule = Schedule(start_at=case.low, cron=case.expression, timezone=case.zone)
    except ScheduleError:
        assume(False)
    high = case.high + timedelta(hours=6)
    whole = list(takewhile(lambda when: when < high, schedule.fire_times()))
    since = case.anchor + timedelta(microseconds=since_offset)
    resumed = list(takewhile(lambda when: when < high, schedule.fire_times(since=since)))
    assert resumed == [when for when in whole if when >= since]


@settings(_PROPERTY, max_examples=80)
@given(expression=st.one_of(expressions(seconds=False, plain=True), expressions(seconds=True, plain=True)))
def test_agrees_with_croniter_where_there_is_no_dst(expression):
    # croniter is right on a clock that does not jump, for plain syntax: a second, independent oracle.
    start = utc("2024-12-30T22:00")
    try:
        ours = Schedule(start_at=start, cron=expression).preview(25)
    except ScheduleError:
        assume(False)
    ref = RefCron(expression)
    # Where both day fields are restricted and one selects every value ("*/1"), croniter reads that
    # one as "*" if the other contains a "*" (AND); the module's documented rule says OR.
    assume(not (ref.either_day and (len(ref.sets["dom"]) == 31 or len(ref.sets["dow"]) == 7)))
    # croniter reads a stepped day field ("*/2") as restricted (OR); cronie and the module as
    # unrestricted (AND). Compared where the two readings agree: the other day field is "*".
    day_fields = expression.split()[-3::2]
    assume(not any(part.startswith("*") and part != "*" for part in day_fields) or "*" in day_fields)
    seconds = len(expression.split()) == 6
    theirs = croniter(expression, start - timedelta(microseconds=1), ret_type=datetime, second_at_beginning=seconds)
    assert ours == list(islice(theirs.all_next(datetime), 25))


def test_search_for_a_fire_time_is_bounded():
    # Validation rejects expressions that never fire; should one slip through, the search still ends.
    never = dataclasses.replace(parse_cron("0 0 * * *"), weekdays=frozenset())
    assert list(_cron_times(never, ZoneInfo("Europe/Berlin"), utc("2026-01-01T00:00"))) == []


@pytest.mark.parametrize(
    "zone", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Asia/Tehran"]
)
def test_offset_stretches_match_the_zone_everywhere_over_a_decade(zone):
    """Every stretch the cron calculator walks has the zone's offset from its first to its last
    instant, also where an offset change falls in the last hours of a cached 28-day bucket."""

    from tasks_app.schedules import _offset, _segments

    tz = ZoneInfo(zone)
    start, stop = datetime(2018, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, tzinfo=UTC)
    changes = 0
    previous = None
    for begin, end, offset in _segments(tz, start):
        if begin >= stop:
            break
        assert _offset(tz, begin) == offset
        assert _offset(tz, end - timedelta(microseconds=1)) == offset
        changes += previous is not None and previous != offset
        previous = offset
    assert changes >= 10  # DST in each of these zones for most of those years
