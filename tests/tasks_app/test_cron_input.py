"""Cron expressions as they come in: ASCII only, in every place a cron is taken (issue 26, defect 5).

``str.isdigit`` accepts superscripts (U+00B9, which ``int`` then refuses: a 500), other scripts'
digits (U+0665, U+FF10, U+1D7D3, which ``int`` reads as numbers) and ``str.split`` splits fields
on a no-break space. Each of these is a 400 on the cron field, and nothing is created or changed.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from executions.models import Execution
from tasks_api.creation import task_create
from tasks_app.models import Task
from tasks_app.schedules import ScheduleError, validate_cron

pytestmark = pytest.mark.django_db

#: (expression, what the message must name). Each one was a 500 or was read as something else.
NOT_ASCII = [
    pytest.param("0 0 \u00b9 * *", r"U\+00B9 SUPERSCRIPT ONE\) in the day-of-month field", id="superscript-one"),
    pytest.param("\u0665 * * * *", r"U\+0665 ARABIC-INDIC DIGIT FIVE\) in the minute field", id="arabic-indic-five"),
    pytest.param("\uff10 \uff10 * * *", r"U\+FF10 FULLWIDTH DIGIT ZERO\) in the minute field", id="fullwidth-zero"),
    pytest.param("\U0001d7d3 * * * *", r"U\+1D7D3 MATHEMATICAL BOLD DIGIT FIVE", id="bold-five"),
    pytest.param("*/\U0001d7d3 * * * *", r"U\+1D7D3", id="bold-five-step"),
    pytest.param("0 0 1-\u00b2 * *", r"U\+00B2 SUPERSCRIPT TWO", id="superscript-in-range"),
    pytest.param("0\u00a00 * * * *", r"U\+00A0 NO-BREAK SPACE", id="no-break-space"),
    pytest.param("0 0\u2003* * *", r"U\+2003 EM SPACE", id="em-space"),
    pytest.param("0 0 * * *\u3000", r"U\+3000 IDEOGRAPHIC SPACE", id="ideographic-space-at-end"),
    pytest.param("0 0 1 * *\n0 0 2 * *", r"U\+000A\)", id="newline"),
    pytest.param("0 0 * * \uff4don", r"U\+FF4D FULLWIDTH LATIN SMALL LETTER M", id="fullwidth-letter"),
]


@pytest.mark.parametrize(("expression", "message"), NOT_ASCII)
def test_non_ascii_characters_are_named_in_the_error(expression, message):
    with pytest.raises(ScheduleError, match=message):
        validate_cron(expression)


def test_ascii_spaces_and_tabs_still_separate_fields():
    validate_cron("\t0  0\t* * *  ")  # crontab(5): blanks are spaces and tabs


# --- the API --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("expression", "message"), NOT_ASCII)
def test_task_create_answers_400_on_cron_and_creates_nothing(api_client, expression, message):
    response = api_client.post("/api/v1/tasks", {"runner": "noop", "cron": expression}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["errors"]) == ["cron"]
    assert "is not allowed" in response.json()["errors"]["cron"][0]
    assert Task.objects.count() == 0 and Execution.objects.count() == 0


@pytest.mark.parametrize(("expression", "message"), NOT_ASCII)
def test_task_patch_answers_400_on_cron_and_changes_nothing(api_client, user, expression, message):
    task = task_create(owner=user, runner="noop", cron="0 3 * * *", start_at=timezone.now() + timedelta(hours=1))
    runs = sorted(Execution.objects.filter(task=task).values_list("pk", "status"))
    response = api_client.patch(f"/api/v1/tasks/{task.pk}", {"cron": expression}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["errors"]) == ["cron"]
    task.refresh_from_db()
    assert task.cron == "0 3 * * *"
    assert sorted(Execution.objects.filter(task=task).values_list("pk", "status")) == runs


@pytest.mark.parametrize(("expression", "message"), NOT_ASCII)
def test_schedule_preview_answers_400_on_cron(api_client, expression, message):
    response = api_client.post("/api/v1/schedules/preview", {"cron": expression}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()["errors"]) == ["cron"]


# --- the back office and the admin ----------------------------------------------------------------


def test_back_office_new_task_form_shows_the_error_on_cron(client, user):
    client.force_login(user)
    data = {"runner": "noop", "timezone": "UTC", "misfire_policy": "run_once", "overlap_policy": "allow"}
    response = client.post("/ui/tasks/", {**data, "cron": "0 0 \u00b9 * *"})
    assert response.status_code == 400
    assert "SUPERSCRIPT ONE" in " ".join(response.context["form"].errors["cron"])
    assert not Task.objects.exists()


def test_admin_add_form_shows_the_error_on_cron(admin_client):
    from tests.tasks_api.test_admin import _add

    response = _add(admin_client, name="bad", runner="noop", cron="\u0665 * * * *")
    errors = response.context["adminform"].form.errors
    assert response.status_code == 200 and "ARABIC-INDIC DIGIT FIVE" in " ".join(errors["cron"]), errors
    assert not Task.objects.exists()


# --- the expression in words, and the field order next to every cron field (defect 6b) -----------


def test_create_patch_and_previews_return_the_schedule_in_words(api_client):
    # croniter's six fields are seconds LAST: "0 0 * * * 1" is second 1 of every midnight there,
    # and hourly on Mondays here (seconds first). The words show the misreading at once.
    created = api_client.post("/api/v1/tasks", {"runner": "noop", "cron": "0 0 * * * 1"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["description"] == "Every hour, only on Monday (UTC)"
    task_id = created.json()["id"]
    patched = api_client.patch(
        f"/api/v1/tasks/{task_id}", {"cron": "0 9 * * MON-FRI", "timezone": "Europe/Berlin"}, format="json"
    )
    assert patched.status_code == 200, patched.content
    assert patched.json()["description"] == "At 09:00, Monday through Friday (Europe/Berlin)"
    assert api_client.get(f"/api/v1/tasks/{task_id}").json()["description"] == patched.json()["description"]
    task_preview = api_client.get(f"/api/v1/tasks/{task_id}/preview")
    assert task_preview.json()["description"] == "At 09:00, Monday through Friday (Europe/Berlin)"
    interval = api_client.patch(f"/api/v1/tasks/{task_id}", {"cron": "", "interval": "90m"}, format="json")
    assert interval.json()["description"] == "Every 1 hour 30 minutes"
    preview = api_client.post("/api/v1/schedules/preview", {"cron": "*/10 * * * * *", "count": 1}, format="json")
    assert preview.status_code == 200 and preview.json()["description"] == "Every 10 seconds (UTC)"


def test_preview_states_the_day_rule_in_words_and_times(api_client):
    # Vixie cron and cronie: a day field starting with "*" is unrestricted, so "1-7" and "*/7"
    # (Sunday) must both match: the first Sunday of the month.
    body = {"cron": "1 1 1-7 * */7", "start_at": "2026-01-01T00:00:00Z", "count": 3}
    preview = api_client.post("/api/v1/schedules/preview", body, format="json").json()
    assert preview["description"] == "At 01:01, between day 1 and 7 of the month, only on Sunday (UTC)"
    assert [t["utc"] for t in preview["fire_times"]] == [
        "2026-01-04T01:01:00Z",
        "2026-02-01T01:01:00Z",
        "2026-03-01T01:01:00Z",
    ]
    # Neither day field starts with "*": either may match, and the words say "or".
    body = {"cron": "0 0 13 * FRI", "start_at": "2026-02-01T00:00:00Z", "count": 3}
    preview = api_client.post("/api/v1/schedules/preview", body, format="json").json()
    assert preview["description"] == "At 00:00, on day 13 of the month or on Friday (UTC)"
    assert [t["utc"][:10] for t in preview["fire_times"]] == ["2026-02-06", "2026-02-13", "2026-02-20"]


def test_every_place_a_cron_is_entered_states_the_field_order(api_client, admin_client, client, user):
    schema = api_client.get("/api/schema/?format=json").json()["components"]["schemas"]
    order = "SECONDS FIRST: second minute hour day-of-month month day-of-week"
    taking = {name for name, body in schema.items() if "cron" in body.get("properties", {})} - {"Task", "TaskCreated"}
    assert {"SchedulePreviewRequest", "TaskCreateNoopRequest", "PatchedTaskUpdateKeepRunnerRequest"} <= taking
    for name in taking:
        assert order in schema[name]["properties"]["cron"]["description"], name
    for name in ("Task", "TaskCreated", "Preview"):
        assert "seconds first" in schema[name]["properties"]["description"]["description"], name
    client.force_login(user)
    assert order in client.get("/ui/tasks/").content.decode()
    assert order in admin_client.get("/admin/tasks_app/task/add/").content.decode()
