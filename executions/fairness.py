"""Fair share between teams: which due runs the monitor publishes next, and how many.

The broker queue is first in, first out within a priority, so fairness has to be decided before
a run is published: once one team's herd of 10,000 is in the queue, another team's single run
waits behind all of it. The monitor therefore keeps the queue shallow (:class:`Pacer`: about
``TMS_MONITOR_QUEUE_SECONDS`` of work published and not yet started, at the rate the workers
start runs) and fills it by :func:`pick_fair` (weighted round-robin between teams, priority then
due order within a team). Two users of one team share that team's one share. The policy is
stated in docs/when-a-run-may-start.md.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from executions import transitions
from executions.models import Execution, ExecutionStatus
from tasks_app.models import TeamQuota
from tms_core.conf import TmsSettings, tms_settings

#: The fair order of the due SCHEDULED runs, set-based: each team's runs are numbered (their
#: ``turn``: priority first, then due time) and a turn is worth ``turn / weight``, so over any
#: stretch a team of weight 3 gets three runs for one of a team of weight 1 (the steady state
#: of deficit round-robin with a quantum of ``weight`` runs). Ties go to the heavier team, then
#: the higher priority, the earlier due time, the lower id. No team can be given more than
#: ``limit`` runs, so only each team's first ``limit`` turns are read.
#:
#: On PostgreSQL that read is a few index probes per team, whatever the backlog: the (team,
#: priority) levels that have runs waiting come from a skip scan of ``execution_team_fair_idx``
#: (one probe each; nothing at all when no run is due), then each level's next due runs from the
#: same index (``team_id, priority`` equal, ``due_at`` up to now, in due order). Numbering every
#: due row joined to its task, as the first version did, read and sorted the whole backlog at
#: every top-up: 22 ms a pick with 10,000 runs of one owner due (10 picks a second while the
#: queue is held back), against 0.9 ms.
_FAIR_SQL = """
WITH RECURSIVE levels AS (
    (SELECT e.team_id, e.priority FROM {execution} e
     WHERE e.status = 'SCHEDULED'
       AND EXISTS (SELECT 1 FROM {execution} d WHERE d.status = 'SCHEDULED' AND d.due_at <= {due_by})
     ORDER BY e.team_id, e.priority LIMIT 1)
    UNION ALL
    SELECT n.team_id, n.priority FROM levels l
    CROSS JOIN LATERAL (
        SELECT e.team_id, e.priority FROM {execution} e
        WHERE e.status = 'SCHEDULED' AND (e.team_id, e.priority) > (l.team_id, l.priority)
        ORDER BY e.team_id, e.priority LIMIT 1
    ) n
), turns AS (
    SELECT l.team_id, r.id, l.priority, r.due_at,
           row_number() OVER (PARTITION BY l.team_id ORDER BY l.priority DESC, r.due_at, r.id) AS turn
    FROM levels l
    CROSS JOIN LATERAL (
        SELECT e.id, e.due_at FROM {execution} e
        WHERE e.team_id = l.team_id AND e.priority = l.priority AND e.status = 'SCHEDULED'
          AND e.due_at <= {due_by}
        ORDER BY e.due_at, e.id LIMIT %(limit)s
    ) r
)
SELECT d.id
FROM turns d
LEFT JOIN {quota} q ON q.team_id = d.team_id
WHERE d.turn <= %(limit)s
ORDER BY d.turn::float8 / COALESCE(q.fair_weight, %(weight)s), COALESCE(q.fair_weight, %(weight)s) DESC,
         d.priority DESC, d.due_at, d.id
LIMIT %(limit)s
"""


def pick_fair(*, limit: int, default_weight: int | None = None, ahead: float = 0.0) -> list[int]:
    """The ids of the next ``limit`` due SCHEDULED executions in fair order (see ``_FAIR_SQL``).
    Reads without locking: the take that follows locks and re-checks each row. ``ahead``: rows
    due within that many seconds count as due (the monitor's lookahead)."""
    if limit <= 0:
        return []
    weight = default_weight if default_weight is not None else tms_settings().FAIR_WEIGHT
    names = {
        "execution": connection.ops.quote_name(Execution._meta.db_table),
        "quota": connection.ops.quote_name(TeamQuota._meta.db_table),
    }
    params: dict[str, Any] = {"limit": limit, "weight": weight}
    # Each statement's own clock, as the take's: a fixed instant read before would age.
    due_by = "statement_timestamp() + make_interval(secs => %(ahead)s)" if ahead else "statement_timestamp()"
    sql = _FAIR_SQL.format(**names, due_by=due_by)
    params["ahead"] = ahead
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def take_due_fairly(*, limit: int, actor: str, ahead: float = 0.0) -> list[transitions.Dispatch]:
    """Take (SCHEDULED → PENDING) up to ``limit`` due executions chosen by :func:`pick_fair`, in
    that order (the order they are published in). Call inside the monitor's transaction. A row
    another monitor took or locked meanwhile is skipped, so two monitors never take one row; the
    one that lost takes fewer this time and more at its next top-up."""
    ids = pick_fair(limit=limit, ahead=ahead)
    if not ids:
        return []
    taken = transitions.executions_take_due(limit=len(ids), actor=actor, among=ids, ahead=ahead)
    order = {execution_id: index for index, execution_id in enumerate(ids)}
    return sorted(taken, key=lambda item: order[item.execution_id])


def published_unstarted(*, cap: int, older_than: float) -> int:
    """Runs published and not yet started (PENDING), counted up to ``cap`` on the PENDING index.
    Rows PENDING for ``older_than`` seconds or more are left out: their message is presumed lost
    and the monitor publishes them again, they are not in the queue."""
    since = ExpressionWrapper(Now() - Value(timedelta(seconds=older_than)), output_field=DateTimeField())
    return Execution.objects.filter(status=ExecutionStatus.PENDING, enqueued_at__gt=since)[:cap].count()


def steps_published() -> int:
    """How many workflow steps workers have published themselves, ever (the sequence
    ``executions_take_steps`` counts them on): read by each look of a pacer, as they are queued
    beside what the monitors publish."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {transitions.STEPS_PUBLISHED}")  # noqa: S608 - our name
        return int(cursor.fetchone()[0])


#: Seconds of history behind the start-rate estimate.
RATE_WINDOW = 2.0
#: The most runs a pacer keeps published, whatever the rate (bounds the count query too).
MAX_PENDING = 100_000


class Pacer:
    """How many more runs one monitor may publish now: ``target - published and not started``,
    where the target is about ``MONITOR_QUEUE_SECONDS`` of work at the rate workers have started
    runs over the last ``RATE_WINDOW`` seconds (at least ``MONITOR_MIN_PENDING``). The rate is
    measured from the PENDING count itself (runs that left PENDING since the previous look,
    beside what this monitor published), so it follows the workers, however many there are,
    without asking them; several monitors each see the whole queue and so never add up to more
    than about one target (a race can overshoot by one batch, it cannot lose a run).

    Two things keep a herd from being paced by its own slow start. A look after an idle spell
    (nothing queued, nothing published) drops the history: those seconds say nothing of how
    fast the workers start runs, and counted in the window they held the measured rate, and so
    the target, near the floor for its whole length (a herd of 1,000 went out 8 runs per top-up).
    And a look that finds the queue drained (every run published was started) at least doubles
    the target: the workers waited for work, so they can start more than was measured."""

    def __init__(self, conf: TmsSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.conf = conf
        self._clock = clock
        self._last_pending: int | None = None
        self._published = 0
        self._last_steps: int | None = None
        self._starts: deque[tuple[float, int]] = deque()
        self.target = conf.MONITOR_MIN_PENDING

    @property
    def queued(self) -> int:
        """Runs published and not started at the last look (0 before any)."""
        return self._last_pending or 0

    def published(self, count: int) -> None:
        """Record runs this monitor published since the last :meth:`room`."""
        self._published += count

    def rate(self, now: float) -> float:
        """Runs started per second over the last ``RATE_WINDOW`` seconds (0 before any history)."""
        while self._starts and now - self._starts[0][0] > RATE_WINDOW:
            self._starts.popleft()
        if len(self._starts) < 2:
            return 0.0
        span = max(now - self._starts[0][0], self.conf.MONITOR_TOPUP_INTERVAL)
        return sum(count for _, count in list(self._starts)[1:]) / span

    def room(self) -> int:
        """How many runs may be published now (0: the queue is deep enough)."""
        pending = published_unstarted(cap=MAX_PENDING, older_than=self.conf.PENDING_REPUBLISH_AFTER)
        return self._look(pending, steps_published())

    def idle(self) -> None:
        """A look that found nothing PENDING, made by the monitor's outlook instead of
        :meth:`room` (nothing was due, so there was nothing to publish): it keeps the history
        of starts as a look that counted no PENDING run would, so the next herd starts as
        after an idle spell."""
        self._look(0)

    def _look(self, pending: int, steps: int | None = None) -> int:
        """``steps``: :func:`steps_published` now (None: not read). The workflow steps workers
        published since the last look were queued beside this monitor's runs: counted as
        published, or their starts would not be seen (the queue would look as deep as before,
        with nothing started) and the pacer would hold its own runs back while the steps flowed."""
        now = self._clock()
        beside = 0 if steps is None or self._last_steps is None else max(0, steps - self._last_steps)
        self._last_steps = steps
        published = self._published + beside
        started = 0 if self._last_pending is None else max(0, self._last_pending + published - pending)
        quiet = not self._last_pending and published == 0  # None: this monitor's first look
        if quiet:
            self._starts.clear()  # an idle spell: no history of starts to go by
        self._starts.append((now, started))
        self._last_pending, self._published = pending, 0
        wanted = math.ceil(self.rate(now) * self.conf.MONITOR_QUEUE_SECONDS)
        if pending == 0 and started > 0:
            wanted = max(wanted, 2 * self.target)  # drained: the workers waited for work
        if quiet and pending == 0:
            # Nothing queued, before this look or now: whatever is due now (a herd
            # on the minute) goes out as MONITOR_MIN_PENDING full messages, one for each of that
            # many pool processes, rather than as MONITOR_MIN_PENDING single runs that the
            # ramp above would need half a second of top-ups to grow from. Runs due at this
            # same instant share those messages through the fair take; a message's runs that
            # wait more than a second are handed on to the queue's tail (worker_services).
            wanted = max(wanted, self.conf.MONITOR_MIN_PENDING * self.conf.DISPATCH_BATCH)
        self.target = min(MAX_PENDING, max(self.conf.MONITOR_MIN_PENDING, wanted))
        return max(0, self.target - pending)
