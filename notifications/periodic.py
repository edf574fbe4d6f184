"""The notification system jobs, registered for beat's DatabaseScheduler as executions.periodic does."""

from __future__ import annotations

from typing import Any

from tms_core.conf import tms_settings


def periodic_jobs() -> dict[str, tuple[str, float]]:
    """name -> (Celery task name, seconds between runs)."""
    conf = tms_settings()
    return {
        "tms: dispatch notifications": ("tms.notify_dispatch", conf.NOTIFY_INTERVAL),
        "tms: notification checks (long runs, dead man's switch)": ("tms.notify_checks", conf.NOTIFY_CHECK_INTERVAL),
    }


def register_periodic_tasks(**kwargs: Any) -> None:
    """Create the jobs once; an operator's later changes in the admin are kept."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    using = kwargs.get("using", "default")
    for name, (task, seconds) in periodic_jobs().items():
        if PeriodicTask.objects.using(using).filter(name=name).exists():
            continue
        every = max(1, round(seconds))
        schedule, _ = IntervalSchedule.objects.using(using).get_or_create(every=every, period=IntervalSchedule.SECONDS)
        # A dispatch that waited longer than a few intervals in the queue is dropped: the next
        # one does the same work (each pass takes whatever is due).
        PeriodicTask.objects.using(using).create(
            name=name, task=task, interval=schedule, description="TMS system job", expire_seconds=max(5, every * 3)
        )
