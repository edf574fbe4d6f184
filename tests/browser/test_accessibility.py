"""axe-core on every back-office page, in Chromium, with real data: no critical and no serious
violation anywhere (the login page, the dashboard, the task list with its form open, a task page
with its occurrences, rules and a "why" answer, the task edit form, the execution lists, an
execution page, a workflow run page, the notifications page with its forms, the API tokens page with its form and with a
new key shown, the teams page and a team's page with their forms (members and service accounts), a service account's
page with its token form, the named limits and business calendar pages with their forms, the run-with-input, replay,
versions, version diff and workflow pages, and the not-found page)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from accounts.service_accounts import service_account_create
from executions import transitions, worker_services
from tasks_api.calendars import calendar_create
from tasks_api.creation import task_create
from tasks_api.editing import task_update
from tasks_api.limits import limit_create
from tasks_app.models import Task
from tests.browser.axe import BLOCKING, axe_run, axe_version, describe, impact_counts
from tests.browser.conftest import log_in
from tests.browser.seed import seed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_every_back_office_page_has_no_critical_or_serious_axe_violation(live_server, browser, admin_user, capsys):
    data = seed(admin_user)
    task, failed = data["task"], data["failed"]
    task_update(task=task, actor="admin", changes={"max_attempts": 4})  # a version 2: version 1 has a diff
    assert isinstance(task, Task)
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
        ("workflow run", f"/ui/workflow-runs/{data['workflow_root'].pk}/"),
        ("notifications", "/ui/notifications/"),
        ("api tokens", "/ui/tokens/"),
        ("teams", "/ui/teams/"),
        ("team page", f"/ui/teams/{data['team'].pk}/"),
        ("not found", "/ui/no-such-page/"),
        # Issue 46: run with input (a workflow's root), replay, versions, a version's diff, a workflow.
        ("run with input", f"/ui/tasks/{data['workflow_root'].task_id}/run/"),
        ("replay", f"/ui/executions/{failed.pk}/replay/"),
        ("versions", f"/ui/tasks/{task.pk}/versions/"),
        ("version diff", f"/ui/tasks/{task.pk}/versions/1/"),
        ("workflow", f"/ui/tasks/{data['workflow_root'].task_id}/workflow/"),
    ]
    # The shared team's page then lists a service account, whose own page has its token form.
    account = service_account_create(team=data["team"], name="deploy-ci", role="operator", creator=admin_user)
    pages += [("service account", f"/ui/teams/{data['team'].pk}/service-accounts/{account.pk}/")]
    # Named limits and business calendars (issue 46): the lists with their forms, a limit's edit
    # form and a calendar's page (its closed days, the task using it, its edit form).
    limit = limit_create(
        owner=admin_user, team=data["team"], name="warehouse", max_concurrency=2, windows=[{"count": 10, "seconds": 1}]
    )
    calendar = calendar_create(
        owner=admin_user, team=data["team"], name="Berlin office", country="DE", weekends_closed=True,
        extra_dates=[{"start": "2030-12-27", "end": "2030-12-30", "label": "inventory"}],
    )  # fmt: skip
    task_create(
        owner=admin_user, team=data["team"], runner="noop", name="daily", cron="0 9 * * *", calendar="Berlin office"
    )
    pages += [
        ("limits", "/ui/limits/"),
        ("limit", f"/ui/limits/{limit.pk}/"),
        ("limit edit", f"/ui/limits/{limit.pk}/edit/"),
        ("calendars", "/ui/calendars/"),
        ("calendar page", f"/ui/calendars/{calendar.pk}/"),
    ]
    # Approval steps (issue 48): the Approvals page and a waiting run's page, with their Approve/Reject forms.
    gate = task_create(
        owner=admin_user, team=data["team"], runner="approval", name="deploy gate",
        config={"message": "Deploy to production?"}, start_at=datetime(2099, 1, 1, tzinfo=UTC),
    )  # fmt: skip
    waiting = transitions.execution_trigger(task_id=gate.pk, actor="test")
    transitions.executions_take_due(limit=100, actor="monitor")
    worker_services.execution_run(execution_id=waiting, attempt=1, worker_id="w:axe:1")
    pages += [("approvals", "/ui/approvals/"), ("approval page", f"/ui/executions/{waiting}/")]
    rule = data["task"].notification_rules.get()
    pages += [
        ("channel edit", f"/ui/notifications/channels/{data['channel'].pk}/edit/"),
        ("rule edit", f"/ui/notifications/rules/{rule.pk}/edit/"),
    ]
    #: The folded forms each page has, opened before axe looks.
    folded = {
        "task list": ["#new-task > summary", "#new-task details.more > summary"],
        "task page": ["#add-rule summary", "#move-task > summary"],
        "task edit": ["#edit-task-form details.more > summary"],
        "limits": ["#new-limit summary"],
        "calendars": ["#new-calendar summary"],
        "notifications": ["#new-channel summary", "#new-rule summary"],
        "api tokens": ["#new-token summary"],
        "teams": ["#new-team summary"],
        "team page": ["#add-member summary", "#rename summary", "#add-service-account summary"],
        "service account": ["#new-token summary"],
    }
    for name, path in pages:

        def opener(name: str = name) -> None:
            for css in folded.get(name, []):
                browser.find_element(By.CSS_SELECTOR, css).click()

        check(name, path, opener)

    def create_token() -> None:
        browser.find_element(By.CSS_SELECTOR, "#new-token summary").click()
        browser.find_element(By.ID, "id_name").send_keys("CI deploys")
        browser.find_element(By.CSS_SELECTOR, "#new-token-form button[type=submit]").click()
        WebDriverWait(browser, 20).until(ec.presence_of_element_located((By.ID, "new-key-value")))

    check("new api token", "/ui/tokens/", create_token)

    with capsys.disabled():
        print(f"\naxe-core {version}: violating nodes per page")
        for name, (counts, _) in report.items():
            print(f"  {name:20s} " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    blocking = {name: text for name, (counts, text) in report.items() if any(counts.get(i) for i in BLOCKING)}
    assert not blocking, "\n\n".join(f"{name}:\n{text}" for name, text in blocking.items())
