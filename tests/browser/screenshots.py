"""Screenshots of the back office with real data, for ``docs/screenshots/`` (run by hand).

Starts the whole platform (web, worker, monitor, beat) on the database and broker of the
environment, registers a handful of tasks (successes, failures with automatic retries, a retry
by hand, a skipped occurrence, a paused task, an e-mail rule on the failing one), lets them run for
a few minutes, and takes full-page screenshots of the dashboard, a task page, an execution page
the notifications page, a task whose business calendar moves its runs, the new-task form and the
API tokens page with a new key in headless Chromium (e-mail goes to Django's in-memory backend; a
webhook channel points at a closed port, so it turns failing), and the dashboard and a task page
at a phone's size (390x844)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/tms_screens \\
    CELERY_BROKER_URL=amqp://guest:guest@127.0.0.1:5672// \\
        .venv/bin/python tests/browser/screenshots.py --minutes 4

Use a database of its own: the script migrates it and adds users and tasks to it.
"""

from __future__ import annotations

import argparse
import base64
import os
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote
from zoneinfo import ZoneInfo

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment() -> None:
    """Settings for this run, set before Django reads them; the processes inherit them."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tms_project.settings.local")
    os.environ["TMS_QUEUE"] = f"tms.screenshots.{os.getpid()}"
    os.environ["TMS_NOTIFY_QUEUE"] = f"tms.screenshots.notify.{os.getpid()}"
    os.environ.setdefault("DJANGO_EMAIL_BACKEND", "django.core.mail.backends.locmem.EmailBackend")
    os.environ["TMS_SUBPROCESS_ALLOWED_EXECUTABLES"] = "/bin/sh"
    # The failing webhook channel's closed port is on this machine.
    os.environ.setdefault("TMS_HTTP_ALLOWED_NETWORKS", "127.0.0.1/32")
    # E-mail (to the in-memory backend) goes to example.com addresses only, as in the tests.
    os.environ.setdefault("TMS_EMAIL_ALLOWED_RECIPIENTS", "@example.com")
    os.environ["TMS_SUBPROCESS_WORK_DIR"] = tempfile.mkdtemp(prefix="tms-screenshots-runs-")
    # INFO: the harness waits for the worker's "ready" line (its processes log to var/screenshot-logs).
    os.environ.setdefault("TMS_LOG_LEVEL", "INFO")


def seed(operator, alice) -> dict[str, object]:
    """The tasks the screenshots show, created through the services as the API creates them."""
    from tasks_api.creation import task_create
    from tasks_api.lifecycle import task_pause

    sh = "/bin/sh"
    tasks = {
        "heartbeat": task_create(owner=alice, runner="noop", name="heartbeat ping", interval=timedelta(seconds=5)),
        "thumbnails": task_create(
            owner=alice, runner="sleep", name="thumbnail batch", config={"duration": "1500ms"},
            interval=timedelta(seconds=10),
        ),
        "export": task_create(
            owner=alice, runner="subprocess", name="flaky export", interval=timedelta(seconds=15), max_attempts=3,
            retry_backoff=timedelta(seconds=2), retry_jitter=False,
            config={"command": [sh, "-c", 'echo "exporting orders"; [ $(( $(date +%s) % 3 )) -ne 0 ] || '
                                            '{ echo "upstream timed out" >&2; exit 1; }']},
        ),
        "backup": task_create(
            owner=operator, runner="subprocess", name="nightly backup", cron="* * * * *", timezone="Europe/Berlin",
            max_attempts=2, retry_backoff=timedelta(seconds=3), retry_jitter=False,
            config={
                "command": [sh, "-c", "echo 'dumping 3 tables'; echo 'pg_dump: connection to server failed' >&2; "
                                      "exit 2"],
                "env": {"PGHOST": "db.internal", "PGPASSWORD": "hunter2"},
            },
        ),
        "report": task_create(
            owner=alice, runner="sleep", name="slow report", config={"duration": "12s"},
            interval=timedelta(seconds=8), overlap_policy="skip",
        ),
        "cleanup": task_create(
            owner=operator, runner="noop", name="weekly cleanup", cron="0 3 * * 0", timezone="America/New_York",
        ),
    }  # fmt: skip
    task_pause(task=tasks["cleanup"], actor="user:operator")
    # A business calendar that closes today (Berlin) and weekends: the invoice run's fire times
    # today move to the next business day, at the same wall time, and its page says so.
    from django.utils import timezone as dj_timezone

    from tasks_api.calendars import calendar_create

    today = dj_timezone.now().astimezone(ZoneInfo("Europe/Berlin")).date().isoformat()
    office = calendar_create(
        owner=operator, name="office days", country="DE", subdivision="BE", weekends_closed=True,
        extra_dates=[{"date": today, "label": "inventory day"}],
    )  # fmt: skip
    tasks["invoices"] = task_create(
        owner=operator, runner="noop", name="invoice run", cron="*/2 * * * *", timezone="Europe/Berlin",
        calendar=office, calendar_policy="next_business_day",
    )  # fmt: skip
    from notifications.services import channel_create, channel_send_test, rule_create

    oncall = channel_create(owner=operator, data={"name": "on-call", "kind": "email", "target": "oncall@example.com"})
    rule_create(owner=operator, data={"task": tasks["backup"], "channel": oncall, "on_failure": True, "on_retry": True})
    # A webhook nobody listens to: its deliveries fail, and after three failed attempts in a row
    # the channel reads failing, with the reason in words.
    hook = channel_create(
        owner=operator,
        data={"name": "team webhook", "kind": "webhook", "target": f"http://127.0.0.1:{_free_port()}/tms"},
    )
    rule_create(
        owner=operator,
        data={"channel": hook, "on_failure": True, "on_recovery": True, "digest_every": timedelta(hours=1)},
    )
    rule_create(owner=operator, data={"task": tasks["cleanup"], "channel": hook, "on_skip": True})
    for _ in range(3):
        channel_send_test(channel=hook)
    return tasks


def take(driver, url: str, path: Path, *, wait_css: str = "main", click: tuple[str, ...] = ()) -> None:
    """A full-page screenshot of ``url`` (through the DevTools protocol: beyond the viewport),
    after clicking the elements ``click`` names (a folded form, the phone menu)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, 20).until(ec.presence_of_element_located((By.CSS_SELECTOR, wait_css)))
    for css in click:
        driver.find_element(By.CSS_SELECTOR, css).click()
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 6000), "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="how long the tasks run before the screenshots")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    _environment()
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from executions.models import Execution, ExecutionStatus, SkippedOccurrence
    from executions.services import execution_retry_by_user
    from tests.browser.conftest import log_in, make_browser
    from tooling.harness.processes import ManagedProcess, process_env, start_monitor, start_worker, wait_ready

    call_command("migrate", verbosity=0)
    users = get_user_model().objects
    operator = users.filter(username="operator").first() or users.create_user(
        "operator", password="operator-password", is_staff=True, is_superuser=True
    )
    alice = users.filter(username="alice").first() or users.create_user("alice", password="alice-password")
    tasks = seed(operator, alice)

    logs = ROOT / "var" / "screenshot-logs"
    port = _free_port()
    python = sys.executable
    procs = [
        start_worker("worker", log_dir=logs, concurrency=4),
        start_monitor("monitor", log_dir=logs),
        start_worker("notify-worker", log_dir=logs, concurrency=1, queue=settings.TMS_NOTIFY_QUEUE),
        ManagedProcess("beat", [python, "-m", "celery", "-A", "tms_project", "beat", "-l", "warning"], process_env(),
                       logs),
        ManagedProcess("web", [python, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"], process_env(),
                       logs),
    ]  # fmt: skip
    try:
        wait_ready(procs[0], 60)
        deadline = time.monotonic() + args.minutes * 60
        retried = None
        while time.monotonic() < deadline:
            time.sleep(10)
            left = int(deadline - time.monotonic())
            counts = {s: Execution.objects.filter(status=s).count() for s in ExecutionStatus.values}
            print(f"{max(left, 0):4d}s left: {counts}", flush=True)
            failed = Execution.objects.filter(task=tasks["backup"], status=ExecutionStatus.FAILED).order_by("id")
            if retried is None and failed.exists():
                retried = failed.first()
                execution_retry_by_user(execution=retried, actor="user:operator")  # a retry by hand
        args.out.mkdir(parents=True, exist_ok=True)
        base = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryDirectory() as profile:
            driver = make_browser(Path(profile))
            try:
                log_in(driver, base, "operator", "operator-password")
                take(driver, f"{base}/?window=1h", args.out / "dashboard.png", wait_css="#tile-runs")
                # The task whose runs overlap: skipped occurrences, and "why" asked about one of them.
                skipped = SkippedOccurrence.objects.filter(task=tasks["report"]).order_by("-scheduled_for").first()
                at = f"?at={quote(skipped.scheduled_for.isoformat())}#why" if skipped else ""
                take(driver, f"{base}/ui/tasks/{tasks['report'].pk}/{at}", args.out / "task.png")
                take(driver, f"{base}/ui/tasks/{tasks['backup'].pk}/", args.out / "task-failing.png")
                if retried is not None:
                    take(driver, f"{base}/ui/executions/{retried.pk}/", args.out / "execution.png")
                take(driver, f"{base}/ui/notifications/", args.out / "notifications.png", click=("#new-rule summary",))
                take(driver, f"{base}/ui/tasks/{tasks['invoices'].pk}/", args.out / "task-calendar.png")
                take(
                    driver,
                    f"{base}/ui/tasks/",
                    args.out / "task-form.png",
                    click=("#new-task > summary", "#new-task details.more > summary"),
                )
                driver.get(f"{base}/ui/tokens/")
                driver.find_element(By.CSS_SELECTOR, "#new-token summary").click()
                driver.find_element(By.ID, "id_name").send_keys("CI deploys")
                driver.find_element(By.CSS_SELECTOR, "#new-token-form button[type=submit]").click()
                WebDriverWait(driver, 20).until(ec.presence_of_element_located((By.ID, "new-key-value")))
                shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
                (args.out / "tokens.png").write_bytes(base64.b64decode(shot["data"]))
            finally:
                driver.quit()
        with tempfile.TemporaryDirectory() as profile:
            driver = make_browser(Path(profile), phone=True)
            try:
                log_in(driver, base, "operator", "operator-password")
                take(driver, f"{base}/?window=1h", args.out / "phone-dashboard.png", wait_css="#tile-runs",
                     click=("#menu-toggle",))  # fmt: skip
                take(driver, f"{base}/ui/tasks/{tasks['backup'].pk}/", args.out / "phone-task.png")
            finally:
                driver.quit()
    finally:
        for proc in reversed(procs):
            proc.stop()
        from tms_project.celery import app

        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(settings.TMS_QUEUE)
            conn.default_channel.queue_delete(settings.TMS_NOTIFY_QUEUE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
