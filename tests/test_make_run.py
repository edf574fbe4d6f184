"""What ``make run`` shows: housekeeping stays out of Flower and the console, and the banner with
the demo credentials is kept in var/ and printed again once start-up is done."""

from __future__ import annotations

import io
import logging
import re
import stat

import pytest
from django.core.management import call_command

from accounts.account_keys import account_key_digest
from accounts.models import AccountKey
from executions import periodic as execution_periodic
from executions import tasks as execution_tasks
from notifications import periodic as notification_periodic
from tasks_app import tasks as task_tasks
from tms_project.celery import app
from tms_project.log_filters import HOUSEKEEPING_TASKS, QuietHousekeeping


def _record(message: str, args, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("celery.app.trace", level, __file__, 1, message, args, None)


def test_housekeeping_sends_no_task_events_to_flower_and_executions_do():
    for task in (execution_tasks.materialise, execution_tasks.liveness, task_tasks.expire_idempotency_keys):
        assert app.tasks[task.name].send_events is False, task.name
    assert app.tasks["tms.run_execution"].send_events is True
    assert app.tasks["tms.poll_execution"].send_events is True
    assert app.tasks["tms.run_executions"].send_events is True
    assert {t.name for t in (execution_tasks.materialise, execution_tasks.liveness)} <= HOUSEKEEPING_TASKS


def test_every_beat_system_job_is_quiet_housekeeping():
    """Every job beat sends (both registries) is dropped from the INFO logs and sends no task
    events (issue 26: make run printed 1,138 INFO lines of tms.notify_dispatch in 13 minutes, and
    Flower listed tms.rollup_compact)."""
    app.loader.import_default_modules()  # every app's tasks module, as a worker loads them
    jobs = {task for task, _ in execution_periodic.periodic_jobs().values()}
    jobs |= {task for task, _ in notification_periodic.periodic_jobs().values()}
    assert jobs == HOUSEKEEPING_TASKS
    for name in jobs:
        assert app.tasks[name].send_events is False, name
    quiet = QuietHousekeeping()
    for name in jobs:
        received = {"id": "1", "name": name, "args": "()", "kwargs": "{}"}
        assert not quiet.filter(_record("Task %(name)s[%(id)s] received", received)), name
        succeeded = {"id": "1", "name": name, "return_value": "0", "runtime": 0.01}
        assert not quiet.filter(_record("Task %(name)s[%(id)s] succeeded in %(runtime)ss: %(return_value)s", succeeded))
        assert not quiet.filter(_record("Scheduler: Sending due task %s (%s)", ("tms: job", name)))
    # Notification deliveries are work, not housekeeping: they log and show in Flower.
    assert app.tasks["tms.notify_deliver"].send_events is True
    deliver = {"id": "1", "name": "tms.notify_deliver", "args": "()", "kwargs": "{}"}
    assert quiet.filter(_record("Task %(name)s[%(id)s] received", deliver))


def test_the_log_filter_drops_housekeeping_info_lines_only():
    quiet = QuietHousekeeping()
    received = {"id": "1", "name": "tms.materialise", "args": "()", "kwargs": "{}"}
    assert not quiet.filter(_record("Task %(name)s[%(id)s] received", received))
    assert not quiet.filter(_record("Scheduler: Sending due task %s (%s)", ("tms: liveness", "tms.liveness")))
    assert quiet.filter(_record("Task %(name)s[%(id)s] received", {**received, "name": "tms.run_execution"}))
    assert quiet.filter(_record("Task %(name)s[%(id)s] raised", received, level=logging.ERROR))
    assert quiet.filter(_record("plain message", None))


@pytest.mark.parametrize("name", ["celery.app.trace", "celery.worker.strategy", "celery.beat"])
def test_the_worker_and_beat_loggers_carry_the_filter(name):
    assert any(isinstance(f, QuietHousekeeping) for f in logging.getLogger(name).filters)


@pytest.mark.django_db
def test_the_banner_is_written_to_var_and_says_so_in_its_first_line(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    out = io.StringIO()
    call_command("tms_demo", "--port", "8123", stdout=out)
    printed = out.getvalue()
    banner = tmp_path / "run-banner.txt"
    first = next(line for line in printed.splitlines() if line)
    assert str(banner) in first
    saved = banner.read_text()
    (token,) = re.findall(r"token:     ([0-9a-f]{40})\n", printed)
    assert AccountKey.objects.get(user__username="admin").digest == account_key_digest(token)
    assert token in saved and "http://127.0.0.1:8123/admin/" in saved
    assert stat.S_IMODE(banner.stat().st_mode) == 0o600


def test_the_procfile_prints_the_banner_again_after_start_up():
    from django.conf import settings

    procfile = (settings.BASE_DIR / "tms_project" / "Procfile").read_text()
    (line,) = [line for line in procfile.splitlines() if line.startswith("banner:")]
    assert "run-banner.txt" in line


def _run_environment(*make_args: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``make run`` starts its processes with: its process manager's command (from
    ``make -n``) run by bash with ``env`` in its place."""
    import os
    import subprocess

    from django.conf import settings

    printed = subprocess.run(
        ["make", "-n", "run", *make_args], cwd=settings.BASE_DIR, capture_output=True, text=True, check=True
    ).stdout
    command = printed.replace("\\\n", " ")
    (line,) = [line for line in command.splitlines() if "tooling.run_platform --procfile" in line]
    line = line.split(" -m tooling.run_platform --procfile")[0].rsplit(maxsplit=1)[0] + " env"
    base = {k: v for k, v in os.environ.items() if k not in ("TMS_FLOWER_URL", "TMS_PUBLIC_URL")} | (env or {})
    shown = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True, env=base).stdout
    return dict(row.split("=", 1) for row in shown.splitlines() if "=" in row)


def test_make_run_links_flower_on_the_port_it_starts_it_on():
    assert _run_environment("FLOWER_PORT=5999")["TMS_FLOWER_URL"] == "http://127.0.0.1:5999"
    assert _run_environment()["TMS_FLOWER_URL"] == "http://127.0.0.1:5555"
    # A Flower elsewhere (behind a proxy) is linked where the operator says.
    given = {"TMS_FLOWER_URL": "https://flower.example.org"}
    assert _run_environment("FLOWER_PORT=5999", env=given)["TMS_FLOWER_URL"] == "https://flower.example.org"


def test_make_run_gives_the_public_url_of_the_port_it_serves_on():
    """Issue 44: `make run PORT=8123` served on 8123 while trigger and callback URLs said 8000."""
    assert _run_environment("PORT=8123")["TMS_PUBLIC_URL"] == "http://127.0.0.1:8123"
    assert _run_environment()["TMS_PUBLIC_URL"] == "http://127.0.0.1:8000"
    # A site published elsewhere (behind a proxy) keeps the URL the operator gives.
    given = {"TMS_PUBLIC_URL": "https://tms.example.org"}
    assert _run_environment("PORT=8123", env=given)["TMS_PUBLIC_URL"] == "https://tms.example.org"
