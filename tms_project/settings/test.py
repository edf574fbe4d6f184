"""Settings for the pytest suite: the real PostgreSQL and RabbitMQ, never the embedded default."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tms")
os.environ.setdefault("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
os.environ.setdefault("TMS_HTTP_ALLOWED_NETWORKS", "127.0.0.1/32")
# A queue of this run's own, so messages left by an earlier or parallel run never reach it.
os.environ.setdefault("TMS_QUEUE", f"tms.test.{os.getpid()}")

from tms_project.settings.base import *  # noqa: F403
from tms_project.settings.base import REST_FRAMEWORK, TMS

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
TMS = {**TMS, "MATERIALISE_HORIZON": 60.0, "MONITOR_MAX_SLEEP": 0.5}
# Throttling stays on (as in production) but far above anything the suite sends.
REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "DEFAULT_THROTTLE_RATES": {"user": "1000000/minute", "anon": "1000000/minute"},
}
