"""Beat's scheduler (tms_project.beat): what an idle beat costs, and that jobs still go out on time.

The stock DatabaseScheduler spun for the last 10 ms before every due job (Celery's wake-up drift
made the sleep negative, and a negative sleep is skipped), 40-90 ticks a job, and asked the
database twice a tick whether a periodic task had changed: 6-7 ms of CPU and 14 commits a
second on an idle platform.
"""

from __future__ import annotations

import threading
import time

import pytest
from celery import beat
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

from tms_project.beat import TmsDatabaseScheduler
from tms_project.celery import app

#: The scheduler commits and closes old connections as it does in beat: committed data.
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_wait_shorter_than_the_wake_up_drift_is_slept_not_skipped():
    scheduler = TmsDatabaseScheduler(app=app, lazy=True)
    assert scheduler.adjust(0.004) == 0.004  # the stock scheduler: -0.006, no sleep, a spin
    assert scheduler.adjust(2.0) == pytest.approx(1.99)  # longer waits keep the early wake-up
    assert scheduler.adjust(0) == 0 and scheduler.adjust(None) is None


def _ticks(scheduler_cls: type, seconds: float, tmp_path) -> tuple[int, list[str]]:
    """Run beat's service loop in a thread for ``seconds``: its ticks and the jobs it sent."""
    ticks: list[float] = []
    sent: list[str] = []

    class Counting(scheduler_cls):  # type: ignore[misc, valid-type]
        def tick(self, *args, **kwargs):
            ticks.append(time.monotonic())
            return super().tick(*args, **kwargs)

        def apply_async(self, entry, producer=None, advance=True, **kwargs):
            sent.append(entry.name)  # counted, not sent: no worker consumes them here

    service = beat.Service(app=app, scheduler_cls=Counting, schedule_filename=str(tmp_path / "schedule"))
    thread = threading.Thread(target=service.start, daemon=True)
    thread.start()
    time.sleep(seconds)
    service.stop()
    thread.join(timeout=10)
    return len(ticks), sent


def test_beat_sends_each_job_on_time_without_spinning_before_it(tmp_path):
    PeriodicTask.objects.all().delete()
    every_second, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(name="tick-test", task="tms.liveness", interval=every_second)

    ticks, sent = _ticks(TmsDatabaseScheduler, 5.5, tmp_path)

    # Once at start (a new entry is due at once), then every second.
    assert 5 <= sent.count("tick-test") <= 7, sent
    # A tick to send, a tick to sleep until the next: about two a job, not 40-90.
    assert ticks <= 4 * len(sent) + 4, (ticks, len(sent))


def test_beat_asks_the_database_about_changes_at_most_once_per_loop_interval(monkeypatch):
    scheduler = TmsDatabaseScheduler(app=app, lazy=True)
    clock = [1000.0]
    monkeypatch.setattr("tms_project.beat.time.monotonic", lambda: clock[0])

    with CaptureQueriesContext(connection) as queries:
        changes = [scheduler.schedule_changed() for _ in range(20)]
    asked = len(queries)
    assert changes == [False] * 20
    assert 1 <= asked <= 2  # the change query, and a health check where CONN_HEALTH_CHECKS is on

    every, _ = IntervalSchedule.objects.get_or_create(every=7, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(name="beat-change-check", task="tms.liveness", interval=every)
    assert PeriodicTasks.last_change() is not None
    clock[0] += scheduler.max_interval / 2
    assert scheduler.schedule_changed() is False  # not asked yet: within the interval
    clock[0] += scheduler.max_interval / 2
    assert scheduler.schedule_changed() is True  # asked again, and the edit is seen
    assert scheduler.max_interval == 5
