"""manage.py tms_check: one OK/FAIL line per check, exit 0 only when everything is fine."""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from kombu import Queue

from executions import transitions
from executions.periodic import periodic_jobs
from tests.factories import TaskFactory
from tests.ops.test_health import closed_port
from tests.processes import run_command, running, start_monitor, start_worker, wait_for
from tms_project.celery import app

pytestmark = pytest.mark.django_db


def tms_check(*only: str) -> tuple[int, dict[str, tuple[str, str]]]:
    """Run the command; return its exit status and {check: (OK|FAIL, detail)}."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command("tms_check", *(f"--only={name}" for name in only), stdout=out, stderr=err, no_color=True)
    except SystemExit as exit_:
        code = int(exit_.code)
    return code, _parse(out.getvalue())


def _parse(output: str) -> dict[str, tuple[str, str]]:
    lines = {}
    for line in output.splitlines():
        match = re.match(r"^(OK|FAIL)\s+(.+?)\s{2,}(.*)$", line)
        assert match, f"not a check line: {line!r}"
        lines[match[2]] = (match[1], match[3])
    return lines


@pytest.fixture
def declared_queue(settings):
    """The run's execution queue, declared as the app declares it (a worker would on start)."""
    with app.connection_for_write() as conn:
        for queue in settings.CELERY_TASK_QUEUES:
            queue(conn.default_channel).declare()
    return settings.TMS_QUEUE


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_all_ok_with_a_worker_and_a_monitor_running(declared_queue):
    with running(start_worker(concurrency=1), start_monitor()):
        # The worker's heartbeat row and consumer, and the monitor's LISTEN session.
        code, lines = wait_for(
            lambda: (result := tms_check())[0] == 0 and "1 consumers" in result[1]["queue"][1] and result,
            timeout=60,
            what="every check to pass",
        )
    assert code == 0
    assert list(lines) == [
        "database",
        "broker",
        "migrations",
        "queue",
        "runners",
        "beat schedule",
        "monitor",
        "workers",
    ]
    assert all(status == "OK" for status, _ in lines.values()), lines
    assert "{'x-max-priority': 9}" in lines["queue"][1] and "1 consumers" in lines["queue"][1]
    assert lines["monitor"][1].startswith("1 connected")
    assert lines["workers"][1].startswith("1 alive")
    assert lines["beat schedule"][1].startswith(f"{len(periodic_jobs())} jobs registered and enabled")


def test_no_worker_and_no_monitor_fail_with_exit_1(declared_queue):
    code, lines = tms_check()
    assert code == 1
    failed = {name for name, (status, _) in lines.items() if status == "FAIL"}
    assert failed == {"monitor", "workers"}
    assert lines["workers"][1] == "none alive (no heartbeat within 30s)"
    assert lines["monitor"][1] == "no monitor connected (no LISTEN session in pg_stat_activity)"


def test_an_execution_waiting_past_its_due_time_fails_the_monitor_check():
    task = TaskFactory()
    transitions.executions_create(
        rows=[transitions.NewExecution(task.pk, timezone.now() - timedelta(minutes=5), 5)], actor="test"
    )
    code, lines = tms_check("monitor")
    assert code == 1
    assert "1 executions overdue by more than 60s" in lines["monitor"][1]


def test_a_queue_declared_without_priorities_fails(settings):
    name = f"{settings.TMS_QUEUE}.plain"
    with app.connection_for_write() as conn:
        Queue(name, durable=True)(conn.default_channel).declare()
        try:
            settings.CELERY_TASK_QUEUES = (Queue(name, durable=True, queue_arguments={"x-max-priority": 9}),)
            code, lines = tms_check("queue")
        finally:
            conn.default_channel.queue_delete(name)
    assert code == 1
    status, detail = lines["queue"]
    assert status == "FAIL"
    assert f"{name}: arguments differ from {{'x-max-priority': 9}}" in detail and "PRECONDITION_FAILED" in detail


def test_a_classic_queue_checked_as_quorum_fails_naming_the_setting_and_the_migration(settings):
    name = f"{settings.TMS_QUEUE}.classic"
    with app.connection_for_write() as conn:
        Queue(name, durable=True, queue_arguments={"x-max-priority": 9})(conn.default_channel).declare()
        try:
            settings.TMS_QUEUE_TYPE = "quorum"
            settings.CELERY_TASK_QUEUES = (Queue(name, durable=True, queue_arguments={"x-queue-type": "quorum"}),)
            code, lines = tms_check("queue")
        finally:
            conn.default_channel.queue_delete(name)
    assert code == 1
    status, detail = lines["queue"]
    assert status == "FAIL" and "PRECONDITION_FAILED" in detail
    assert f"RabbitMQ refused to declare queue '{name}' as a quorum queue (TMS_QUEUE_TYPE=quorum)" in detail
    assert "Either set TMS_QUEUE_TYPE=classic again, or migrate" in detail


def test_a_missing_queue_fails(settings):
    settings.CELERY_TASK_QUEUES = (Queue(f"{settings.TMS_QUEUE}.never-declared", durable=True),)
    code, lines = tms_check("queue")
    assert code == 1 and "not declared; no worker has started" in lines["queue"][1]


def test_a_runner_that_does_not_load_fails(settings):
    settings.TMS_RUNNERS = {
        **settings.TMS_RUNNERS,
        "broken": {"BACKEND": "runners.noop.NoopRunner", "OPTIONS": {"x": 1}},
    }
    code, lines = tms_check("runners")
    assert code == 1
    assert lines["runners"][0] == "FAIL" and "TMS_RUNNERS['broken']: unknown OPTIONS x" in lines["runners"][1]


def test_a_disabled_or_missing_system_job_fails_the_beat_check():
    assert tms_check("beat_schedule")[0] == 0
    PeriodicTask.objects.filter(name="tms: materialise upcoming executions").update(enabled=False)
    code, lines = tms_check("beat_schedule")
    assert (code, lines["beat schedule"]) == (
        1,
        ("FAIL", "disabled in the admin: tms: materialise upcoming executions"),
    )
    PeriodicTask.objects.filter(name="tms: mark silent workers dead").delete()
    assert (
        "not registered (run migrate): tms: mark silent workers dead"
        in tms_check("beat_schedule")[1]["beat schedule"][1]
    )


def test_unreachable_database_and_broker_fail_with_exit_1():
    port = closed_port()
    result = run_command(
        "tms_check",
        "--no-color",
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{port}/tms",
        CELERY_BROKER_URL=f"amqp://guest:guest@127.0.0.1:{port}//",
    )
    assert result.returncode == 1, result.stderr
    lines = _parse(result.stdout)
    assert {name: status for name, (status, _) in lines.items()} == {
        "database": "FAIL",
        "broker": "FAIL",
        "migrations": "FAIL",
        "queue": "FAIL",
        "runners": "OK",
        "beat schedule": "FAIL",
        "monitor": "FAIL",
        "workers": "FAIL",
    }
    assert lines["migrations"][1] == "skipped: database unreachable"
    assert "7 of 8 checks failed: database, broker, migrations, queue, beat schedule, monitor, workers" in result.stderr
