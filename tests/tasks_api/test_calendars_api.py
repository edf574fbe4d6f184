"""``/api/v1/calendars`` and a task's ``calendar`` / ``calendar_policy`` through the API (issue 32).

Instants: Germany 2027, Good Friday Friday 26 March (09:00 CET = 08:00Z), Easter Monday Monday
29 March (09:00 CEST = 07:00Z; the clock changed on Sunday 28 March); worked out by hand.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from executions.materialiser import materialise_task
from executions.models import Execution, ExecutionStatus, SkippedOccurrence
from tasks_app.models import AuditEntry, Calendar, Task

pytestmark = pytest.mark.django_db

FRIDAYS = {"runner": "noop", "cron": "0 9 * * 5", "timezone": "Europe/Berlin", "start_at": "2027-03-01T00:00:00Z"}


def _calendar(client, **body):
    response = client.post("/api/v1/calendars", {"name": "de", "country": "DE", **body}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_the_minimal_form_defines_a_calendar_and_lists_its_closed_days(api_client):
    calendar = _calendar(api_client)
    assert calendar["country"] == "DE" and calendar["weekends_closed"] is False
    assert calendar["weekend_days"] == [6, 7] and calendar["extra_dates"] == [] and calendar["tasks"] == 0
    days = api_client.get(f"/api/v1/calendars/{calendar['id']}/days?from=2027-03-25&to=2027-03-31")
    assert days.status_code == 200
    assert days.json() == [
        {"date": "2027-03-26", "reason": "Good Friday"},
        {"date": "2027-03-29", "reason": "Easter Monday"},
    ]
    assert AuditEntry.objects.filter(action="calendar.create").count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"country": "XX"}, "country"),
        ({"country": "DE", "subdivision": "ZZ"}, "subdivision"),
        ({"country": "", "subdivision": "BY"}, "subdivision"),
        ({"country": "DE", "weekend_days": [6, 6]}, "weekend_days"),
        ({"country": "", "extra_dates": [{"start": "2027-01-01", "end": "2027-03-01"}]}, "extra_dates"),
        ({"country": "", "extra_dates": [{"start": "2027-01-05", "end": "2027-01-01"}]}, "extra_dates"),
        ({"country": ""}, "country"),
    ],
)
def test_bad_input_is_a_400_on_its_field_and_writes_nothing(api_client, body, field):
    response = api_client.post("/api/v1/calendars", {"name": "x", **body}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["errors"]) == [field]
    assert Calendar.objects.count() == 0


def test_ranges_that_make_more_than_31_closed_days_in_a_row_are_refused(api_client):
    # 28 days (Monday 1 to Sunday 28 February 2027) plus the weekend of 27-28 ... and Monday 1
    # March to Wednesday 3 March: two ranges meeting make 31 + the weekend before = 33 days.
    body = {
        "weekends_closed": True,
        "country": "",
        "extra_dates": [
            {"start": "2027-02-01", "end": "2027-02-28", "label": "a"},
            {"start": "2027-03-01", "end": "2027-03-03", "label": "b"},
        ],
    }
    response = api_client.post("/api/v1/calendars", {"name": "long", **body}, format="json")
    assert response.status_code == 400
    assert "33 days in a row from 2027-01-30" in response.json()["errors"]["extra_dates"][0]


def test_a_task_takes_a_calendar_by_name_with_skip_by_default(api_client):
    _calendar(api_client)
    response = api_client.post("/api/v1/tasks", {**FRIDAYS, "calendar": "de"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["calendar"] == "de" and response.json()["calendar_policy"] == "skip"


def test_another_owners_calendar_is_a_400_that_does_not_say_it_exists(api_client, other_client):
    _calendar(other_client, name="theirs")
    response = api_client.post("/api/v1/tasks", {**FRIDAYS, "calendar": "theirs"}, format="json")
    missing = api_client.post("/api/v1/tasks", {**FRIDAYS, "calendar": "nobody-has-it"}, format="json")
    assert response.status_code == missing.status_code == 400
    assert list(response.json()["errors"]) == ["calendar"]
    assert response.json()["errors"]["calendar"][0] == missing.json()["errors"]["calendar"][0].replace(
        "nobody-has-it", "theirs"
    )
    assert Task.objects.count() == 0


def test_a_policy_without_a_calendar_is_a_400_on_calendar_policy(api_client):
    response = api_client.post("/api/v1/tasks", {**FRIDAYS, "calendar_policy": "next_business_day"}, format="json")
    assert response.status_code == 400
    assert list(response.json()["errors"]) == ["calendar_policy"]


def test_a_calendar_in_use_cannot_be_deleted(api_client):
    calendar = _calendar(api_client)
    task = api_client.post("/api/v1/tasks", {**FRIDAYS, "calendar": "de"}, format="json").json()
    response = api_client.delete(f"/api/v1/calendars/{calendar['id']}")
    assert response.status_code == 409 and task["id"] in response.json()["detail"]
    assert Calendar.objects.count() == 1
    assert api_client.patch(f"/api/v1/tasks/{task['id']}", {"calendar": None}, format="json").status_code == 200
    assert Task.objects.get().calendar_policy == ""
    assert api_client.delete(f"/api/v1/calendars/{calendar['id']}").status_code == 204


def test_the_preview_marks_moved_and_skipped_fire_times(api_client):
    _calendar(api_client, weekends_closed=True)
    body = {**FRIDAYS, "start_at": "2027-03-19T00:00:00Z", "count": 2, "calendar": "de"}
    del body["runner"]
    moved = api_client.post(
        "/api/v1/schedules/preview", {**body, "calendar_policy": "next_business_day"}, format="json"
    ).json()["fire_times"]
    # Friday 19 March 09:00 CET (08:00Z) runs; Good Friday moves to Tuesday 30 March 09:00 CEST (07:00Z).
    assert [(t["utc"], t["calendar"], t["runs_at"]) for t in moved] == [
        ("2027-03-19T08:00:00Z", "", "2027-03-19T08:00:00Z"),
        ("2027-03-26T08:00:00Z", "moved", "2027-03-30T07:00:00Z"),
    ]
    assert moved[1]["calendar_reason"].startswith("Good Friday (de): moved to 2027-03-30 09:00:00 CEST")
    skipped = api_client.post("/api/v1/schedules/preview", body, format="json").json()["fire_times"]
    assert (skipped[1]["calendar"], skipped[1]["runs_at"], skipped[1]["calendar_reason"]) == (
        "skipped",
        None,
        "Good Friday (de)",
    )


def test_why_answers_holiday_and_moved(api_client):
    _calendar(api_client, weekends_closed=True)
    task = api_client.post(
        "/api/v1/tasks", {**FRIDAYS, "calendar": "de", "calendar_policy": "next_business_day"}, format="json"
    ).json()
    materialise_task(task_id=task["id"], until=datetime.fromisoformat("2027-04-01T00:00:00+00:00"))
    why = api_client.get(f"/api/v1/tasks/{task['id']}/why", {"at": "2027-03-26T08:00:00Z"}).json()
    assert why["verdict"] == "moved" and "moved to 2027-03-30 09:00:00 CEST" in why["reason"]
    assert why["execution"]["moved_from"] == "2027-03-26T08:00:00Z"
    there = api_client.get(f"/api/v1/tasks/{task['id']}/why", {"at": "2027-03-30T07:00:00Z"}).json()
    assert there["verdict"] == "upcoming" and "moved here" in there["reason"]
    execution = api_client.get(f"/api/v1/executions/{there['execution']['id']}").json()
    assert execution["moved_from"] == "2027-03-26T08:00:00Z" and execution["scheduled_for"] == "2027-03-30T07:00:00Z"
    api_client.patch(f"/api/v1/tasks/{task['id']}", {"calendar_policy": "skip"}, format="json")
    # Not planned again yet (further than the horizon): what the calendar will do.
    why = api_client.get(f"/api/v1/tasks/{task['id']}/why", {"at": "2027-03-26T08:00:00Z"}).json()
    assert why["verdict"] == "holiday" and why["reason"].endswith(
        "Its day is closed: Good Friday (calendar de): it will not run."
    )
    materialise_task(task_id=task["id"], until=datetime.fromisoformat("2027-04-01T00:00:00+00:00"))
    why = api_client.get(f"/api/v1/tasks/{task['id']}/why", {"at": "2027-03-26T08:00:00Z"}).json()
    assert why["verdict"] == "holiday" and why["reason"] == "Skipped: its day is closed, Good Friday (calendar de)."


def test_why_s_next_list_notes_the_closed_days(api_client, client, user):
    """Issue 44 item 12: why's next fire times listed Good Friday like any other day."""
    _calendar(api_client, weekends_closed=True)
    task = api_client.post("/api/v1/tasks", {**FRIDAYS, "calendar": "de"}, format="json").json()
    why = api_client.get(f"/api/v1/tasks/{task['id']}/why", {"at": "2027-03-20T08:00:00Z"}).json()
    pairs = list(zip(why["next_fire_times"], why["next_notes"], strict=True))
    assert pairs[:2] == [
        ("2027-03-26T08:00:00Z", "closed day, will not run: Good Friday (de)"),
        ("2027-04-02T07:00:00Z", ""),
    ]
    api_client.patch(f"/api/v1/tasks/{task['id']}", {"calendar_policy": "next_business_day"}, format="json")
    why = api_client.get(f"/api/v1/tasks/{task['id']}/why", {"at": "2027-03-20T08:00:00Z"}).json()
    assert why["next_notes"][0] == "closed day, Good Friday (de): moved to 2027-03-30 09:00:00 CEST (next_business_day)"
    client.force_login(user)
    page = client.get(f"/ui/tasks/{task['id']}/", {"at": "2027-03-20T09:00"}).content.decode()
    assert (
        "03-26 09:00:00 (closed day, Good Friday (de): moved to 2027-03-30 09:00:00 CEST (next_business_day))" in page
    )


def test_a_calendar_change_replans_the_future_scheduled_runs_only(api_client, user):
    calendar = _calendar(api_client)
    task_id = api_client.post("/api/v1/tasks", {**FRIDAYS, "calendar": "de"}, format="json").json()["id"]
    # Fridays 5 March to 23 April 2027 (09:00 CET = 08:00Z to 26 March, then 07:00Z): eight
    # fire times, Good Friday (26 March) skipped: seven runs.
    materialise_task(task_id=task_id, until=datetime.fromisoformat("2027-04-24T00:00:00+00:00"))
    live = Execution.objects.filter(task_id=task_id, superseded=False)
    assert live.count() == 7
    first = live.order_by("scheduled_for").first()
    # The first one (5 March) is already PENDING (published): a change leaves it alone.
    Execution.objects.filter(pk=first.pk).update(status=ExecutionStatus.PENDING)
    # Close 9 to 16 April; Fridays 9 and 16 April are then skipped too.
    response = api_client.patch(
        f"/api/v1/calendars/{calendar['id']}",
        {"extra_dates": [{"start": "2027-04-09", "end": "2027-04-16", "label": "audit"}]},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert Execution.objects.filter(task_id=task_id, superseded=True).count() == 6  # the SCHEDULED ones
    # Planned again up to the horizon at once; the later ones by the materialiser's passes.
    materialise_task(task_id=task_id, until=datetime.fromisoformat("2027-04-24T00:00:00+00:00"))
    assert Execution.objects.get(pk=first.pk).status == ExecutionStatus.PENDING
    assert live.count() == 5  # 5 March (pending), 12 and 19 March, 2 and 23 April
    assert sorted(when.isoformat() for when in live.values_list("scheduled_for", flat=True))[3:] == [
        "2027-04-02T07:00:00+00:00",
        "2027-04-23T07:00:00+00:00",
    ]
    holidays = SkippedOccurrence.objects.filter(task_id=task_id, reason="holiday").order_by("scheduled_for")
    assert [row.detail for row in holidays] == [
        "Good Friday (calendar de)",
        "audit (calendar de)",
        "audit (calendar de)",
    ]


def test_staff_read_other_owners_calendars_but_do_not_change_them(api_client, staff_client):
    calendar = _calendar(api_client)
    assert staff_client.get(f"/api/v1/calendars/{calendar['id']}").status_code == 200
    assert staff_client.patch(f"/api/v1/calendars/{calendar['id']}", {"name": "x"}, format="json").status_code == 403


def test_another_owner_does_not_see_a_calendar(api_client, other_client):
    calendar = _calendar(api_client)
    assert other_client.get(f"/api/v1/calendars/{calendar['id']}").status_code == 404
    assert other_client.get(f"/api/v1/calendars/{calendar['id']}/days").status_code == 404


@pytest.mark.parametrize("query", ["to=", "from=2027-3-1", "from=20270301", "from=2027-03-01&to=2028-04-01"])
def test_closed_days_refuse_a_bad_or_too_long_range_with_a_400(api_client, query):
    calendar = _calendar(api_client)
    response = api_client.get(f"/api/v1/calendars/{calendar['id']}/days?{query}")
    assert response.status_code == 400, response.content


def test_the_task_page_shows_the_calendar_and_its_effect_on_the_timeline(client, user, api_client):
    _calendar(api_client, weekends_closed=True)
    task = api_client.post(
        "/api/v1/tasks", {**FRIDAYS, "calendar": "de", "calendar_policy": "next_business_day"}, format="json"
    ).json()
    materialise_task(task_id=task["id"], until=datetime.fromisoformat("2027-04-01T00:00:00+00:00"))
    client.force_login(user)
    page = client.get(f"/ui/tasks/{task['id']}/", {"from": "2027-03-25T00:00", "to": "2027-03-31T00:00"})
    text = page.content.decode()
    assert "Business calendar" in text and "de: next_business_day" in text
    # Good Friday's fire time (09:00 local) says where it went, and the run at Tuesday 09:00 where it came from.
    assert "moved to 2027-03-30 09:00:00 CEST (next_business_day): Good Friday (calendar de)" in text
    assert "moved here from 2027-03-26 09:00:00 CET by the task&#x27;s calendar" in text
    edit = client.get(f"/ui/tasks/{task['id']}/edit/").content.decode()
    assert 'name="calendar"' in edit and 'name="calendar_policy"' in edit


def test_the_admin_defines_a_calendar_through_the_services(client, django_user_model, user):
    boss = django_user_model.objects.create_superuser(username="boss", password="boss-password")
    client.force_login(boss)
    response = client.post(
        "/admin/tasks_app/calendar/add/",
        {
            "owner": user.pk,
            "name": "by",
            "country": "DE",
            "subdivision": "XX",
            "weekend_days": "[6, 7]",
            "extra_dates": "[]",
        },
    )
    assert response.status_code == 200 and "is not a subdivision of DE" in response.content.decode()
    response = client.post(
        "/admin/tasks_app/calendar/add/",
        {
            "owner": user.pk,
            "name": "by",
            "country": "DE",
            "subdivision": "by",
            "weekend_days": "[6, 7]",
            "extra_dates": "[]",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    calendar = Calendar.objects.get()
    assert (calendar.owner, calendar.subdivision) == (user, "BY")
    assert AuditEntry.objects.filter(action="calendar.create").count() == 1
    assert "Tasks using it" in client.get("/admin/tasks_app/calendar/").content.decode()


def test_the_next_run_of_a_task_whose_calendar_closes_today_is_on_the_next_open_day(api_client, client, user):
    """Its next fire time is today, which the calendar closes: the task's next run (API, task list,
    task page) is where the calendar puts it, not the fire time (it read "today" before)."""
    from datetime import UTC, timedelta

    from django.utils import timezone

    today = timezone.now().astimezone(UTC).date()
    shutdown = {"start": today.isoformat(), "end": (today + timedelta(days=2)).isoformat(), "label": "shutdown"}
    _calendar(api_client, name="plant", extra_dates=[shutdown])
    task = api_client.post(
        "/api/v1/tasks",
        {"runner": "noop", "cron": "*/5 * * * *", "calendar": "plant", "calendar_policy": "next_business_day"},
        format="json",
    ).json()
    first_open = datetime.combine(today + timedelta(days=3), datetime.min.time(), tzinfo=UTC)

    shown = datetime.fromisoformat(api_client.get(f"/api/v1/tasks/{task['id']}").json()["next_run_at"])
    assert first_open <= shown < first_open + timedelta(days=1)
    listed = api_client.get("/api/v1/tasks").json()["results"]
    assert [datetime.fromisoformat(row["next_run_at"]) for row in listed] == [shown]
    client.force_login(user)
    page = client.get(f"/ui/tasks/{task['id']}/").content.decode()
    assert f"({shown:%H:%M:%S} UTC)" in page or f"Next run: {shown.strftime('%a %Y-%m-%d %H:%M:%S')}" in page
    assert "calendar-note" in page and "shutdown (plant): moved to" in page
