"""The Celery application shared by workers, beat and the monitor's publisher."""

import logging
import logging.config
import os
from typing import Any

from celery import Celery
from celery.signals import celeryd_init, setup_logging

# A checkout runs the local settings; the docker image sets DJANGO_SETTINGS_MODULE to production.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tms_project.settings.local")

app = Celery("tms_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Worker registration and heartbeat (loaded by name when a worker starts).
app.steps["worker"].add("executions.heartbeat:HeartbeatStep")


@celeryd_init.connect
@setup_logging.connect
def _use_django_logging(**kwargs: Any) -> None:
    """Workers and beat log through Django's LOGGING (tms_project.log_config: JSON or plain, the
    execution ids on each line), not Celery's own handlers. A receiver of this signal makes Celery
    skip its logging set-up entirely (``-l/--loglevel`` then does nothing: TMS_LOG_LEVEL sets the
    level), and ``worker_hijack_root_logger = False`` keeps it off the root logger besides. Also
    run at ``celeryd_init``, before the worker's start-up checks warn (running as root, say), so
    that warning is a log line in the configured format too."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    # Python warnings become log records too, so nothing unformatted reaches stderr.
    logging.captureWarnings(True)
