"""axe-core on every back-office page, in Chromium, with real data: no critical and no serious
violation anywhere (the login page, the dashboard, the task list with its form open, a task page
with its occurrences, rules and a "why" answer, the task edit form, the execution lists, an
execution page, the notifications page with its forms, and the not-found page)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from selenium.webdriver.common.by import By

from executions.models import SkippedOccurrence
from notifications import services as notification_services
from notifications.models import Delivery
from tasks_app.services import task_create, task_pause
from tests.backoffice.helpers import run
from tests.browser.axe import BLOCKING, axe_run, axe_version, describe, impact_counts
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def seed(owner) -> dict[str, object]:
    """A task with successes, a failure, a skipped occurrence and a rule; a paused task; a channel
    with a delivered and a failed delivery."""
    task = task_create(
        owner=owner, runner="noop", name="hourly report", cron="*/5 * * * *", timezone="Europe/Berlin",
        start_at=datetime.now(UTC) - timedelta(hours=1),
    )  # fmt: skip
    ok = run(task)
    failed = run(task, outcome="fail", error="upstream timed out")
    SkippedOccurrence.objects.create(
        task=task, scheduled_for=datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=20),
        reason="overlap", detail="the previous run was still running",
    )  # fmt: skip
    paused = task_create(owner=owner, runner="sleep", name="", config={"duration": "1s"}, interval=timedelta(hours=1))
    task_pause(task=paused, actor="test")
    channel = notification_services.channel_create(
        owner=owner, data={"name": "on-call", "kind": "email", "target": "oncall@example.com"}
    )
    notification_services.rule_create(owner=owner, data={"task": task, "channel": channel, "on_failure": True})
    for status, error in (("delivered", ""), ("failed", "SMTP server refused the connection")):
        Delivery.objects.create(
            channel=channel, task=task, event="failing", status=status, last_error=error, attempts=1,
            idempotency_key=f"key-{status}", payload={},
        )  # fmt: skip
    return {"task": task, "ok": ok, "failed": failed}


def test_every_back_office_page_has_no_critical_or_serious_axe_violation(live_server, browser, admin_user, capsys):
    data = seed(admin_user)
    task, failed = data["task"], data["failed"]
    base = live_server.url
    pages: list[tuple[str, str]] = [("login", "/ui/login/")]
    report: dict[str, tuple[dict[str, int], str]] = {}

    def check(name: str, path: str, before=None) -> None:
        browser.get(f"{base}{path}")
        if before:
            before()
        violations = axe_run(browser)
        report[name] = (dict(impact_counts(violations)), describe(violations))

    check("login", "/ui/login/")
    version = axe_version(browser)
    log_in(browser, base, "admin", "password")
    pages = [
        ("dashboard", "/"),
        ("task list", "/ui/tasks/"),
        ("task page", f"/ui/tasks/{task.pk}/?at={datetime.now(UTC).isoformat()}#why"),
        ("task edit", f"/ui/tasks/{task.pk}/edit/"),
        ("executions", "/ui/executions/"),
        ("waiting executions", "/ui/executions/?status=SCHEDULED"),
        ("execution page", f"/ui/executions/{failed.pk}/"),
        ("notifications", "/ui/notifications/"),
        ("not found", "/ui/no-such-page/"),
    ]
    for name, path in pages:
        opener = None
        if name == "task list":

            def opener() -> None:
                browser.find_element(By.CSS_SELECTOR, "#new-task summary").click()

        check(name, path, opener)

    with capsys.disabled():
        print(f"\naxe-core {version}: violating nodes per page")
        for name, (counts, _) in report.items():
            print(f"  {name:20s} " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    blocking = {name: text for name, (counts, text) in report.items() if any(counts.get(i) for i in BLOCKING)}
    assert not blocking, "\n\n".join(f"{name}:\n{text}" for name, text in blocking.items())
