"""A timed materialiser pass over many recurring tasks (``manage.py tms_scale N``).

The tasks are inserted set-based under a dedicated user, each with exactly one occurrence
inside the horizon: half on an hourly interval, each starting at its own second of the next
four minutes (so no two share a grid, as with tasks created through the API), half on an hourly
cron expression in one of several time zones, its minute chosen so that it fires within the
next two minutes. Then two passes are timed: the first creates one execution per task, the
second must create nothing. The tasks and their executions are deleted afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from zoneinfo import ZoneInfo

from django.contrib.auth import get_user_model
from django.db import connection

from executions.materialiser import materialise_due
from tasks_app.models import Task
from tms_core.clock import db_now
from tooling.harness.fill import insert_tasks

SCALE_USER = "tms-scale-check"
#: Zones of the cron half, including ones whose offsets are not whole hours.
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "Asia/Kathmandu")


@dataclass(frozen=True)
class ScaleResult:
    tasks: int
    fill_seconds: float
    first_pass_seconds: float
    first_pass_created: int
    second_pass_seconds: float
    second_pass_created: int

    def __str__(self) -> str:
        return (
            f"{self.tasks} recurring tasks (inserted in {self.fill_seconds:.1f}s): first pass "
            f"{self.first_pass_seconds:.2f}s, created {self.first_pass_created}; second pass "
            f"{self.second_pass_seconds:.2f}s, created {self.second_pass_created}"
        )


def materialise_scale_check(*, tasks: int) -> ScaleResult:
    """Insert ``tasks`` due recurring tasks, time two materialiser passes, clean up."""
    owner = get_user_model().objects.get_or_create(username=SCALE_USER)[0]
    Task.objects.filter(owner=owner).delete()
    started = time.monotonic()
    # The local minute, in each zone, of a fire time one to two minutes from now.
    soon = db_now() + timedelta(minutes=2)
    crons = [f"{soon.astimezone(ZoneInfo(zone)).minute} * * * *" for zone in ZONES]
    with connection.cursor() as cursor:
        insert_tasks(
            cursor,
            owner_id=owner.pk,
            count=tasks,
            columns={
                "name": "'scale ' || g",
                "start_at": "s.start_at",
                "interval": "CASE WHEN g %% 2 = 0 THEN interval '1 hour' END",
                "cron": "CASE WHEN g %% 2 = 1 THEN (%(crons)s::text[])[1 + g / 2 %% %(zones)s] ELSE '' END",
                "timezone": "CASE WHEN g %% 2 = 1 THEN (%(names)s::text[])[1 + g / 2 %% %(zones)s] ELSE 'UTC' END",
                "next_run_at": "s.start_at",
            },
            params={"crons": crons, "names": list(ZONES), "zones": len(ZONES)},
            # Interval tasks each on a grid of their own; cron tasks from now.
            lateral=", LATERAL (SELECT CASE WHEN g %% 2 = 0 THEN date_trunc('second', now()) "
            "+ g %% 240 * interval '1 second' + g %% 997 * interval '1 millisecond' "
            "ELSE date_trunc('second', now()) END AS start_at) AS s",
        )
        cursor.execute("ANALYZE tasks_app_task")
    fill = time.monotonic() - started
    try:
        started = time.monotonic()
        first = materialise_due()
        first_seconds = time.monotonic() - started
        started = time.monotonic()
        second = materialise_due()
        second_seconds = time.monotonic() - started
    finally:
        Task.objects.filter(owner=owner).delete()
    return ScaleResult(tasks, fill, first_seconds, first, second_seconds, second)
