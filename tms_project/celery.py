"""The Celery application shared by workers, beat and the monitor's publisher."""

import logging
import logging.config
import os
import signal
import threading
import time
import warnings
from types import FrameType
from typing import Any

from amqp.exceptions import ChannelError
from celery import Celery
from celery.beat import Service
from celery.exceptions import CPendingDeprecationWarning, WorkerShutdown
from celery.signals import beat_init, celeryd_init, setup_logging
from celery.worker.consumer import Consumer
from celery.worker.state import maybe_shutdown

# A checkout runs the local settings; the docker image sets DJANGO_SETTINGS_MODULE to production.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tms_project.settings.local")

logger = logging.getLogger(__name__)

app = Celery("tms_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Worker registration and heartbeat (loaded by name when a worker starts).
app.steps["worker"].add("executions.heartbeat:HeartbeatStep")


class TmsConsumer(Consumer):
    """Celery's consumer, waiting between restarts that a channel error caused.

    With ``broker_channel_error_retry`` (settings) a channel error while the consumer starts is
    retried as a lost connection is, instead of ending the worker. On a RabbitMQ cluster that
    error is the declare of a classic queue whose home node is down (404 NOT_FOUND), and it
    stays until the node is back: Celery's consumer then restarted at once, five times a second
    with a critical "Frequent restarts detected" and a traceback each second. This waits 0.5 s,
    then 1 s, then every 2 s (so a worker consumes again within about 2 s of the node's return),
    a sleep that a warm or cold shutdown interrupts. A channel error more than a minute after the
    previous one starts again at 0.5 s.
    """

    #: The longest wait between two restarts for a channel error.
    CHANNEL_ERROR_WAIT_MAX = 2.0

    class Blueprint(Consumer.Blueprint):  # type: ignore[valid-type,misc]  # the stubs type it as a variable
        """Celery's consumer steps less ``DelayedDelivery``: Celery adds it when it sees a quorum
        queue (TMS_QUEUE_TYPE=quorum), and at every start it connects to each node of the URL list
        in turn (retrying a node that is down for about 3 s) to declare the 28 exchanges and
        queues of native delayed delivery. TMS never sends an ETA or countdown to a quorum queue
        (executions.messages.eta_of), and native delayed delivery only routes through topic
        exchanges, which TMS's are not: the step bought nothing and delayed a worker's start
        while a node was down."""

        default_steps = [step for step in Consumer.Blueprint.default_steps if not step.endswith(":DelayedDelivery")]

    _channel_errors = 0
    _last_channel_error = 0.0

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        with warnings.catch_warnings():
            # Celery warns at every reconnect that it lets running acks-late tasks run on and will
            # cancel them from Celery 6 (worker_cancel_long_running_tasks_on_connection_loss). TMS
            # wants them to run on: a run's lease in PostgreSQL, not its message, says which
            # worker ends it, and the redelivered message's claim is refused. Thirteen lines of
            # warning at each restart of an outage said nothing more.
            warnings.filterwarnings("ignore", category=CPendingDeprecationWarning)
            super().on_connection_error_after_connected(exc)
        if not isinstance(exc, ChannelError):
            return  # a lost connection: kombu's reconnect has its own retry policy
        from tms_core.conf import tms_settings
        from tms_core.queue_type import queue_type_mismatch

        mismatch = queue_type_mismatch(exc, tms_settings().QUEUE_TYPE)
        if mismatch is not None:
            # A queue that exists as the other type refuses every declare until an operator acts:
            # stop with what to do (exit code 1), not a restart every 2 s for ever.
            logger.critical("%s", mismatch)
            raise WorkerShutdown(1) from exc
        now = time.monotonic()
        if now - self._last_channel_error > 60:
            self._channel_errors = 0
        self._channel_errors += 1
        self._last_channel_error = now
        deadline = now + min(self.CHANNEL_ERROR_WAIT_MAX, 0.25 * 2**self._channel_errors)
        while time.monotonic() < deadline:
            maybe_shutdown()
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


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
