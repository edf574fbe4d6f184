"""Logging filters for the processes ``make run`` starts.

Beat sends ``tms.materialise`` every 5 s and ``tms.liveness`` every 5 s; at INFO a worker logs
"received" and "succeeded" for each, and beat "Sending due task", so housekeeping filled the
console (and pushed ``make run``'s banner with the credentials off the screen within seconds)
while the executions people care about scrolled by in between. This filter drops those INFO lines
for housekeeping tasks only; their warnings and errors still show, and execution tasks log as
before. ``TMS_LOG_HOUSEKEEPING=true`` turns it off.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

#: Celery task names of the periodic system jobs (see executions.periodic).
HOUSEKEEPING_TASKS = frozenset({"tms.materialise", "tms.liveness", "tms.expire_idempotency_keys"})


class QuietHousekeeping(logging.Filter):
    """Drop records below WARNING about a housekeeping task (by the task name in their arguments)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        args = record.args
        values = args.values() if isinstance(args, Mapping) else args if isinstance(args, tuple) else ()
        return not any(isinstance(value, str) and value in HOUSEKEEPING_TASKS for value in values)
