"""Issue 46's pages in a real browser, as an operator (may run with input and replay, may not
edit) and a viewer: "Run now with input" refused on its fields then run, a replay from the
execution's page, the workflow's page, a task's versions without a restore button; an editor
restores a version. Screenshots at 1366x900 go to ``TMS_SCREENSHOTS`` when it is set."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from executions.models import Execution, ExecutionOrigin
from tasks_api.creation import task_create
from tasks_api.editing import task_update
from tasks_app.models import Task
from tasks_app.teams.services import member_set, team_create
from tests.backoffice.helpers import run
from tests.browser.conftest import log_in, make_browser

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCHEMA = {
    "type": "object",
    "properties": {"day": {"type": "string", "format": "date"}, "rows": {"type": "integer", "minimum": 1}},
    "required": ["day", "rows"],
}


def _shot(driver, name: str) -> None:
    folder = os.environ.get("TMS_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def _wait(driver, css: str):
    return WebDriverWait(driver, 20).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def test_an_operator_runs_with_input_replays_and_reads_versions_and_the_workflow(live_server, tmp_path):
    users = get_user_model().objects
    admin = users.create_user("lead", password="lead-password")
    team = team_create(creator=admin, name="Data")
    for name, role in (("olga", "operator"), ("ed", "editor")):
        users.create_user(name, password=f"{name}-password")
        member_set(team=team, username=name, role=role)
    later = datetime.now(UTC) + timedelta(days=1)
    report = task_create(
        owner=admin, team=team, runner="noop", name="daily report", input_schema=SCHEMA, start_at=later
    )
    load = task_create(owner=admin, team=team, runner="noop", name="load rows", after=[{"task": str(report.pk)}])
    task_update(task=report, actor="lead", changes={"max_attempts": 6})
    finished = run(report, outcome="fail")

    driver = make_browser(tmp_path / "profile", window="1366,900")
    try:
        base = live_server.url
        log_in(driver, base, "olga", "olga-password")
        driver.get(f"{base}/ui/tasks/{report.pk}/")
        assert not driver.find_elements(By.ID, "edit")  # an operator does not edit
        driver.find_element(By.ID, "run-now").click()
        _wait(driver, "#run-input-form")
        driver.find_element(By.ID, "run-submit").click()  # nothing typed: the schema's required keys
        error = _wait(driver, ".has-error small.error")
        assert error.text == "Required."
        _shot(driver, "run-input-errors")
        driver.execute_script("document.querySelector('[name=\"in-day\"]').value = '2026-11-27'")
        driver.find_element(By.NAME, "in-rows").send_keys("40")
        driver.find_element(By.ID, "run-submit").click()
        WebDriverWait(driver, 20).until(ec.url_contains("/ui/workflow-runs/"))  # the workflow's root
        new = Execution.objects.get(task=report, origin=ExecutionOrigin.TRIGGER)
        assert new.input == {"day": "2026-11-27", "rows": 40}
        assert "Workflow started with the input given" in driver.find_element(By.CSS_SELECTOR, ".messages").text

        driver.get(f"{base}/ui/executions/{finished.pk}/")
        driver.find_element(By.ID, "replay").click()
        _wait(driver, "#replay-form")
        _shot(driver, "replay")
        driver.find_element(By.ID, "replay-submit").click()
        message = _wait(driver, ".messages .msg-success")
        replay = Execution.objects.get(origin=ExecutionOrigin.REPLAY)
        assert message.text == f"1 execution replayed: new run #{replay.pk} with its own input."
        assert replay.replay_of_id == finished.pk

        driver.get(f"{base}/ui/tasks/{report.pk}/workflow/")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#workflow-graph .wf-node")) == 2
        assert str(load) in driver.find_element(By.ID, "workflow-links").text
        _shot(driver, "workflow")

        driver.get(f"{base}/ui/tasks/{report.pk}/versions/")
        assert [row.text.split()[0] for row in driver.find_elements(By.CSS_SELECTOR, "#versions tbody tr")] == [
            "2",
            "1",
        ]
        _shot(driver, "versions")
        driver.find_element(By.LINK_TEXT, "1").click()
        _wait(driver, "#version-diff")
        assert not driver.find_elements(By.ID, "restore")

        driver.delete_all_cookies()
        log_in(driver, base, "ed", "ed-password")
        driver.get(f"{base}/ui/tasks/{report.pk}/versions/1/")
        _shot(driver, "version-diff")
        driver.find_element(By.ID, "restore").click()
        WebDriverWait(driver, 20).until(ec.alert_is_present()).accept()  # "Give the task the settings ...?"
        message = _wait(driver, ".messages .msg-success")
        assert message.text.startswith("Restored version 1: changed max_attempts")
        assert Task.objects.get(pk=report.pk).version == 3
    finally:
        driver.quit()


def test_the_new_pages_fit_a_phone(live_server, phone_browser):
    """At 390x844 none of the run-input, replay, versions, version and workflow pages is wider
    than the screen (``scrollWidth <= innerWidth``)."""
    users = get_user_model().objects
    admin = users.create_user("lead", password="lead-password")
    team = team_create(creator=admin, name="Data")
    later = datetime.now(UTC) + timedelta(days=1)
    report = task_create(
        owner=admin,
        team=team,
        runner="noop",
        name="a daily report with a long name",
        input_schema=SCHEMA,
        start_at=later,
    )
    task_create(owner=admin, team=team, runner="noop", name="load rows", after=[{"task": str(report.pk)}])
    task_update(task=report, actor="lead", changes={"max_attempts": 6})
    finished = run(report, outcome="fail")
    base = live_server.url
    log_in(phone_browser, base, "lead", "lead-password")
    paths = [
        f"/ui/tasks/{report.pk}/run/",
        f"/ui/executions/{finished.pk}/replay/",
        f"/ui/tasks/{report.pk}/versions/",
        f"/ui/tasks/{report.pk}/versions/1/",
        f"/ui/tasks/{report.pk}/workflow/",
        "/ui/executions/",
    ]
    wide = {}
    for path in paths:
        phone_browser.get(f"{base}{path}")
        _wait(phone_browser, "main h1")
        scroll, inner = phone_browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        if scroll > inner:
            wide[path] = scroll
        _shot(phone_browser, "phone-" + path.strip("/").replace("/", "-")[:60])
    assert not wide, wide
