"""Logging filters for the processes ``make run`` starts.

Beat sends its system jobs (``tms.materialise`` and ``tms.liveness`` every 5 s,
``tms.notify_dispatch`` every few seconds, ``tms.rollup_compact`` every minute, the hourly expiries
and prunes); at INFO a worker logs "received" and "succeeded" for each, and beat "Sending due
task", so housekeeping filled the console (and pushed ``make run``'s banner with the credentials
off the screen within seconds) while the executions people care about scrolled by in between.
This filter drops those INFO lines for every beat system job (:data:`HOUSEKEEPING_TASKS`: a test
checks it names each job of ``executions.periodic`` and ``notifications.periodic``); their
warnings and errors still show, and execution tasks and notification deliveries
(``tms.notify_deliver``) log as before. ``TMS_LOG_HOUSEKEEPING=true`` turns it off.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

#: Celery task names of beat's system jobs (executions.periodic and notifications.periodic; a
#: test keeps the two in step). Written out: the logging set-up reads it before Django's apps load.
HOUSEKEEPING_TASKS = frozenset(
    {
        "tms.materialise",
        "tms.liveness",
        "tms.expire_idempotency_keys",
        "tms.expire_quota_uses",
        "tms.expire_artifact_uploads",
        "tms.rollup_prune",
        "tms.rollup_compact",
        "tms.prune",
        "tms.workflow_timeouts",
        "tms.workflow_retries",
        "tms.notify_dispatch",
        "tms.notify_checks",
    }
)


class QuietHousekeeping(logging.Filter):
    """Drop records below WARNING about a housekeeping task (by the task name in their arguments)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        args = record.args
        values = args.values() if isinstance(args, Mapping) else args if isinstance(args, tuple) else ()
        return not any(isinstance(value, str) and value in HOUSEKEEPING_TASKS for value in values)
