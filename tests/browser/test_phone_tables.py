"""Tables and charts on a phone (390x844, Chromium's device emulation), issue 46: the task page's
runs and occurrences tables, the execution timeline, the waiting executions and a workflow run's
steps scroll sideways in a box of their own (a focusable region named by a visible caption, its
cells on one line), the task's changes are stacked cards, no page is wider than the screen, the
dashboard's times are whole, the duration chart's axis labels do not run into each other, and
the wide charts keep their y axis in view while they scroll."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone
from selenium.webdriver.common.by import By

from executions import transitions
from executions.models import Execution
from tasks_app.models import Task
from tests.backoffice.helpers import WORKER
from tests.browser.axe import BLOCKING, axe_run, describe, impact_counts
from tests.browser.conftest import PHONE, log_in
from tests.browser.seed import seed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: Per element matched by the selector (arguments[0], inside arguments[1] or the document): its
#: text's length and how many lines it takes. Lines are told apart by the tops of the text's own
#: boxes (a Range over the element's contents), not the cell's height, which is its row's.
TEXT_LINES = """
const root = arguments[1] || document;
return Array.from(root.querySelectorAll(arguments[0])).map(el => {
  const range = document.createRange();
  range.selectNodeContents(el);
  const tops = [];
  for (const r of range.getClientRects()) {
    if (r.width < 1 || r.height < 1) continue;
    if (!tops.some(t => Math.abs(t - r.top) < r.height / 2)) tops.push(r.top);
  }
  return {text: el.textContent.trim().replace(/\\s+/g, ' '), lines: tops.length, cls: el.className};
});
"""

#: What a table box is: its role, name, focusability, whether it scrolls, and where it ends.
BOX = """
const box = arguments[0].closest('.table-box');
if (!box) return null;
const caption = document.getElementById(box.getAttribute('aria-labelledby'));
const hint = box.querySelector('.scroll-hint');
return {
  role: box.getAttribute('role'), tabindex: box.tabIndex, caption: caption && caption.textContent.trim(),
  captionShown: !!caption && caption.getBoundingClientRect().height > 0 && caption.closest('table') !== null,
  hintShown: !!hint && hint.getBoundingClientRect().width > 0,
  scrolls: box.scrollWidth > box.clientWidth, right: box.getBoundingClientRect().right,
};
"""


def page_width(driver) -> int:
    return int(driver.execute_script("return document.documentElement.scrollWidth"))


def run_lasting(task: Task, seconds: float) -> Execution:
    """A run of ``task`` that took ``seconds``, through the real transitions; only its due and
    start times are moved back (while RUNNING, half a second apart) so that the rollup's duration
    histogram records a long run (a run due that long ago would have missed its grace)."""
    now = timezone.now()
    (pk,) = transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, now - timedelta(seconds=0.5), 5)], actor="test"
    )
    transitions.executions_take_due(limit=1000, actor="monitor:test")
    assert transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id=WORKER, lease_seconds=60)
    started = now - timedelta(seconds=seconds)
    Execution.objects.filter(pk=pk).update(started_at=started, due_at=started - timedelta(seconds=0.5))
    assert transitions.execution_succeed(execution_id=pk, attempt=1, worker_id=WORKER, output="ok", max_chars=1000)
    return Execution.objects.get(pk=pk)


def assert_scroll_box(browser, table_css: str, caption: str) -> None:
    """The table at ``table_css`` scrolls in a named, focusable box within the screen, with its
    caption and the "scroll sideways" hint shown; each of its cells is one line, its prose (the
    reasons, what a run waits for) at least a dozen letters a line."""
    width, _ = PHONE
    table = browser.find_element(By.CSS_SELECTOR, table_css)
    box = browser.execute_script(BOX, table)
    assert box is not None, f"{table_css} is not in a table box"
    assert (box["role"], box["tabindex"], box["captionShown"]) == ("region", 0, True), box
    assert box["caption"].startswith(caption), box
    assert box["scrolls"] and box["hintShown"], box
    assert box["right"] <= width, box
    cells = browser.execute_script(TEXT_LINES, "th, td", table)
    assert len(cells) > 5
    prose = [c for c in cells if "reason" in c["cls"] or "wrap" in c["cls"]]
    short = [c for c in cells if c not in prose and c["text"]]
    assert [c for c in short if c["lines"] != 1] == [], table_css
    assert [c for c in prose if c["text"] and len(c["text"]) / c["lines"] < 12] == [], table_css


def test_on_a_phone_tables_scroll_in_their_box_times_stay_whole_and_charts_keep_their_axes(
    live_server, phone_browser, admin_user
):
    data = seed(admin_user)
    # The duration chart's axis spans a millisecond to a day: nine decades, 28 units apart.
    run_lasting(data["sleep"], 20 * 3600)
    browser, base, (width, _) = phone_browser, live_server.url, PHONE
    log_in(browser, base, "admin", "password")

    # The task page: its runs and occurrences scroll in their boxes; its changes are cards.
    browser.get(f"{base}/ui/tasks/{data['task'].pk}/")
    assert page_width(browser) == width
    assert_scroll_box(browser, "table.runs", "Recent runs")
    assert_scroll_box(browser, "#occurrences table", "Occurrences")
    changes = browser.find_element(By.ID, "changes")
    rows = changes.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) >= 2
    first = rows[0].rect
    assert first["x"] >= 0 and first["x"] + first["width"] <= width
    # Each row a card: its cells under each other, each labelled by its column, none letter by letter.
    cells = rows[0].find_elements(By.TAG_NAME, "td")
    assert [c.rect["y"] for c in cells] == sorted(c.rect["y"] for c in cells)
    assert len({round(c.rect["x"]) for c in cells}) == 1
    labels = browser.execute_script(
        "return Array.from(arguments[0].querySelectorAll('td')).map(td => getComputedStyle(td, '::before').content)",
        rows[0],
    )
    assert labels == ['"When (UTC)"', '"Who"', '"From"', '"Action"', '"What changed"']
    wrapped = browser.execute_script(TEXT_LINES, "td", changes)
    assert [c for c in wrapped if c["text"] and len(c["text"]) / c["lines"] < 12 and c["lines"] > 1] == []

    # The execution page's timeline.
    browser.get(f"{base}/ui/executions/{data['failed'].pk}/")
    assert page_width(browser) == width
    assert_scroll_box(browser, "#timeline", "Timeline")

    # The waiting executions (it was 422 px wide, its cells a letter a line).
    browser.get(f"{base}/ui/executions/?status=SCHEDULED")
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    assert_scroll_box(browser, "table.runs", "Executions")

    # A workflow run's steps.
    browser.get(f"{base}/ui/workflow-runs/{data['workflow_root'].pk}/")
    assert page_width(browser) == width
    box = browser.execute_script(BOX, browser.find_element(By.ID, "workflow-steps"))
    assert (box["role"], box["tabindex"], box["captionShown"], box["right"] <= width) == ("region", 0, True, True)

    # The dashboard: times and figures whole on one line.
    browser.get(f"{base}/")
    assert page_width(browser) == width
    numbers = browser.execute_script(TEXT_LINES, "#dashboard-as-of, .num, .tile .value, th")
    assert len(numbers) > 10
    assert [n for n in numbers if n["lines"] > 1 and ":" in n["text"]] == []
    assert [n for n in numbers if n["lines"] > 1 and len(n["text"]) / n["lines"] < 5] == []

    # The duration chart: its axis labels do not overlap (and enough of them are left).
    card = browser.find_element(By.XPATH, "//section[.//h2[starts-with(normalize-space(), 'Duration per runner')]]")
    boxes = browser.execute_script(
        "const svg = arguments[0].querySelector('svg');"
        "const bottom = svg.getBoundingClientRect().bottom;"
        "return Array.from(svg.querySelectorAll('text')).map(t => t.getBoundingClientRect())"
        ".filter(r => bottom - r.bottom < 8).map(r => [r.left, r.right, r.top, r.bottom]);",
        card,
    )
    assert len(boxes) >= 4, boxes
    boxes.sort()
    overlaps = [(a, b) for a, b in itertools.pairwise(boxes) if b[0] < a[1] and b[2] < a[3] and a[2] < b[3]]
    assert overlaps == [], overlaps

    # The wide charts scroll to their latest minutes; their y axis stays in view, on top of the plot.
    frames = browser.find_elements(By.CSS_SELECTOR, ".chart-frame.wide")
    assert len(frames) == 2
    for frame in frames:
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", frame)
        axis = browser.execute_script(
            """
            const frame = arguments[0], box = frame.getBoundingClientRect();
            const labels = Array.from(frame.querySelectorAll('svg.chart-y-axis text'));
            return {
              scrolled: frame.scrollLeft > 0,
              labels: labels.length,
              inView: labels.filter(t => {
                const r = t.getBoundingClientRect();
                const hit = document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2);
                const onTop = hit && hit.closest('svg.chart-y-axis') !== null;
                return r.left >= box.left - 1 && r.right <= box.right && onTop;
              }).length,
            };
            """,
            frame,
        )
        assert axis["scrolled"] and axis["labels"] >= 2 and axis["inView"] == axis["labels"], axis

    for path in ("/", f"/ui/tasks/{data['task'].pk}/", f"/ui/executions/{data['failed'].pk}/"):
        browser.get(f"{base}{path}")
        violations = axe_run(browser)
        assert not any(impact_counts(violations).get(i) for i in BLOCKING), describe(violations)
