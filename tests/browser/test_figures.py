"""Issue 28 in a real browser: the message of an action survives the reload that shows a run's end."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from executions.models import Execution
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tests.backoffice.helpers import run
from tests.browser.conftest import log_in, platform_running, wait_text
from tms_core.clock import db_now

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_retry_shows_its_message_after_the_retry_has_run(live_server, browser, user):
    task = task_create(owner=user, runner="noop", name="flaky", start_at=db_now(), max_attempts=1)
    # The failed run is made by hand before the platform starts: a running monitor would take it
    # (and the worker claim it) between its creation and the hand-made claim.
    failed = run(task, outcome="fail")
    with platform_running():
        _retry_and_watch(live_server, browser, failed)


def _retry_and_watch(live_server, browser, failed: Execution) -> None:
    log_in(browser, live_server.url, "alice", "alice-password")
    browser.get(f"{live_server.url}/ui/executions/{failed.pk}/")
    browser.find_element(By.ID, "retry").click()
    # The retry's page refreshes while it runs, then reloads to show its end: the message stays.
    wait_text(browser, "#execution-status", "SUCCEEDED", timeout=90)
    retry = Execution.objects.get(retry_of=failed)
    assert retry.status == S.SUCCEEDED
    assert browser.current_url == f"{live_server.url}/ui/executions/{retry.pk}/"
    messages = browser.find_element(By.CSS_SELECTOR, ".messages").text
    assert f"Execution {retry.pk} retries execution {failed.pk}." in messages
    assert "manual retry" in browser.find_element(By.ID, "execution-attempt").text
