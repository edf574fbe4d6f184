"""Beat's scheduler: django-celery-beat's DatabaseScheduler with two idle costs taken out.

Measured on an idle platform (nothing due, TMS's periodic jobs only): beat used 6-7 ms of CPU
a second, the most of any process, and made 14 of the platform's 19 commits a second.
"""

from __future__ import annotations

import time
from typing import Any

from django_celery_beat.schedulers import DatabaseScheduler


class TmsDatabaseScheduler(DatabaseScheduler):
    """:class:`~django_celery_beat.schedulers.DatabaseScheduler` that neither spins before a due
    job nor asks the database about changes at every tick.

    * **No spin.** Celery wakes 10 ms early (``Scheduler.adjust``'s drift). Woken before the job
      is due, the tick reschedules it for the few milliseconds left, less the drift again: a
      negative sleep, which the service loop skips, so beat ticked in a busy loop until the job
      was due, 40-90 ticks for each job sent (about 900 ticks in 20 s with jobs every 2 and 5 s).
      Here a wait shorter than the drift is slept as it is.
    * **Change checks once per loop interval.** The stock scheduler reads ``schedule`` twice a
      tick, and each read asks the database whether a periodic task changed (a health-check
      ``SELECT 1`` and a query on ``django_celery_beat_periodictasks``, a commit each). Here the
      database is asked at most once per ``max_interval`` (``beat_max_loop_interval``, 5 s by
      default): an edit in the admin takes effect within that, as the stock scheduler's longest
      sleep already allows.
    """

    _changes_checked_at: float | None = None

    def adjust(self, n: Any, drift: float = -0.010) -> Any:
        adjusted = super().adjust(n, drift=drift)
        if isinstance(n, int | float) and n > 0 and adjusted <= 0:
            return n
        return adjusted

    def schedule_changed(self) -> bool:
        now = time.monotonic()
        if self._changes_checked_at is not None and now - self._changes_checked_at < self.max_interval:
            return False
        self._changes_checked_at = now
        return bool(super().schedule_changed())
