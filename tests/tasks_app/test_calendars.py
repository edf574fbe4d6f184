"""Business calendars (issue 32): the materialiser skips or moves fire times on closed days.

Every expected instant below was worked out by hand from the calendar and the zones' rules, not
by running the engine:

- Europe/Berlin 2027: CET (+01:00) until Sunday 28 March 01:00 UTC, then CEST (+02:00). So 09:00
  local is 08:00 UTC up to Saturday 27 March and 07:00 UTC from Sunday 28 March on; 02:00-02:59
  does not exist on 28 March (02:30 shifted lands at 03:00 CEST = 01:00 UTC).
- Germany (holidays 0.109), 2027: Good Friday Friday 26 March, Easter Monday Monday 29 March;
  Bavaria (DE-BY) also closes Epiphany, Wednesday 6 January (Berlin, DE-BE, does not).
- America/New_York 2027: EDT (-04:00) until 7 November, then EST (-05:00). Independence Day
  Sunday 4 July is observed Monday 5 July (09:00 EDT = 13:00 UTC); Thanksgiving Thursday
  25 November (09:00 EST = 14:00 UTC).
"""

from __future__ import annotations

from datetime import datetime

import pytest

from executions.materialiser import materialise_task
from executions.models import Execution, SkippedOccurrence
from tasks_api.calendars import calendar_create
from tasks_api.creation import task_create
from tasks_app.calendars import CalendarRules, calendar_place

BERLIN, NEW_YORK = "Europe/Berlin", "America/New_York"


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _plan(user, calendar, policy, *, cron, zone, start, until, **options):
    """Materialise a task with ``calendar`` and ``policy`` from ``start`` to ``until``; its runs
    as (UTC instant, moved from), its calendar skips as (fire time, reason, detail)."""
    task = task_create(
        owner=user,
        runner="noop",
        cron=cron,
        timezone=zone,
        start_at=_t(start),
        calendar=calendar,
        calendar_policy=policy,
        **options,
    )
    materialise_task(task_id=task.pk, until=_t(until))
    runs = [
        (when.isoformat(), moved.isoformat() if moved else None)
        for when, moved in Execution.objects.filter(task=task, superseded=False)
        .order_by("scheduled_for")
        .values_list("scheduled_for", "moved_from")
    ]
    skips = [
        (when.isoformat(), reason, detail)
        for when, reason, detail in SkippedOccurrence.objects.filter(task=task)
        .order_by("scheduled_for")
        .values_list("scheduled_for", "reason", "detail")
    ]
    return runs, skips


@pytest.fixture
def de(user):
    """Germany's public holidays, weekends closed."""
    return calendar_create(owner=user, name="de", country="DE", weekends_closed=True)


@pytest.fixture
def de_no_weekends(user):
    return calendar_create(owner=user, name="de-plain", country="DE")


# Daily 09:00 Berlin around Easter 2027, Germany with weekends closed. Thursday 25 March is open
# (08:00Z); Friday 26 (Good Friday), Saturday 27, Sunday 28 and Monday 29 (Easter Monday) are
# closed; Tuesday 30 and Wednesday 31 are open, in summer time (07:00Z).
EASTER_DAILY = {"cron": "0 9 * * *", "zone": BERLIN, "start": "2027-03-25T00:00:00+00:00"}


@pytest.mark.django_db
def test_skip_records_each_closed_day_with_the_holiday_or_weekend(user, de):
    runs, skips = _plan(user, de, "skip", until="2027-03-31T12:00:00+00:00", **EASTER_DAILY)
    assert runs == [
        ("2027-03-25T08:00:00+00:00", None),  # Thu 09:00 CET
        ("2027-03-30T07:00:00+00:00", None),  # Tue 09:00 CEST
        ("2027-03-31T07:00:00+00:00", None),  # Wed 09:00 CEST
    ]
    assert [(when, reason, detail.split(" (")[0]) for when, reason, detail in skips] == [
        ("2027-03-26T08:00:00+00:00", "holiday", "Good Friday"),
        ("2027-03-27T08:00:00+00:00", "holiday", "weekend"),
        ("2027-03-28T07:00:00+00:00", "holiday", "weekend"),  # Sunday, already CEST
        ("2027-03-29T07:00:00+00:00", "holiday", "Easter Monday"),
    ]
    assert all("(calendar de)" in detail for _, _, detail in skips)


@pytest.mark.django_db
def test_next_business_day_moves_onto_tuesday_and_runs_once_there(user, de):
    runs, skips = _plan(user, de, "next_business_day", until="2027-03-31T12:00:00+00:00", **EASTER_DAILY)
    # Friday to Monday all move to Tuesday 30 March 09:00 CEST = 07:00Z, where Tuesday's own
    # fire time already runs: one run.
    assert runs == [
        ("2027-03-25T08:00:00+00:00", None),
        ("2027-03-30T07:00:00+00:00", None),
        ("2027-03-31T07:00:00+00:00", None),
    ]
    assert [(when, reason) for when, reason, _ in skips] == [
        ("2027-03-26T08:00:00+00:00", "moved"),
        ("2027-03-27T08:00:00+00:00", "moved"),
        ("2027-03-28T07:00:00+00:00", "moved"),
        ("2027-03-29T07:00:00+00:00", "moved"),
    ]
    for _, _, detail in skips:
        assert detail.startswith("moved to 2027-03-30 09:00:00 CEST (next_business_day)")
        assert detail.endswith("one run")


@pytest.mark.django_db
def test_previous_business_day_moves_back_onto_thursday(user, de):
    runs, skips = _plan(user, de, "previous_business_day", until="2027-03-31T12:00:00+00:00", **EASTER_DAILY)
    # Friday to Monday move back to Thursday 25 March 09:00 CET = 08:00Z, Thursday's own run.
    # Thursday 1 April (open) is planned a day past the horizon: a fire time later on the
    # horizon's day could move back before it.
    assert runs == [
        ("2027-03-25T08:00:00+00:00", None),
        ("2027-03-30T07:00:00+00:00", None),
        ("2027-03-31T07:00:00+00:00", None),
        ("2027-04-01T07:00:00+00:00", None),
    ]
    assert {detail.split(" (")[0] for _, _, detail in skips} == {"moved to 2027-03-25 09:00:00 CET"}


@pytest.mark.django_db
def test_a_weekly_run_keeps_its_wall_time_across_the_clock_change(user, de):
    # Fridays 09:00: Good Friday (08:00Z, CET) moves to Tuesday 30 March 09:00 CEST = 07:00Z.
    runs, skips = _plan(
        user,
        de,
        "next_business_day",
        cron="0 9 * * 5",
        zone=BERLIN,
        start="2027-03-20T00:00:00+00:00",
        until="2027-04-03T00:00:00+00:00",
    )
    assert runs == [
        ("2027-03-30T07:00:00+00:00", "2027-03-26T08:00:00+00:00"),
        ("2027-04-02T07:00:00+00:00", None),  # Friday 2 April, CEST
    ]
    assert skips[0][:2] == ("2027-03-26T08:00:00+00:00", "moved")
    assert "Good Friday (calendar de)" in skips[0][2]


@pytest.mark.django_db
def test_previous_business_day_plans_ahead_of_the_horizon(user, de):
    # Mondays 09:00: Easter Monday (07:00Z, CEST) moves back over Sunday, Saturday and Good
    # Friday to Thursday 25 March 09:00 CET = 08:00Z. A horizon ending at Thursday noon must
    # already create it (the closed run is four days: fire times are planned five days further).
    runs, _ = _plan(
        user,
        de,
        "previous_business_day",
        cron="0 9 * * 1",
        zone=BERLIN,
        start="2027-03-23T00:00:00+00:00",
        until="2027-03-25T12:00:00+00:00",
    )
    assert runs == [("2027-03-25T08:00:00+00:00", "2027-03-29T07:00:00+00:00")]


@pytest.mark.django_db
def test_without_weekends_a_move_lands_on_the_saturday_fire_time(user, de_no_weekends):
    # Good Friday 08:00Z moves to Saturday 27 March 09:00 CET = 08:00Z, Saturday's own fire time.
    runs, skips = _plan(user, de_no_weekends, "next_business_day", until="2027-03-27T12:00:00+00:00", **EASTER_DAILY)
    assert runs == [("2027-03-25T08:00:00+00:00", None), ("2027-03-27T08:00:00+00:00", None)]
    assert skips[0][0] == "2027-03-26T08:00:00+00:00" and skips[0][2].endswith("one run")


@pytest.mark.django_db
def test_a_subdivision_closes_its_own_holidays(user):
    bavaria = calendar_create(owner=user, name="by", country="DE", subdivision="BY")
    berlin = calendar_create(owner=user, name="be", country="DE", subdivision="BE")
    window = {"cron": "0 9 * * *", "zone": BERLIN, "start": "2027-01-05T00:00:00+00:00"}
    until = "2027-01-07T12:00:00+00:00"
    # 5, 6 and 7 January 09:00 CET = 08:00Z; Epiphany (6th) closed in Bavaria only.
    runs, skips = _plan(user, bavaria, "skip", until=until, **window)
    assert [when for when, _ in runs] == ["2027-01-05T08:00:00+00:00", "2027-01-07T08:00:00+00:00"]
    assert [(when, detail) for when, _, detail in skips] == [("2027-01-06T08:00:00+00:00", "Epiphany (calendar by)")]
    runs, skips = _plan(user, berlin, "skip", until=until, **window)
    assert len(runs) == 3 and skips == []


@pytest.mark.django_db
def test_an_extra_range_moves_past_it_and_the_weekend_after_it(user):
    shutdown = calendar_create(
        owner=user,
        name="shutdown",
        weekends_closed=True,
        extra_dates=[{"start": "2027-12-24", "end": "2027-12-31", "label": "year-end shutdown"}],
    )
    # 24-31 December closed (the label wins over the weekend on the 25th and 26th), then
    # Saturday 1 and Sunday 2 January 2028: the next business day is Monday 3 January,
    # 09:00 CET = 08:00Z. Thursday 23 December runs at 08:00Z. No country: New Year's Day is
    # closed only as a Saturday.
    runs, skips = _plan(
        user,
        shutdown,
        "next_business_day",
        cron="0 9 * * *",
        zone=BERLIN,
        start="2027-12-23T00:00:00+00:00",
        until="2027-12-24T12:00:00+00:00",
    )
    assert runs == [
        ("2027-12-23T08:00:00+00:00", None),
        ("2028-01-03T08:00:00+00:00", "2027-12-24T08:00:00+00:00"),
    ]
    assert skips == [
        (
            "2027-12-24T08:00:00+00:00",
            "moved",
            "moved to 2028-01-03 09:00:00 CET (next_business_day): year-end shutdown (calendar shutdown)",
        )
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("policy", "cron", "start", "until", "expected"),
    [
        # Mondays 09:00 EDT; 5 July observed Independence Day; weekends closed.
        ("skip", "0 9 * * 1", "2027-07-04T00:00:00+00:00", "2027-07-06T00:00:00+00:00", []),
        (
            "next_business_day",
            "0 9 * * 1",
            "2027-07-04T00:00:00+00:00",
            "2027-07-06T00:00:00+00:00",
            [("2027-07-06T13:00:00+00:00", "2027-07-05T13:00:00+00:00")],  # Tuesday 09:00 EDT
        ),
        (
            "previous_business_day",
            "0 9 * * 1",
            "2027-07-01T00:00:00+00:00",
            "2027-07-03T00:00:00+00:00",
            [("2027-07-02T13:00:00+00:00", "2027-07-05T13:00:00+00:00")],  # Friday 09:00 EDT
        ),
        # Thursdays 09:00 EST; Thanksgiving 25 November.
        (
            "next_business_day",
            "0 9 * * 4",
            "2027-11-24T00:00:00+00:00",
            "2027-11-26T00:00:00+00:00",
            [("2027-11-26T14:00:00+00:00", "2027-11-25T14:00:00+00:00")],  # Friday 09:00 EST
        ),
        (
            "previous_business_day",
            "0 9 * * 4",
            "2027-11-23T00:00:00+00:00",
            "2027-11-25T00:00:00+00:00",
            [("2027-11-24T14:00:00+00:00", "2027-11-25T14:00:00+00:00")],  # Wednesday 09:00 EST
        ),
    ],
)
def test_a_us_calendar_in_new_york(user, policy, cron, start, until, expected):
    us = calendar_create(owner=user, name="us", country="US", weekends_closed=True)
    runs, skips = _plan(user, us, policy, cron=cron, zone=NEW_YORK, start=start, until=until)
    assert runs == expected
    assert len(skips) == 1 and skips[0][1] == ("holiday" if policy == "skip" else "moved")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("gap", "expected"),
    [
        # Saturday 27 March 02:30 CET (01:30Z) is closed; Sunday 28 March 02:30 does not exist:
        # shifted to the end of the gap, 03:00 CEST = 01:00Z ...
        ("", ("2027-03-28T01:00:00+00:00", "2027-03-27T01:30:00+00:00")),
        ("shift", ("2027-03-28T01:00:00+00:00", "2027-03-27T01:30:00+00:00")),
        # ... or, under dst_gap skip, not run at all.
        ("skip", None),
    ],
)
def test_a_move_into_the_dst_gap_follows_the_task_rule(user, gap, expected):
    closed = calendar_create(owner=user, name="sat", extra_dates=[{"start": "2027-03-27", "label": "inventory"}])
    runs, skips = _plan(
        user,
        closed,
        "next_business_day",
        cron="30 2 * * 6",
        zone=BERLIN,
        start="2027-03-26T00:00:00+00:00",
        until="2027-03-28T00:00:00+00:00",
        dst_gap=gap,
    )
    if expected is None:
        assert runs == []
        assert skips[0][1] == "holiday" and "does not exist on 2027-03-28" in skips[0][2]
    else:
        assert runs == [expected]


def test_the_calendar_answers_why_a_day_is_closed():
    rules = CalendarRules(name="x", country="DE", subdivision="BY", weekends_closed=True, weekend_days=(6, 7), extra=())
    assert rules.closed(_t("2027-01-06").date()) == "Epiphany"
    assert rules.closed(_t("2027-03-27").date()) == "weekend"
    assert rules.closed(_t("2027-03-25").date()) == ""
    place = calendar_place(rules, "skip", _t("2027-03-26T08:00:00+00:00"), timezone=BERLIN)
    assert place.run_at is None and place.reason == "Good Friday"


@pytest.mark.django_db
def test_materialising_twice_creates_nothing_twice(user, de):
    task = task_create(
        owner=user,
        runner="noop",
        cron="0 9 * * 5",
        timezone=BERLIN,
        start_at=_t("2027-03-20T00:00:00+00:00"),
        calendar=de,
        calendar_policy="next_business_day",
    )
    materialise_task(task_id=task.pk, until=_t("2027-04-03T00:00:00+00:00"))
    task.refresh_from_db()
    task.next_run_at = _t("2027-03-26T08:00:00+00:00")  # the cursor back, as a second pass in a race would see it
    task.save(update_fields=["next_run_at"])
    materialise_task(task_id=task.pk, until=_t("2027-04-03T00:00:00+00:00"))
    assert Execution.objects.filter(task=task).count() == 2
    assert SkippedOccurrence.objects.filter(task=task).count() == 1


def _due(**fields):
    from datetime import timedelta

    from executions.materialiser import DueTask

    values = {
        "pk": "00000000-0000-0000-0000-000000000001",
        "start_at": _t("2027-03-01T00:00:00+00:00"),
        "interval": None,
        "cron": "0 9 * * 1",
        "timezone": BERLIN,
        "end_at": None,
        "dst_gap": "",
        "dst_fold": "",
        "max_runs": None,
        "jitter": timedelta(0),
        "misfire_policy": "run_once",
        "misfire_grace": timedelta(seconds=60),
        "catch_up_limit": 100,
        "overlap_policy": "allow",
        "max_concurrency": None,
        "has_limits": False,
        "priority": 5,
        "next_run_at": _t("2027-03-29T07:00:00+00:00"),  # Easter Monday 09:00 CEST
        "runs_materialised": 0,
        "paused_at": None,
        "owner_id": 1,
        "team_id": 1,
        "calendar_id": 1,
        "calendar_policy": "previous_business_day",
    }
    return DueTask(**{**values, **fields})


DE_WEEKENDS = CalendarRules(name="de", country="DE", weekends_closed=True)


def test_a_move_back_to_a_time_already_past_is_skipped_not_run_late():
    from datetime import timedelta

    from executions.materialiser import plan_task

    # Planned on Saturday 27 March at noon (a task created then): Easter Monday moves back to
    # Thursday 25 March 08:00Z, two days past: recorded as a holiday, not run.
    now = _t("2027-03-27T12:00:00+00:00")
    plan = plan_task(_due(), now=now, until=now + timedelta(hours=1), calendars={1: DE_WEEKENDS})
    assert plan.rows == []
    assert [(row.scheduled_for.isoformat(), row.reason) for row in plan.skipped] == [
        ("2027-03-29T07:00:00+00:00", "holiday")
    ]
    assert "2027-03-25 09:00:00 CET had already passed" in plan.skipped[0].detail
    assert plan.next_run_at == _t("2027-04-05T07:00:00+00:00")  # the Monday after


def test_a_missed_fire_time_kept_as_catch_up_runs_at_its_moved_time():
    from datetime import timedelta

    from executions.materialiser import plan_task

    # Planned on Easter Monday at noon, five hours after its 07:00Z fire time (an outage):
    # run_once keeps it, and it runs as moved, at Thursday 25 March 08:00Z (due at once).
    now = _t("2027-03-29T12:00:00+00:00")
    plan = plan_task(_due(), now=now, until=now + timedelta(hours=1), calendars={1: DE_WEEKENDS})
    assert [(row.scheduled_for.isoformat(), row.moved_from.isoformat()) for row in plan.rows] == [
        ("2027-03-25T08:00:00+00:00", "2027-03-29T07:00:00+00:00")
    ]
