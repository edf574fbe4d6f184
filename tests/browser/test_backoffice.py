"""The back office in a real browser: log in, the dashboard, a task created from the page and
run with "Run now" until the real worker reports SUCCEEDED, a running sleep cancelled from its
page, a second user who finds nothing of the first one's anywhere, and a task paused and resumed
from the Django admin's changelist actions with the API's effect."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from executions.models import Execution, ExecutionOrigin
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_api.triggers import task_trigger
from tasks_app.models import Task
from tests.browser.conftest import log_in, wait_text
from tests.processes import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LATER = datetime(2099, 1, 1, tzinfo=UTC)


def _set(driver, name: str, value: str) -> None:
    """Type into a field (a datetime-local input takes its value from script: its typing is locale-bound)."""
    field = driver.find_element(By.NAME, name)
    if field.get_attribute("type") == "datetime-local":
        driver.execute_script("arguments[0].value = arguments[1]", field, value)
    else:
        field.clear()
        field.send_keys(value)


def test_create_a_task_run_it_now_and_watch_it_succeed(live_server, browser, platform, user):
    log_in(browser, live_server.url, "alice", "alice-password")
    assert browser.current_url == f"{live_server.url}/"
    assert browser.find_element(By.TAG_NAME, "h1").text == "Dashboard"
    assert browser.find_element(By.ID, "tile-runs").text == "0"

    browser.find_element(By.LINK_TEXT, "Tasks").click()
    browser.find_element(By.CSS_SELECTOR, "#new-task summary").click()
    _set(browser, "name", "nightly report")
    Select(browser.find_element(By.NAME, "runner")).select_by_value("sleep")
    _set(browser, "config", '{"duration": "300ms"')  # a bad form first: its error shows on the field
    _set(browser, "interval", "1d")
    _set(browser, "start_at", "2099-01-01T03:00:00")
    _set(browser, "timezone", "Europe/Berlin")
    browser.find_element(By.NAME, "create").click()
    # The answer is a new page: wait for it (a loaded machine may still show the old one).
    error = WebDriverWait(browser, 20).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, ".has-error small.error"))
    )
    assert error.text.startswith("Not valid JSON")
    assert not Task.objects.exists()

    _set(browser, "config", '{"duration": "300ms"}')
    _set(browser, "start_at", "2099-01-01T03:00:00")
    browser.find_element(By.NAME, "create").click()
    WebDriverWait(browser, 20).until(ec.presence_of_element_located((By.ID, "run-now")))
    task = Task.objects.get()
    assert browser.current_url == f"{live_server.url}/ui/tasks/{task.pk}/"
    assert browser.find_element(By.ID, "schedule-words").text == "Every 1 day"
    assert task.start_at == datetime(2099, 1, 1, 2, 0, tzinfo=UTC)  # 03:00 in Berlin

    browser.find_element(By.ID, "run-now").click()
    WebDriverWait(browser, 20).until(ec.url_contains("/ui/executions/"))
    execution = Execution.objects.get(task=task, origin=ExecutionOrigin.TRIGGER)
    assert browser.current_url == f"{live_server.url}/ui/executions/{execution.pk}/"
    # The page refreshes itself while the run is active and shows the final state when it ends.
    wait_text(browser, "#execution-status", "SUCCEEDED", timeout=90)
    assert browser.find_element(By.ID, "execution-output").text == "slept 0.3s"
    timeline = browser.find_element(By.ID, "timeline").text
    for status in ("PENDING", "RUNNING", "SUCCEEDED"):
        assert status in timeline
    assert Execution.objects.get(pk=execution.pk).status == S.SUCCEEDED

    browser.find_element(By.LINK_TEXT, "Dashboard").click()
    assert browser.find_element(By.ID, "tile-runs").text == "1"
    assert browser.find_element(By.ID, "tile-success").text == "100.0%"


def test_cancel_a_running_sleep_from_its_page(live_server, browser, platform, user):
    task = task_create(owner=user, runner="sleep", name="long sleep", config={"duration": "60s"}, start_at=LATER)
    execution = task_trigger(task=task, actor="test").execution
    wait_for(lambda: Execution.objects.get(pk=execution.pk).status == S.RUNNING, timeout=60, what="RUNNING")

    log_in(browser, live_server.url, "alice", "alice-password")
    browser.get(f"{live_server.url}/ui/executions/{execution.pk}/")
    assert browser.find_element(By.ID, "execution-status").text == "RUNNING"
    browser.find_element(By.ID, "cancel").click()
    WebDriverWait(browser, 10).until(ec.alert_is_present()).accept()
    wait_text(browser, "#execution-status", "CANCELLED", timeout=30)
    assert "cancelled" in browser.find_element(By.CSS_SELECTOR, ".messages").text
    assert not browser.find_elements(By.ID, "cancel")
    cancelled = Execution.objects.get(pk=execution.pk)
    assert cancelled.status == S.CANCELLED
    last = cancelled.events.order_by("id").last()
    assert (last.from_status, last.to_status, last.actor) == (S.RUNNING, S.CANCELLED, "user:alice")


def test_a_second_user_sees_none_of_the_first_users_tasks(live_server, browser, user, other_user):
    task = task_create(owner=user, runner="noop", name="alices private task", interval=timedelta(hours=1))
    execution = task_trigger(task=task, actor="test").execution

    log_in(browser, live_server.url, "bob", "bob-password")
    pages = ["/", "/ui/tasks/", "/ui/executions/", "/ui/dashboard/live"]
    for page in pages:
        browser.get(f"{live_server.url}{page}")
        assert "alices private task" not in browser.page_source, page
        assert str(task.pk) not in browser.page_source, page
    for page in (f"/ui/tasks/{task.pk}/", f"/ui/tasks/{task.pk}/edit/", f"/ui/executions/{execution.pk}/"):
        browser.get(f"{live_server.url}{page}")
        assert "Not Found" in browser.page_source, page
        assert "alices private task" not in browser.page_source, page

    # The owner reaches the same pages, so the 404s above are isolation, not broken links.
    browser.find_element(By.TAG_NAME, "body")
    browser.delete_all_cookies()
    log_in(browser, live_server.url, "alice", "alice-password")
    browser.get(f"{live_server.url}/ui/tasks/{task.pk}/")
    assert "alices private task" in browser.find_element(By.TAG_NAME, "h1").text


def _admin_action(driver, base_url: str, task: Task, action: str) -> str:
    """In the task changelist: tick ``task``, choose ``action``, press Go; the message it reports."""
    driver.get(f"{base_url}/admin/tasks_app/task/")
    driver.find_element(By.CSS_SELECTOR, f"input.action-select[value='{task.pk}']").click()
    Select(driver.find_element(By.NAME, "action")).select_by_value(action)
    driver.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    return WebDriverWait(driver, 20).until(ec.presence_of_element_located((By.CSS_SELECTOR, ".messagelist"))).text


def test_pause_and_resume_a_task_from_the_admin(live_server, browser, user, admin_user, api_client, settings):
    """A superuser pauses a task in the admin: its waiting runs are cancelled exactly as the API's
    pause cancels those of an identical task; resuming brings the same occurrences back."""
    # An hour's horizon (the suite's is a minute): runs far enough ahead that none falls due meanwhile.
    settings.TMS = {**settings.TMS, "MATERIALISE_HORIZON": 3600}
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=30)
    spec = {"runner": "noop", "interval": timedelta(minutes=5), "start_at": start}
    task = task_create(owner=user, name="every five minutes", **spec)
    twin = task_create(owner=user, name="its twin, through the API", **spec)
    waiting = list(Execution.objects.filter(task=task, status=S.SCHEDULED).order_by("scheduled_for"))
    assert waiting

    browser.get(f"{live_server.url}/admin/login/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 20).until(ec.presence_of_element_located((By.ID, "user-tools")))

    assert "1 paused, 0 refused." in _admin_action(browser, live_server.url, task, "pause_selected")
    assert api_client.post(f"/api/v1/tasks/{twin.pk}/pause").status_code == 200
    task.refresh_from_db()
    assert task.status == "PAUSED"
    assert not Execution.objects.filter(task=task, status=S.SCHEDULED).exists()
    for execution in waiting:
        execution.refresh_from_db()
        assert execution.status == S.CANCELLED and execution.error == "paused"

    def effect(of: Task) -> list[tuple[str, str, int]]:
        rows = Execution.objects.filter(task=of).order_by("scheduled_for", "id")
        return [(row.status, row.error, row.events.count()) for row in rows]

    assert effect(task) == effect(twin)

    assert "1 resumed, 0 refused." in _admin_action(browser, live_server.url, task, "resume_selected")
    assert api_client.post(f"/api/v1/tasks/{twin.pk}/resume").status_code == 200
    task.refresh_from_db()
    assert task.status == "ACTIVE"
    again = Execution.objects.filter(task=task, status=S.SCHEDULED).order_by("scheduled_for")
    assert [e.scheduled_for for e in again] == [e.scheduled_for for e in waiting]
    assert effect(task) == effect(twin)
