"""gunicorn settings for the web role (docker/entrypoint.sh web). Every value can be changed from
the environment: https://docs.gunicorn.org/en/stable/settings.html"""

import os

# Where to listen: all interfaces in a container; TMS_WEB_HOST narrows it (tests use 127.0.0.1).
bind = [f"{os.environ.get('TMS_WEB_HOST', '0.0.0.0')}:{os.environ.get('PORT', '8000')}"]  # noqa: S104
# The web's database connection budget: one persistent connection (CONN_MAX_AGE) per worker
# thread, so WEB_CONCURRENCY x GUNICORN_THREADS per web process (synchronous workers when threads
# is 1). Requests beyond them wait in the listen queue instead of opening connections (docs/deployment.md,
# "Scaling out"; tests/ops/test_connection_budget.py). `make run` uses this file too.
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("GUNICORN_THREADS", "1"))
# A request longer than this is killed and answered 502 by the worker's replacement.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
# On SIGTERM (docker stop) requests in flight get this long to finish.
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "25"))
keepalive = 5
# Recycle workers now and then so a slow leak cannot grow for ever; jitter spreads the restarts.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "2000"))
max_requests_jitter = 200
# The heartbeat file of each worker: in memory, not on the container's overlay file system.
# A RAM-backed folder of the container's own, not a shared temporary folder.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None  # noqa: S108
# Access and error logs to stdout/stderr, where the container platform collects them.
accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("TMS_LOG_LEVEL", "info").lower()
# No control socket: the container is stopped and scaled by the platform (signals), and the user
# has no writable home for the socket file.
control_socket_disable = True
# Trust X-Forwarded-* only from these proxy addresses (the reverse proxy in front of the web role).
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")


def child_exit(server, worker):
    """A gunicorn worker exited: drop its live-gauge files from the multiprocess metrics folder
    (its counters stay, summed into the totals; see tms_core/metrics.py)."""
    from tms_core.metrics import mark_process_dead

    mark_process_dead(worker.pid)


# gunicorn's own error and access lines in the format of every other TMS process (TMS_LOG_FORMAT:
# json by default here, as in the production settings), one line each on stderr.
from tms_project.log_config import build_logging  # noqa: E402 - after the values above, on purpose

logconfig_dict = build_logging(
    fmt=os.environ.get("TMS_LOG_FORMAT", "json"), level=os.environ.get("TMS_LOG_LEVEL", "INFO")
)
logconfig_dict["loggers"].update(
    {name: {"handlers": ["console"], "propagate": False} for name in ("gunicorn.error", "gunicorn.access")}
)
