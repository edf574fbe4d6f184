"""The Celery application shared by workers, beat and the monitor's publisher."""

import logging
import logging.config
import os
import signal
import threading
from types import FrameType
from typing import Any

from celery import Celery
from celery.beat import Service
from celery.signals import beat_init, celeryd_init, setup_logging

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


@beat_init.connect
def _stop_beat_between_ticks(sender: Service, **kwargs: Any) -> None:
    """SIGTERM/SIGINT stop beat between ticks, never inside one.

    Celery's own handler saves the schedule from inside the signal handler and raises
    ``SystemExit`` wherever beat happens to be: in the middle of a tick, with a job half sent or
    the scheduler's query on the database connection the save then reuses. This one (installed
    when beat starts, over Celery's) asks the service to stop; it raises ``SystemExit`` only when
    the signal arrives in the service's own loop (sleeping between ticks, or about to), where the
    loop catches it and saves the schedule on its way out. A tick in progress finishes first, and
    the loop then ends before the next one.
    """
    if threading.current_thread() is not threading.main_thread():
        return  # beat embedded in a worker thread (-B): signals belong to the worker
    loop = Service.start.__code__

    def stop(signum: int, frame: FrameType | None) -> None:
        sender.stop()
        if frame is not None and frame.f_code is loop:
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
