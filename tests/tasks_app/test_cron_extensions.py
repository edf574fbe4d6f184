"""Quartz's day extensions (issue 32): ``L``, ``L-n``, ``nW``, ``LW``, ``d#n`` and ``dL``.

Each expected instant below was worked out by hand from the calendar (which weekday a date
falls on, how long a month is) and the zone's rules, not by running the engine. The examples
are Quartz's own (its CronTrigger tutorial and CronExpression documentation), with Quartz's
weekday numbers (1 = Sunday) written as names, and the edge cases its documentation states.
"""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice

import pytest

from tasks_app.schedule_words import cron_words
from tasks_app.schedules import Schedule, ScheduleError, parse_cron

#: The cases read in a zone other than UTC (the rest are UTC).
_ZONES = {"0 9 L * *": "Europe/Berlin", "30 2 * * SUNL": "Europe/Berlin"}


def _fires(expression: str, since: str, count: int, zone: str = "UTC") -> list[str]:
    start = datetime.fromisoformat(since).astimezone(UTC)
    schedule = Schedule(start_at=start, cron=expression, timezone=zone)
    return [when.isoformat().replace("+00:00", "Z") for when in islice(schedule.fire_times(), count)]


@pytest.mark.parametrize(
    ("expression", "since", "expected"),
    [
        # Quartz: "0 15 10 L * ?" fires at 10:15 on the last day of every month (2028 is a leap year).
        pytest.param(
            "0 15 10 L * ?",
            "2028-01-01T00:00:00Z",
            ["2028-01-31T10:15:00Z", "2028-02-29T10:15:00Z", "2028-03-31T10:15:00Z", "2028-04-30T10:15:00Z"],
            id="quartz-last-day",
        ),
        # Quartz: "0 15 10 L-2 * ?" fires on the second-to-last day (31 - 2, 29 - 2, 31 - 2).
        pytest.param(
            "0 15 10 L-2 * ?",
            "2028-01-01T00:00:00Z",
            ["2028-01-29T10:15:00Z", "2028-02-27T10:15:00Z", "2028-03-29T10:15:00Z"],
            id="quartz-last-day-minus-2",
        ),
        # Quartz: "0 15 10 ? * 6L" is the last Friday of every month (6 = Friday in Quartz):
        # Fridays of January 2027 are 1, 8, 15, 22, 29; of February 5 ... 26; of March 5 ... 26.
        pytest.param(
            "0 15 10 ? * FRIL",
            "2027-01-01T00:00:00Z",
            ["2027-01-29T10:15:00Z", "2027-02-26T10:15:00Z", "2027-03-26T10:15:00Z"],
            id="quartz-last-friday",
        ),
        pytest.param(
            "0 15 10 ? * 5L",
            "2027-01-01T00:00:00Z",
            ["2027-01-29T10:15:00Z", "2027-02-26T10:15:00Z", "2027-03-26T10:15:00Z"],
            id="last-friday-by-number",
        ),
        # Quartz: "0 15 10 ? * 6#3" is the third Friday of every month: 15 Jan, 19 Feb, 19 Mar 2027.
        pytest.param(
            "0 15 10 ? * FRI#3",
            "2027-01-01T00:00:00Z",
            ["2027-01-15T10:15:00Z", "2027-02-19T10:15:00Z", "2027-03-19T10:15:00Z"],
            id="quartz-third-friday",
        ),
        # Quartz: "2#1" is the first Monday: 4 Jan, 1 Feb, 1 Mar 2027.
        pytest.param(
            "0 0 * * MON#1",
            "2027-01-01T00:00:00Z",
            ["2027-01-04T00:00:00Z", "2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z"],
            id="quartz-first-monday",
        ),
        # Quartz: "4#5" (fifth Wednesday): "if there is not 5 of the given day-of-week in the
        # month, then no firing will occur that month". 2027: 31 March, 30 June, 29 September, 29 December.
        pytest.param(
            "0 0 * * WED#5",
            "2027-01-01T00:00:00Z",
            ["2027-03-31T00:00:00Z", "2027-06-30T00:00:00Z", "2027-09-29T00:00:00Z", "2027-12-29T00:00:00Z"],
            id="quartz-fifth-wednesday-skips-months",
        ),
        # Quartz on 15W: the 15th a Saturday fires Friday the 14th (May 2027), a Sunday Monday the
        # 16th (August 2027), a Tuesday the 15th itself (June 2027).
        pytest.param(
            "0 0 15W 5-8 *",
            "2027-05-01T00:00:00Z",
            ["2027-05-14T00:00:00Z", "2027-06-15T00:00:00Z", "2027-07-15T00:00:00Z", "2027-08-16T00:00:00Z"],
            id="quartz-nearest-weekday",
        ),
        # Quartz: "1W" when the 1st is a Saturday fires Monday the 3rd: it does not jump over the
        # month's boundary (1 May 2027 is a Saturday; 1 August 2027 a Sunday, so Monday the 2nd).
        pytest.param(
            "0 0 1W 5,8 *",
            "2027-04-01T00:00:00Z",
            ["2027-05-03T00:00:00Z", "2027-08-02T00:00:00Z"],
            id="quartz-1W-stays-in-its-month",
        ),
        # The same at the month's end: 31 January 2027 is a Sunday, so 31W is Friday the 29th, not
        # Monday 1 February; 31 October 2027 is a Sunday too (29th). 30 April 2027 is a Friday.
        pytest.param(
            "0 0 31W 1,10 *",
            "2027-01-01T00:00:00Z",
            ["2027-01-29T00:00:00Z", "2027-10-29T00:00:00Z"],
            id="31W-stays-in-its-month",
        ),
        # nW in a month without day n selects nothing, as n does: 31W skips April and June.
        pytest.param(
            "0 0 31W 3-6 *",
            "2027-03-01T00:00:00Z",
            ["2027-03-31T00:00:00Z", "2027-05-31T00:00:00Z", "2028-03-31T00:00:00Z"],
            id="31W-skips-short-months",
        ),
        # Quartz: "LW" is the last weekday of the month. 2027: 29 Jan (31st a Sunday), 26 Feb
        # (28th a Sunday), 31 Mar (Wednesday), 30 Apr (Friday), 31 May (Monday).
        pytest.param(
            "0 0 LW * *",
            "2027-01-01T00:00:00Z",
            ["2027-01-29T00:00:00Z", "2027-02-26T00:00:00Z", "2027-03-31T00:00:00Z", "2027-04-30T00:00:00Z"],
            id="quartz-last-weekday",
        ),
        # The day rule holds beside an extension: both day fields restricted, either matches.
        # February 2027: last day Sunday the 28th; Mondays 1, 8, 15, 22.
        pytest.param(
            "0 0 L 2 MON",
            "2027-02-01T00:00:00Z",
            [
                "2027-02-01T00:00:00Z",
                "2027-02-08T00:00:00Z",
                "2027-02-15T00:00:00Z",
                "2027-02-22T00:00:00Z",
                "2027-02-28T00:00:00Z",
            ],
            id="day-rule-either",
        ),
        # One day field starting with "*": both must match. "*/2" is the odd days; the last
        # Fridays of 2027 from January: 29 (odd), 26 Feb (even), 26 Mar (even), 30 Apr (even),
        # 28 May (even), 25 Jun (odd).
        pytest.param(
            "0 0 */2 * FRIL",
            "2027-01-01T00:00:00Z",
            ["2027-01-29T00:00:00Z", "2027-06-25T00:00:00Z"],
            id="day-rule-both",
        ),
        # In a zone: the last day's 09:00 in Berlin; 31 March 2027 is after the change to CEST
        # (28 March), so 07:00 UTC, and 28 February is CET, 08:00 UTC.
        pytest.param(
            "0 9 L * *",
            "2027-02-01T00:00:00Z",
            ["2027-02-28T08:00:00Z", "2027-03-31T07:00:00Z"],
            id="last-day-in-berlin",
        ),
        # Fixed hours keep the DST rule: 02:30 on the last Sunday of March 2027 (the 28th) does
        # not exist in Berlin, so it fires once at 03:00 CEST (01:00 UTC); in April, 02:30 CEST.
        pytest.param(
            "30 2 * * SUNL",
            "2027-03-01T00:00:00Z",
            ["2027-03-28T01:00:00Z", "2027-04-25T00:30:00Z"],
            id="last-sunday-dst-gap",
        ),
    ],
)
def test_extension_fire_times_worked_out_by_hand(expression, since, expected):
    assert _fires(expression, since, len(expected), _ZONES.get(expression, "UTC")) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 0 1,L * *", "stands alone in the day-of-month field"),
        ("0 0 * * MON#1,MON#3", "stands alone in the day-of-week field"),
        ("0 0 L/2 * *", "is neither a value nor one of L (the last day)"),
        ("0 0 25-L * *", "is neither a value nor one of"),
        ("0 0 * * L", "L alone in the day-of-week field is refused"),
        ("0 0 * * MON#6", "the n in #n is 1 to 5"),
        ("0 0 * * MON#0", "the n in #n is 1 to 5"),
        ("0 0 L-31 * *", "the n in L-n is 0 to 30"),
        ("0 0 32W * *", "day-of-month 32 is out of range 1-31"),
        ("0 0 W * *", "is neither a value nor one of"),
        ("0 L * * *", "L, W and # are for the day fields only"),
        ("0 0 30W 2 *", "it never fires"),
        ("1 1 */100 * MON#4", "it never fires"),
        ("0 0 * * 1W", "is neither a value nor one of FRI#2"),
    ],
)
def test_misused_extensions_are_refused_with_what_to_write(expression, message):
    with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_cron(expression)


def test_weekday_names_that_hold_the_letters_stay_names():
    # WED, JUL and DEC contain W, L or D: read as names, not as extensions.
    cron = parse_cron("0 0 * JUL-DEC WED-SUN")
    assert cron.months == frozenset(range(7, 13)) and cron.weekdays == frozenset({3, 4, 5, 6, 0})


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("0 18 L * *", "At 18:00, on the last day of the month"),
        ("0 9 L-2 * *", "At 09:00, 2 days before the last day of the month"),
        ("0 9 15W * *", "At 09:00, on the weekday nearest day 15 of the month"),
        ("0 17 LW * *", "At 17:00, on the last weekday of the month"),
        ("0 10 * * MON#2", "At 10:00, on the second Monday of the month"),
        ("0 10 * * FRIL", "At 10:00, on the last Friday of the month"),
        ("0 10 * * 5L", "At 10:00, on the last Friday of the month"),
        ("0 0 L * MON", "At 00:00, on the last day of the month or on Monday"),
    ],
)
def test_extensions_in_words(expression, words):
    assert cron_words(expression) == words


# --- through the API ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_task_on_the_last_weekday_is_created_described_and_planned(api_client):
    body = {"runner": "noop", "cron": "0 17 LW * *", "timezone": "Europe/Berlin"}
    created = api_client.post("/api/v1/tasks", body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["description"] == "At 17:00, on the last weekday of the month (Europe/Berlin)"
    preview = api_client.post(
        "/api/v1/schedules/preview",
        {"cron": "0 17 LW * *", "timezone": "Europe/Berlin", "start_at": "2027-01-01T00:00:00Z", "count": 3},
        format="json",
    )
    # 29 January and 26 February 2027 are Fridays (CET, +01:00); 31 March a Wednesday (CEST, +02:00).
    assert [t["utc"] for t in preview.json()["fire_times"]] == [
        "2027-01-29T16:00:00Z",
        "2027-02-26T16:00:00Z",
        "2027-03-31T15:00:00Z",
    ]


@pytest.mark.django_db
def test_a_misused_extension_is_a_400_on_cron_and_creates_nothing(api_client):
    from executions.models import Execution
    from tasks_app.models import Task

    response = api_client.post("/api/v1/tasks", {"runner": "noop", "cron": "0 0 1,L * *"}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["errors"]) == ["cron"]
    assert "stands alone in the day-of-month field" in response.json()["errors"]["cron"][0]
    assert Task.objects.count() == 0 and Execution.objects.count() == 0
