"""The logging configuration of every process (web, worker, beat, monitor), from the environment.

``TMS_LOG_FORMAT`` is ``json`` (one JSON object per line, through python-json-logger: what a log
collector parses) or ``plain`` (human-readable, ``make run``); ``TMS_LOG_LEVEL`` the root level.
Every line carries the execution ids bound where an execution is handled
(:mod:`tms_core.logcontext`). Celery is told not to configure logging itself
(``tms_project.celery``), so workers and beat log through this configuration too; gunicorn's own
error and access logs use it as well (``docker/gunicorn.conf.py``). Nothing here imports Django.
"""

from __future__ import annotations

import logging
from typing import Any

FORMATS = ("json", "plain")
#: Housekeeping tasks log nothing below WARNING from workers and beat (tms_project/log_filters.py).
HOUSEKEEPING_LOGGERS = ("celery.app.trace", "celery.worker.strategy", "celery.beat")


class LoggingConfigError(ValueError):
    """A logging variable has a value this module cannot use; the message names it."""


def build_logging(*, fmt: str, level: str, quiet_housekeeping: bool = True) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dictionary: one stderr handler on the root logger, in
    ``fmt``, at ``level``. Raises :class:`LoggingConfigError` for an unknown format or level."""
    fmt = fmt.strip().lower()
    if fmt not in FORMATS:
        raise LoggingConfigError(f"TMS_LOG_FORMAT must be one of {', '.join(FORMATS)}, not {fmt!r}")
    level = level.strip().upper()
    if not isinstance(logging.getLevelName(level), int):
        raise LoggingConfigError(f"TMS_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, not {level!r}")
    quiet = {"filters": ["quiet_housekeeping"]} if quiet_housekeeping else {}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "plain": {
                "()": "tms_core.logcontext.PlainFormatter",
                "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
            },
            "json": {
                "()": "pythonjsonlogger.json.JsonFormatter",
                # asctime as an ISO 8601 "time" field in UTC; process ids tell pool processes apart.
                "format": "%(asctime)s %(levelname)s %(name)s %(message)s %(process)d",
                "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
                "timestamp": False,
                "datefmt": "%Y-%m-%dT%H:%M:%S%z",
            },
        },
        "filters": {
            "context": {"()": "tms_core.logcontext.ContextFilter"},
            "quiet_housekeeping": {"()": "tms_project.log_filters.QuietHousekeeping"},
        },
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": fmt,
                "filters": ["context"],
            }
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": dict.fromkeys(HOUSEKEEPING_LOGGERS, quiet),
    }
