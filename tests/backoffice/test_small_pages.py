"""Smaller things a person meets (issue 28, item 16): admin messages keep a task name's case,
admin times are shown to the second, the New-task form says the name is optional, a mistyped
URL gets the back office's not-found page even with DEBUG on (as ``make run`` sets it), and
every page names an icon (no /favicon.ico 404 per page)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client

from tasks_api.creation import task_create
from tests.backoffice.helpers import run

pytestmark = pytest.mark.django_db

MICROSECONDS = re.compile(r"\d\d:\d\d:\d\d\.\d{6}")


@pytest.fixture
def boss(django_user_model):
    user = django_user_model.objects.create_superuser(username="boss", password="boss-password")
    client = Client()
    client.force_login(user)
    return user, client


def test_admin_messages_keep_the_task_names_case(boss):
    user, client = boss
    task = task_create(owner=user, runner="noop", name="sleep-3s", interval=timedelta(minutes=5))
    page = client.post(
        "/admin/tasks_app/task/", {"action": "pause_selected", "_selected_action": [str(task.pk)]}, follow=True
    ).content.decode()
    assert "sleep-3s: paused;" in page
    assert "Sleep-3s" not in page


def test_admin_task_pages_show_times_to_the_second(boss):
    user, client = boss
    task = task_create(owner=user, runner="noop", name="every minute", cron="* * * * *")
    run(task)
    for path in ("/admin/tasks_app/task/", f"/admin/tasks_app/task/{task.pk}/change/"):
        page = client.get(path).content.decode()
        assert not MICROSECONDS.findall(page), (path, MICROSECONDS.findall(page)[:3])


def test_the_new_task_form_says_the_name_is_optional(boss):
    _, client = boss
    page = client.get("/ui/tasks/").content.decode()
    assert re.search(r'<span class="label">Name \(optional\)</span>', page)
    assert "Empty: the task is shown by its id." in page


@pytest.mark.parametrize("debug", [True, False])
def test_a_mistyped_url_gets_the_styled_not_found_page(boss, settings, debug):
    settings.DEBUG = debug
    _, client = boss
    response = client.get("/ui/taks/")
    page = response.content.decode()
    assert response.status_code == 404
    assert 'id="not-found"' in page and "backoffice.css" in page and "/ui/taks/" in page
    assert "URLconf" not in page and "DEBUG = True" not in page
    # The API still answers its own JSON shape.
    api = client.get("/api/v1/no-such-thing")
    assert api.status_code == 404 and api.json()["type"] == "not_found"
    # Another user's object, a 404 raised by a view, reads the same.
    assert 'id="not-found"' in client.get("/ui/executions/999999/").content.decode()


def test_every_page_names_an_icon_and_favicon_ico_leads_to_it(boss):
    _, client = boss
    for path in ("/", "/ui/tasks/", "/admin/", "/admin/tasks_app/task/"):
        assert 'rel="icon" href="/static/backoffice/favicon.svg"' in client.get(path).content.decode(), path
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/backoffice/favicon.svg"
    assert Client().get("/ui/login/").content.decode().count('rel="icon"') == 1
