"""The notification system jobs, registered for beat's DatabaseScheduler as executions.periodic does."""

from __future__ import annotations

from typing import Any

from executions.periodic import register_jobs
from tms_core.conf import tms_settings


def periodic_jobs() -> dict[str, tuple[str, float]]:
    """name -> (Celery task name, seconds between runs)."""
    conf = tms_settings()
    return {
        "tms: dispatch notifications": ("tms.notify_dispatch", conf.NOTIFY_INTERVAL),
        "tms: notification checks (long runs, dead man's switch)": ("tms.notify_checks", conf.NOTIFY_CHECK_INTERVAL),
    }


def register_periodic_tasks(**kwargs: Any) -> None:
    """Create the jobs once; an operator's later changes in the admin are kept. A dispatch that
    waited longer than a few intervals in the queue is dropped: the next one does the same work
    (each pass takes whatever is due)."""
    register_jobs(periodic_jobs(), using=kwargs.get("using", "default"), expire_after=3)
