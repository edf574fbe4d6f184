"""DST rules chosen per task (issue 32): ``dst_gap`` (``shift``/``skip``) and ``dst_fold``
(``first``/``second``/``both``); empty keeps the hour field's rule.

Each expected instant was worked out by hand from the zones' rules, not by running the engine.
2027, Europe/Berlin: clocks go from 02:00 CET (+01:00) to 03:00 CEST (+02:00) on 28 March (01:00
UTC), and from 03:00 CEST back to 02:00 CET on 31 October (01:00 UTC), so 02:00-02:59 is shown
twice, first at 00:00-00:59 UTC and again at 01:00-01:59 UTC. America/New_York: 01:00-01:59 is
shown twice on 7 November 2027, EDT (-04:00, 05:xx UTC) then EST (-05:00, 06:xx UTC).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import islice

import pytest

from tasks_app.schedules import Schedule, ScheduleError, dst_note

BERLIN, NEW_YORK = "Europe/Berlin", "America/New_York"


def _fires(cron: str, zone: str, since: str, count: int, gap: str = "", fold: str = "") -> list[str]:
    start = datetime.fromisoformat(since)
    schedule = Schedule(start_at=start, cron=cron, timezone=zone, dst_gap=gap, dst_fold=fold)
    return [when.strftime("%m-%d %H:%M") for when in islice(schedule.fire_times(), count)]


@pytest.mark.parametrize(
    ("cron", "zone", "since", "gap", "fold", "expected"),
    [
        # 02:30 does not exist on 28 March: shifted to 03:00 CEST (01:00 UTC), or skipped.
        ("30 2 * * *", BERLIN, "2027-03-27T00:00:00Z", "", "", ["03-27 01:30", "03-28 01:00", "03-29 00:30"]),
        ("30 2 * * *", BERLIN, "2027-03-27T00:00:00Z", "shift", "", ["03-27 01:30", "03-28 01:00", "03-29 00:30"]),
        ("30 2 * * *", BERLIN, "2027-03-27T00:00:00Z", "skip", "", ["03-27 01:30", "03-29 00:30", "03-30 00:30"]),
        # 02:30 shown twice on 31 October: CEST 00:30 UTC, CET 01:30 UTC.
        ("30 2 * * *", BERLIN, "2027-10-30T00:00:00Z", "", "", ["10-30 00:30", "10-31 00:30", "11-01 01:30"]),
        ("30 2 * * *", BERLIN, "2027-10-30T00:00:00Z", "", "second", ["10-30 00:30", "10-31 01:30", "11-01 01:30"]),
        (
            "30 2 * * *", BERLIN, "2027-10-30T00:00:00Z", "", "both",
            ["10-30 00:30", "10-31 00:30", "10-31 01:30", "11-01 01:30"],
        ),
        # A clock-following expression repeats the hour by default; "first" pauses it, "second"
        # starts at the repeat.
        (
            "*/30 * * * *", BERLIN, "2027-10-31T00:00:00Z", "", "",
            ["10-31 00:00", "10-31 00:30", "10-31 01:00", "10-31 01:30", "10-31 02:00"],
        ),
        (
            "*/30 * * * *", BERLIN, "2027-10-31T00:00:00Z", "", "first",
            ["10-31 00:00", "10-31 00:30", "10-31 02:00", "10-31 02:30"],
        ),
        (
            "*/30 * * * *", BERLIN, "2027-10-31T00:00:00Z", "", "second",
            ["10-31 01:00", "10-31 01:30", "10-31 02:00"],
        ),
        # Clock-following skips what the gap took by default; "shift" fires 02:05 once at 03:00 CEST.
        ("5 * * * *", BERLIN, "2027-03-28T00:00:00Z", "", "", ["03-28 00:05", "03-28 01:05"]),
        ("5 * * * *", BERLIN, "2027-03-28T00:00:00Z", "shift", "", ["03-28 00:05", "03-28 01:00", "03-28 01:05"]),
        # New York, 01:30 on 7 November: EDT 05:30 UTC first, EST 06:30 UTC second.
        ("30 1 * * *", NEW_YORK, "2027-11-06T00:00:00Z", "", "second", ["11-06 05:30", "11-07 06:30", "11-08 06:30"]),
        ("30 1 * * *", NEW_YORK, "2027-11-06T00:00:00Z", "", "first", ["11-06 05:30", "11-07 05:30", "11-08 06:30"]),
    ],
)  # fmt: skip
def test_dst_rules_worked_out_by_hand(cron, zone, since, gap, fold, expected):
    assert _fires(cron, zone, since, len(expected), gap, fold) == expected


def test_the_rule_that_decided_an_instant_is_said():
    shifted = datetime(2027, 3, 28, 1, 0, tzinfo=UTC)
    assert dst_note("30 2 * * *", BERLIN, shifted) == (
        "dst_gap=shift: the clock skipped 02:00-03:00 on 2027-03-28; the skipped 02:30:00 fired once here, "
        "when the clock showed 03:00"
    )
    second = datetime(2027, 10, 31, 1, 30, tzinfo=UTC)
    assert dst_note("30 2 * * *", BERLIN, second, fold="second") == (
        "dst_fold=second: 02:30:00 occurs twice on 2027-10-31 (the clock is set back); this is its second "
        "occurrence (CET), not at its first"
    )
    # An ordinary day says nothing.
    assert dst_note("30 2 * * *", BERLIN, datetime(2027, 10, 30, 0, 30, tzinfo=UTC)) == ""


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "0 2 * * *", "dst_gap": "later"}, "dst_gap must be one of shift, skip"),
        ({"cron": "0 2 * * *", "dst_fold": "last"}, "dst_fold must be one of first, second, both"),
        ({"interval": timedelta(hours=1), "dst_fold": "both"}, "apply to cron schedules only"),
    ],
)
def test_bad_rules_are_refused(kwargs, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule(start_at=datetime(2027, 1, 1, tzinfo=UTC), **kwargs)


# --- a task's own rules, through the API and the back office -------------------------------------


@pytest.mark.django_db
def test_a_task_keeps_its_dst_rules_plans_by_them_and_says_which_applied(api_client):
    body = {
        "runner": "noop",
        "cron": "30 2 * * *",
        "timezone": BERLIN,
        "start_at": "2027-10-30T00:00:00Z",
        "dst_fold": "second",
    }
    created = api_client.post("/api/v1/tasks", body, format="json")
    assert created.status_code == 201, created.content
    task = created.json()
    assert (task["dst_gap"], task["dst_fold"]) == ("", "second")
    preview = api_client.get(f"/api/v1/tasks/{task['id']}/preview", {"after": "2027-10-30T00:00:00Z", "count": 3})
    times = preview.json()["fire_times"]
    # 02:30 on 31 October at its second occurrence (CET, 01:30 UTC), and the preview says why.
    assert [t["utc"] for t in times] == ["2027-10-30T00:30:00Z", "2027-10-31T01:30:00Z", "2027-11-01T01:30:00Z"]
    assert times[0]["dst"] == "" and times[1]["dst"].startswith("dst_fold=second: 02:30:00 occurs twice")
    why = api_client.get(f"/api/v1/tasks/{task['id']}/why", {"at": "2027-10-31T00:30:00Z"}).json()
    assert why["verdict"] == "not_a_fire_time"
    assert why["dst"].startswith("dst_fold=second: 02:30:00 occurs twice") and "first occurrence (CEST)" in why["dst"]
    # A change of the rule re-plans the schedule and is in the audit trail.
    patched = api_client.patch(f"/api/v1/tasks/{task['id']}", {"dst_fold": "both"}, format="json")
    assert patched.status_code == 200 and patched.json()["dst_fold"] == "both"
    preview = api_client.get(f"/api/v1/tasks/{task['id']}/preview", {"after": "2027-10-31T00:00:00Z", "count": 2})
    assert [t["utc"] for t in preview.json()["fire_times"]] == ["2027-10-31T00:30:00Z", "2027-10-31T01:30:00Z"]
    audit = api_client.get("/api/v1/audit", {"object_id": task["id"]}).json()["results"]
    assert any(entry["changes"].get("dst_fold") == {"from": "second", "to": "both"} for entry in audit), audit


@pytest.mark.django_db
def test_schedule_preview_applies_the_rules_given(api_client):
    body = {"cron": "30 2 * * *", "timezone": BERLIN, "start_at": "2027-03-27T00:00:00Z", "count": 3}
    shifted = api_client.post("/api/v1/schedules/preview", body, format="json").json()["fire_times"]
    skipped = api_client.post("/api/v1/schedules/preview", {**body, "dst_gap": "skip"}, format="json").json()
    assert [t["utc"] for t in shifted] == ["2027-03-27T01:30:00Z", "2027-03-28T01:00:00Z", "2027-03-29T00:30:00Z"]
    assert shifted[1]["dst"].startswith("dst_gap=shift: the clock skipped 02:00-03:00 on 2027-03-28")
    assert [t["utc"] for t in skipped["fire_times"]] == [
        "2027-03-27T01:30:00Z",
        "2027-03-29T00:30:00Z",
        "2027-03-30T00:30:00Z",
    ]
    # The day the gap swallowed is said, on the fire time after it (issue 44 item 12), not dropped
    # silently; the others have no note.
    notes = [t["dst"] for t in skipped["fire_times"]]
    assert notes[0] == "" and notes[2] == ""
    assert notes[1] == "dst_gap=skip: the clock skipped 02:00-03:00 on 2027-03-28; 02:30:00 did not fire that day"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"interval": "1h", "dst_gap": "skip"}, "dst_gap", "Applies to cron schedules only"),
        ({"dst_fold": "second"}, "dst_fold", "Applies to cron schedules only"),
        ({"cron": "0 2 * * *", "dst_fold": "last"}, "dst_fold", "is not a valid choice"),
    ],
)
def test_dst_rules_that_would_do_nothing_or_are_unknown_are_a_400_on_the_field(api_client, body, field, message):
    from tasks_app.models import Task

    response = api_client.post("/api/v1/tasks", {"runner": "noop", **body}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["errors"]) == [field] and message in response.json()["errors"][field][0]
    assert Task.objects.count() == 0


@pytest.mark.django_db
def test_the_back_office_edits_the_rules_and_shows_them(client, user):
    from tasks_api.creation import task_create

    task = task_create(owner=user, runner="noop", cron="30 2 * * *", timezone=BERLIN)
    client.force_login(user)
    page = client.get(f"/ui/tasks/{task.pk}/")
    assert "clock set forward: shift; set back: first (by the hour field)" in page.content.decode()
    edit = client.get(f"/ui/tasks/{task.pk}/edit/")
    assert edit.status_code == 200 and 'name="dst_fold"' in edit.content.decode()
