"""axe-core on the Django admin's pages TMS touches (issue 46), in Chromium at 1366x900 and on a
phone (390x844): no critical and no serious finding on the change pages (a task, an execution
with its events, a notification channel and rule being added, a task version, a calendar, a
team and a membership), nor on the lists on a phone, and no page wider than the phone.

What axe found before (tms_project/templates/admin/base_site.html loads the fixes):
link-in-text-block on the breadcrumbs and the search bar's "Show all" (admin.css underlines
them), aria-input-field-name on each Select2 autocomplete field (admin.js names them after their
labels), and scrollable-region-focusable on an execution's events on a phone (admin.js makes a
box that scrolls focusable and names it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tasks_api.calendars import calendar_create
from tasks_app.models import TaskVersion
from tasks_app.versions import version_first_ensure
from tests.browser.axe import BLOCKING, axe_run, describe, impact_counts
from tests.browser.conftest import PHONE, log_in, make_browser
from tests.browser.seed import seed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: Select2 boxes named after their labels (admin.js), on the pages that have them.
NAMED_AUTOCOMPLETE = ".select2-selection[role=combobox][aria-labelledby*='-label']"


def test_admin_pages_have_no_critical_or_serious_axe_finding_at_either_size(live_server, admin_user, tmp_path: Path):
    data = seed(admin_user)
    calendar = calendar_create(owner=admin_user, team=None, name="berlin-workdays", country="DE", subdivision="BE")
    version_first_ensure(data["task"].pk)  # version 1 is written when first needed (tasks_app.versions)
    version = TaskVersion.objects.filter(task=data["task"]).order_by("number").first()
    assert version is not None
    rule = data["task"].notification_rules.get()
    membership = data["team"].memberships.order_by("id").first()
    change_pages = {
        "task change": f"/admin/tasks_app/task/{data['task'].pk}/change/",
        "execution": f"/admin/executions/execution/{data['failed'].pk}/change/",
        "channel add": "/admin/notifications/channel/add/",
        "rule add": "/admin/notifications/rule/add/",
        "rule change": f"/admin/notifications/rule/{rule.pk}/change/",
        "version": f"/admin/tasks_app/taskversion/{version.pk}/change/",
        "calendar": f"/admin/tasks_app/calendar/{calendar.pk}/change/",
        "calendar add": "/admin/tasks_app/calendar/add/",
        "team": f"/admin/tasks_app/team/{data['team'].pk}/change/",
        "member add": f"/admin/tasks_app/membership/add/?team={data['team'].pk}",
        "member": f"/admin/tasks_app/membership/{membership.pk}/change/",
    }
    lists = {
        "tasks": "/admin/tasks_app/task/",
        "executions": "/admin/executions/execution/",
        "versions": "/admin/tasks_app/taskversion/",
        "calendars": "/admin/tasks_app/calendar/",
        "channels": "/admin/notifications/channel/",
        "rules": "/admin/notifications/rule/",
        "teams": "/admin/tasks_app/team/",
        "members": "/admin/tasks_app/membership/",
    }
    autocompletes = {"channel add": 1, "rule add": 3, "rule change": 3}
    report: dict[str, str] = {}
    widths: dict[str, int] = {}
    for size in ("1366x900", "phone"):
        phone = size == "phone"
        browser = make_browser(tmp_path / size, phone=phone, window=None if phone else "1366,900")
        try:
            log_in(browser, live_server.url, "admin", "password")
            # The lists at a phone's size (at 1366 px Django's own lists had no finding).
            for name, path in ({**change_pages, **lists} if phone else change_pages).items():
                browser.get(f"{live_server.url}{path}")
                if name in autocompletes:
                    WebDriverWait(browser, 20).until(
                        lambda d, n=autocompletes[name]: len(d.find_elements(By.CSS_SELECTOR, NAMED_AUTOCOMPLETE)) == n
                    )
                violations = axe_run(browser)
                if any(impact_counts(violations).get(i) for i in BLOCKING):
                    report[f"{name} at {size}"] = describe(violations)
                if phone:
                    widths[name] = int(browser.execute_script("return document.documentElement.scrollWidth"))
            if phone:
                # The execution's events scroll sideways in a box the keyboard reaches, named after its heading.
                browser.get(f"{live_server.url}{change_pages['execution']}")
                events = browser.find_element(By.ID, "events-group")
                assert (events.get_attribute("tabindex"), events.get_attribute("role")) == ("0", "region")
                assert events.get_attribute("aria-label")
        finally:
            browser.quit()
    assert report == {}, "\n\n".join(f"{name}:\n{text}" for name, text in report.items())
    assert widths == dict.fromkeys(widths, PHONE[0])
