"""The task forms' team, "runs after", named limits and input schema, "Move to team…", and the
calendar and limit pages, in a real browser as a person uses them (issue 46): a wrong upstream
name is said on the pickers, the task is made in the team chosen and follows its upstream, a move
that the task's team-bound settings forbid is refused in words, a calendar is made from its
form. The new form is photographed at 1366x900 (``TMS_SCREENSHOT_DIR`` keeps the file)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from tasks_api.creation import task_create
from tasks_api.limits import limit_create
from tasks_app.models import Calendar, Task, TaskDependency
from tasks_app.teams.services import team_create
from tests.browser.axe import BLOCKING, axe_run, describe, impact_counts
from tests.browser.conftest import log_in, submit_and_wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _type(driver, name: str, value: str) -> None:
    field = driver.find_element(By.NAME, name)
    field.clear()
    field.send_keys(value)


def _no_blocking_axe(driver) -> None:
    violations = axe_run(driver)
    counts = impact_counts(violations)
    assert not any(counts.get(impact) for impact in BLOCKING), describe(violations)


def test_a_task_made_in_a_team_after_another_then_moved_and_a_calendar(live_server, browser, user, tmp_path):
    ops = team_create(creator=user, name="Ops", slug="ops")
    extract = task_create(owner=user, team=ops, runner="noop", name="extract rows")
    limit_create(owner=user, team=ops, name="warehouse", max_concurrency=2)
    browser.set_window_size(1366, 900)
    log_in(browser, live_server.url, "alice", "alice-password")
    browser.get(f"{live_server.url}/ui/tasks/")
    browser.find_element(By.CSS_SELECTOR, "#new-task > summary").click()
    _type(browser, "name", "load rows")
    team = "#new-task-form select[name=team]"  # (the list's team filter is a "team" too)
    Select(browser.find_element(By.CSS_SELECTOR, team)).select_by_value("ops")
    _type(browser, "after_task_0", "extract row")  # a typo: said on the pickers
    Select(browser.find_element(By.NAME, "after_on_0")).select_by_value("completion")
    browser.find_element(By.CSS_SELECTOR, "#new-task details.more > summary").click()
    Select(browser.find_element(By.NAME, "limits")).select_by_value("warehouse")
    _type(browser, "input_schema", '{"type": "object", "required": ["day"]}')
    submit_and_wait(browser, "button[name=create]", "#after-pickers")
    error = browser.find_element(By.CSS_SELECTOR, "#after-pickers p.error")
    assert error.text == "No task named 'extract row' in the task's team."
    assert not Task.objects.filter(name="load rows").exists()
    # What was typed stays, so the fix is one field; the page is axe-clean with the error shown.
    assert Select(browser.find_element(By.CSS_SELECTOR, team)).first_selected_option.get_attribute("value") == "ops"
    assert browser.find_element(By.NAME, "input_schema").get_attribute("value").startswith('{"type"')
    _no_blocking_axe(browser)
    shots = Path(os.environ.get("TMS_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    browser.execute_script("document.getElementById('new-task').scrollIntoView()")
    assert browser.save_screenshot(str(shots / "task-form-1366x900.png"))
    browser.execute_script("document.getElementById('after-pickers').scrollIntoView()")
    assert browser.save_screenshot(str(shots / "task-form-after-1366x900.png"))

    _type(browser, "after_task_0", "extract rows")
    submit_and_wait(browser, "button[name=create]", "#task-team")
    task = Task.objects.get(name="load rows")
    assert browser.find_element(By.ID, "task-team").text == "Team: Ops"
    assert "extract rows (on completion)" in browser.find_element(By.ID, "upstream-tasks").text
    assert task.team_id == ops.pk and list(task.limits.values_list("name", flat=True)) == ["warehouse"]
    assert TaskDependency.objects.get(task=task).upstream_id == extract.pk and task.input_schema["required"] == ["day"]

    # Move it to Alice's personal team: refused, its limit and its upstream are Ops's.
    browser.find_element(By.CSS_SELECTOR, "#move-task > summary").click()
    Select(browser.find_element(By.ID, "move-team")).select_by_value(user.personal_team.slug)
    submit_and_wait(browser, "#move-submit", ".messages")
    said = browser.find_element(By.CSS_SELECTOR, ".messages").text
    assert "load rows was not moved" in said and "limits: The task uses limits of its current team" in said
    assert Task.objects.get(pk=task.pk).team_id == ops.pk
    # The upstream itself moves (nothing ties it): said, and done.
    browser.get(f"{live_server.url}/ui/tasks/{extract.pk}/")
    browser.find_element(By.CSS_SELECTOR, "#move-task > summary").click()
    submit_and_wait(browser, "#move-submit", ".messages")
    assert "Tasks of the current team follow this task" in browser.find_element(By.CSS_SELECTOR, ".messages").text

    # A calendar from its page, then named in the task's edit form through the help's link.
    browser.get(f"{live_server.url}/ui/tasks/{task.pk}/edit/")
    browser.find_element(By.CSS_SELECTOR, "#edit-task-form details.more > summary").click()
    browser.find_element(By.LINK_TEXT, "business calendars").click()
    WebDriverWait(browser, 20).until(ec.presence_of_element_located((By.ID, "calendars")))
    browser.find_element(By.CSS_SELECTOR, "#new-calendar > summary").click()
    Select(browser.find_element(By.NAME, "team")).select_by_value("ops")
    _type(browser, "name", "Berlin office")
    _type(browser, "country", "DE")
    _type(browser, "extra_dates", "2030-12-27..2030-12-30 inventory")
    browser.find_element(By.NAME, "weekends_closed").click()
    submit_and_wait(browser, "#new-calendar-form button[type=submit]", "#closed-days")
    assert "Calendar Berlin office created in team Ops" in browser.find_element(By.CSS_SELECTOR, ".messages").text
    assert "weekend" in browser.find_element(By.ID, "closed-days").text
    calendar = Calendar.objects.get(name="Berlin office")
    assert calendar.team_id == ops.pk and calendar.weekends_closed and calendar.country == "DE"
    _no_blocking_axe(browser)
    assert browser.save_screenshot(str(shots / "calendar-1366x900.png"))
    browser.get(f"{live_server.url}/ui/limits/")
    browser.find_element(By.CSS_SELECTOR, "#new-limit > summary").click()
    assert browser.save_screenshot(str(shots / "limits-1366x900.png"))
    browser.get(f"{live_server.url}/ui/tasks/{task.pk}/")
    browser.find_element(By.CSS_SELECTOR, "#move-task > summary").click()
    assert browser.save_screenshot(str(shots / "task-page-1366x900.png"))
