"""The business calendar pages (issue 46): the list with a new calendar's form, a calendar's page
(what it closes, its next closed days, the tasks using it, its edit form with its dates and rules,
its deletion), through the API's serializer and services (tasks_api.calendars), with the API's
role rule: members read, editors write; a viewer sees no write button and gets 403 on a POST."""

from __future__ import annotations

from datetime import date, timedelta

import pytest
from django.contrib.auth import get_user_model

from backoffice.calendar_views import extra_text, parse_extra
from tasks_api.calendars import calendar_create
from tasks_api.creation import task_create
from tasks_app.models import AuditEntry, Calendar
from tasks_app.teams.services import member_set, team_create


@pytest.fixture
def ops(db, user):
    team = team_create(creator=user, name="Ops", slug="ops")
    get_user_model().objects.create_user("vera")
    member_set(team=team, username="vera", role="viewer")
    return team


def test_extra_dates_read_and_written_a_line_each():
    items = parse_extra("2027-12-24..2027-12-31 winter shutdown\n\n2027-05-02 inventory\n2027-06-01")
    assert items == [
        {"start": "2027-12-24", "end": "2027-12-31", "label": "winter shutdown"},
        {"start": "2027-05-02", "end": "2027-05-02", "label": "inventory"},
        {"start": "2027-06-01", "end": "2027-06-01", "label": ""},
    ]
    assert extra_text(items) == "2027-12-24..2027-12-31 winter shutdown\n2027-05-02 inventory\n2027-06-01"
    with pytest.raises(ValueError, match="Line 1: start with a date"):
        parse_extra("2027-13-01 nope")


def _form(**fields):
    data = {"name": "Berlin office", "country": "", "subdivision": "", "weekend_days": ["6", "7"], "extra_dates": ""}
    data.update(fields)
    return data


def test_an_editor_creates_changes_and_deletes_a_calendar(alice_client, user, ops):
    made = alice_client.post(
        "/ui/calendars/new/",
        _form(team="ops", country="de", subdivision="BY", weekends_closed="on", extra_dates="2030-12-27 inventory"),
        follow=True,
    )
    calendar = Calendar.objects.get(name="Berlin office")
    assert "Calendar Berlin office created in team Ops" in made.content.decode()
    assert (calendar.team_id, calendar.country, calendar.subdivision, calendar.weekends_closed) == (
        ops.pk,
        "DE",
        "BY",
        True,
    )
    assert calendar.extra_dates == [{"start": "2030-12-27", "end": "2030-12-27", "label": "inventory"}]
    assert AuditEntry.objects.filter(action="calendar.create", object_id=str(calendar.pk)).exists()
    # Its page: what it closes and the next closed days (a weekend within 90 days, always).
    page = alice_client.get(f"/ui/calendars/{calendar.pk}/")
    assert page.status_code == 200 and "public holidays of DE (BY)" in page.content.decode()
    assert any(why == "weekend" for _, why in page.context["closed_days"])
    # The service's and the form's refusals, on their fields.
    bad = alice_client.post("/ui/calendars/new/", _form(team="ops", name="x", country="ZZ"))
    assert (
        bad.status_code == 400
        and "is not a country the holidays package knows" in bad.context["form"].errors["country"][0]
    )
    sub = alice_client.post("/ui/calendars/new/", _form(team="ops", name="x", country="DE", subdivision="XX"))
    assert "'XX' is not a subdivision of DE" in sub.context["form"].errors["subdivision"][0]
    empty = alice_client.post("/ui/calendars/new/", _form(team="ops", name="x"))
    assert "A calendar closes something" in empty.context["form"].errors["country"][0]
    lines = alice_client.post("/ui/calendars/new/", _form(team="ops", name="x", extra_dates="christmas"))
    assert lines.context["form"].errors["extra_dates"][0].startswith("Line 1: start with a date")
    backwards = alice_client.post(
        "/ui/calendars/new/", _form(team="ops", name="x", extra_dates="2030-01-05..2030-01-01 x")
    )
    assert backwards.context["form"].errors["extra_dates"] == ["Item 0: end is before start."]
    taken = alice_client.post("/ui/calendars/new/", _form(team="ops", weekends_closed="on"))
    assert taken.context["form"].errors["name"] == ["A calendar named 'Berlin office' exists already."]
    assert Calendar.objects.count() == 1
    # Edit: a range of extra dates and Friday-Saturday weekends; only what changed is sent.
    task = task_create(owner=user, team=ops, runner="noop", cron="0 9 * * *", calendar="Berlin office")
    saved = alice_client.post(
        f"/ui/calendars/{calendar.pk}/",
        _form(country="DE", subdivision="BY", weekends_closed="on", weekend_days=["5", "6"],
              extra_dates="2030-12-27..2030-12-30 inventory"),
        follow=True,
    )  # fmt: skip
    assert "Calendar Berlin office saved (extra_dates, weekend_days). The waiting runs" in saved.content.decode()
    calendar.refresh_from_db()
    assert calendar.weekend_days == [5, 6] and calendar.extra_dates[0]["end"] == "2030-12-30"
    assert str(task.pk) in saved.content.decode()  # listed among the tasks using it
    # In use: not deleted, and the message says by which task.
    kept = alice_client.post(f"/ui/calendars/{calendar.pk}/delete/", follow=True)
    assert f"is used by tasks ({task.pk})" in kept.content.decode() and Calendar.objects.filter(pk=calendar.pk).exists()
    spare = calendar_create(owner=user, team=ops, name="spare", weekends_closed=True)
    gone = alice_client.post(f"/ui/calendars/{spare.pk}/delete/", follow=True)
    assert "Calendar spare deleted." in gone.content.decode() and not Calendar.objects.filter(pk=spare.pk).exists()


def test_a_viewer_reads_and_is_refused_and_an_outsider_sees_nothing(client, user, ops):
    calendar = calendar_create(owner=user, team=ops, name="shared", weekends_closed=True)
    mine = calendar_create(owner=user, name="alices own", weekends_closed=True)
    client.force_login(get_user_model().objects.get(username="vera"))
    listed = client.get("/ui/calendars/").content.decode()
    assert f'id="calendar-{calendar.pk}"' in listed and f'id="calendar-{mine.pk}"' not in listed
    page = client.get(f"/ui/calendars/{calendar.pk}/").content.decode()
    assert 'id="read-only"' in page and 'id="calendar-form"' not in page and 'id="delete-calendar"' not in page
    assert client.post(f"/ui/calendars/{calendar.pk}/", _form(name="mine now", weekends_closed="on")).status_code == 403
    assert client.post(f"/ui/calendars/{calendar.pk}/delete/").status_code == 403
    refused = client.post("/ui/calendars/new/", _form(team="ops", name="sneaky", weekends_closed="on"))
    assert refused.status_code == 400 and "team" in refused.context["form"].errors
    assert client.get(f"/ui/calendars/{mine.pk}/").status_code == 404
    assert client.post(f"/ui/calendars/{mine.pk}/delete/").status_code == 404
    assert set(Calendar.objects.values_list("name", flat=True)) == {"shared", "alices own"}


def test_the_list_and_page_read_in_a_fixed_number_of_queries(alice_client, user, ops, django_assert_max_num_queries):
    """The list: one query for every calendar with its task count. The page: the next runs of at
    most PREVIEW_TASKS tasks placed by it (each one a preview), however many use it."""
    from backoffice.calendar_views import PREVIEW_TASKS

    first = calendar_create(owner=user, team=ops, name="c0", weekends_closed=True)
    for index in range(PREVIEW_TASKS):
        task_create(owner=user, team=ops, runner="noop", name=f"t{index}", cron="0 9 * * *", calendar="c0")
    with django_assert_max_num_queries(99) as few_list:
        alice_client.get("/ui/calendars/")
    with django_assert_max_num_queries(99) as few_page:
        alice_client.get(f"/ui/calendars/{first.pk}/")
    for index in range(1, 15):
        calendar_create(owner=user, team=ops, name=f"c{index}", country="FR", weekends_closed=True)
        task_create(owner=user, team=ops, runner="noop", name=f"u{index}", cron="0 9 * * *", calendar="c0")
    with django_assert_max_num_queries(len(few_list.captured_queries)):
        page = alice_client.get("/ui/calendars/")
    assert len(page.context["rows"]) == 15
    with django_assert_max_num_queries(len(few_page.captured_queries)):
        page = alice_client.get(f"/ui/calendars/{first.pk}/")
    total = PREVIEW_TASKS + 14
    assert page.context["calendar"].task_count == total and len(page.context["tasks"]) == total
    assert date.today() + timedelta(days=90) >= page.context["closed_days"][-1][0]
    # A daily 09:00 run skips the weekends: among its next 20 fire times, 5 or 6 are skipped.
    effects = page.context["effects"]
    assert [e["task"].name for e in effects] == [f"t{index}" for index in range(PREVIEW_TASKS)]
    assert all(e["looked"] == 20 and 5 <= len(e["changed"]) <= 6 for e in effects)
    assert {t.calendar for t in effects[0]["changed"]} == {"skipped"}
    assert "skipped (weekend (c0))" in page.content.decode()


def test_the_list_is_bounded_and_says_so(alice_client, user, monkeypatch):
    monkeypatch.setattr("backoffice.calendar_views.LIST_MOST", 2)
    for name in ("a", "b", "c"):
        calendar_create(owner=user, name=name, weekends_closed=True)
    page = alice_client.get("/ui/calendars/")
    assert [row["calendar"].name for row in page.context["rows"]] == ["a", "b"]
    assert 'id="list-cut">The first 2 by name' in page.content.decode()
