"""Periodic system jobs, registered in code for beat's DatabaseScheduler.

They are (re)created after every ``migrate``, so operators see them in the admin's "Periodic
tasks" and can pause them or change their interval there: an existing entry is left as the
operator set it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tms_core.conf import tms_settings


#: name -> (Celery task name, seconds between runs)
def periodic_jobs() -> dict[str, tuple[str, float]]:
    conf = tms_settings()
    return {
        "tms: materialise upcoming executions": ("tms.materialise", conf.MATERIALISE_INTERVAL),
        "tms: mark silent workers dead": ("tms.liveness", conf.HEARTBEAT_INTERVAL),
        "tms: expire API idempotency keys": ("tms.expire_idempotency_keys", 3600.0),
        "tms: expire quota uses past their window": ("tms.expire_quota_uses", 3600.0),
        "tms: prune the dashboard rollup": ("tms.rollup_prune", 3600.0),
        "tms: fold the dashboard rollup's shards": ("tms.rollup_compact", 60.0),
        "tms: expire unfinished artifact uploads": ("tms.expire_artifact_uploads", 300.0),
        "tms: prune and archive old executions": ("tms.prune", conf.RETENTION_INTERVAL),
        "tms: cancel workflow runs past their timeout": ("tms.workflow_timeouts", 60.0),
        "tms: retry failed workflow runs": ("tms.workflow_retries", 60.0),
    }


def register_jobs(
    jobs: Mapping[str, tuple[str, float]], *, using: str = "default", expire_after: int | None = None
) -> None:
    """Create each of ``jobs`` (name -> (Celery task name, seconds between runs)) that beat does not
    have yet; an existing entry is left as the operator set it. With ``expire_after``, a run that
    waited longer than that many intervals in the queue is dropped (at least 5 seconds)."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    for name, (task, seconds) in jobs.items():
        if PeriodicTask.objects.using(using).filter(name=name).exists():
            continue
        every = max(1, round(seconds))
        schedule, _ = IntervalSchedule.objects.using(using).get_or_create(every=every, period=IntervalSchedule.SECONDS)
        expire_seconds = None if expire_after is None else max(5, every * expire_after)
        PeriodicTask.objects.using(using).create(
            name=name, task=task, interval=schedule, description="TMS system job", expire_seconds=expire_seconds
        )


def register_periodic_tasks(**kwargs: Any) -> None:
    """The engine's jobs, after every ``migrate`` (a ``post_migrate`` receiver)."""
    register_jobs(periodic_jobs(), using=kwargs.get("using", "default"))
