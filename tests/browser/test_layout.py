"""The back office's layout in Chromium: on a phone (390x844) no page scrolls sideways, every
navigation item is reachable through the menu, chart labels are a readable size and no card is
cut off; on a 1440 px screen the task lists (the back office's and the admin's) fit."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from tasks_api.calendars import calendar_create
from tasks_api.limits import limit_create
from tests.browser.axe import BLOCKING, axe_run, describe, impact_counts
from tests.browser.conftest import PHONE, log_in
from tests.browser.seed import seed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: The smallest chart label, in CSS pixels, that we call readable on a phone.
READABLE_PX = 10.0
NAV_ITEMS = [
    "Dashboard",
    "Tasks",
    "Executions",
    "Notifications",
    "Calendars",
    "Limits",
    "API tokens",
    "Admin",
    "API docs",
    "Flower ↗",
    "Log out",
]

#: Rendered font size (CSS px) of every text of every chart on the page: its computed size in the
#: SVG's units times the SVG's scale on screen.
CHART_LABEL_SIZES = """
return Array.from(document.querySelectorAll('.chart svg text')).map(t =>
  parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a);
"""


def page_width(driver) -> int:
    return int(driver.execute_script("return document.documentElement.scrollWidth"))


def test_on_a_phone_nothing_scrolls_sideways_the_menu_reaches_everything_and_charts_read(
    live_server, phone_browser, admin_user
):
    data = seed(admin_user)
    browser, base, (width, _) = phone_browser, live_server.url, PHONE
    log_in(browser, base, "admin", "password")
    limit = limit_create(owner=admin_user, name="warehouse", max_concurrency=2, windows=[{"count": 10, "seconds": 1}])
    calendar = calendar_create(owner=admin_user, name="Berlin office", country="DE", weekends_closed=True)
    pages = {
        "dashboard": "/",
        "task list": "/ui/tasks/",
        "task page": f"/ui/tasks/{data['task'].pk}/",
        "task edit": f"/ui/tasks/{data['task'].pk}/edit/",
        "executions": "/ui/executions/",
        "execution page": f"/ui/executions/{data['failed'].pk}/",
        "workflow run": f"/ui/workflow-runs/{data['workflow_root'].pk}/",
        "notifications": "/ui/notifications/",
        "api tokens": "/ui/tokens/",
        "limits": "/ui/limits/",
        "calendars": "/ui/calendars/",
        "limit": f"/ui/limits/{limit.pk}/",
        "limit edit": f"/ui/limits/{limit.pk}/edit/",
        "calendar page": f"/ui/calendars/{calendar.pk}/",
    }
    widths = {}
    for name, path in pages.items():
        browser.get(f"{base}{path}")
        widths[name] = page_width(browser)
    assert widths == dict.fromkeys(pages, width)

    browser.get(f"{base}/")
    # The navigation is folded into the menu; the menu button opens it, and everything is on screen.
    menu = browser.find_element(By.ID, "menu-toggle")
    assert menu.is_displayed()
    assert not browser.find_element(By.XPATH, "//header//a[normalize-space()='Notifications']").is_displayed()
    menu.click()
    assert menu.get_attribute("aria-expanded") == "true"
    for label in NAV_ITEMS:
        item = browser.find_element(By.XPATH, f"//header//*[self::a or self::button][normalize-space()='{label}']")
        box = item.rect
        assert item.is_displayed(), label
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, (label, box)
    assert page_width(browser) == width
    browser.find_element(By.LINK_TEXT, "Notifications").click()
    WebDriverWait(browser, 20).until(ec.url_contains("/ui/notifications/"))

    browser.get(f"{base}/")
    sizes = browser.execute_script(CHART_LABEL_SIZES)
    assert len(sizes) > 20
    assert min(sizes) >= READABLE_PX, sorted(sizes)[:5]
    # The duration card whole on screen: nothing of it beyond the screen's edge or clipped inside.
    card = browser.find_element(By.XPATH, "//section[.//h2[starts-with(normalize-space(), 'Duration per runner')]]")
    assert card.rect["x"] >= 0 and card.rect["x"] + card.rect["width"] <= width, card.rect
    assert browser.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth", card)
    # ... its labels whole within it (the values at its right were cut), ...
    outside = browser.execute_script(
        "const box = arguments[0].getBoundingClientRect();"
        "return Array.from(arguments[0].querySelectorAll('svg text')).map(t => t.getBoundingClientRect())"
        ".filter(r => r.left < box.left || r.right > box.right).length;",
        card,
    )
    assert outside == 0
    # ... and a chart that scrolls shows its latest minutes first (its right end).
    ends = browser.execute_script(
        "return Array.from(document.querySelectorAll('.chart-frame.wide'))"
        ".map(f => f.scrollWidth > f.clientWidth && f.scrollLeft + f.clientWidth >= f.scrollWidth - 1);"
    )
    assert ends and all(ends), ends

    for path in ("/", pages["task page"]):
        browser.get(f"{base}{path}")
        violations = axe_run(browser)
        assert not any(impact_counts(violations).get(i) for i in BLOCKING), describe(violations)


def test_at_1440_px_the_task_lists_fit(live_server, browser, admin_user):
    seed(admin_user)
    log_in(browser, live_server.url, "admin", "password")
    browser.get(f"{live_server.url}/ui/tasks/")
    assert page_width(browser) <= 1440
    browser.get(f"{live_server.url}/admin/tasks_app/task/")
    results = browser.find_element(By.CSS_SELECTOR, "#changelist .results")
    assert page_width(browser) <= 1440
    # The admin's result table scrolls inside its box when too wide: it must not have to.
    assert browser.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth", results), (
        browser.execute_script("return [arguments[0].scrollWidth, arguments[0].clientWidth]", results)
    )
