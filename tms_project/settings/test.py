"""Settings for the pytest suite: the real PostgreSQL and RabbitMQ, never the embedded default.

Defaults are set in the environment before ``base`` reads it, so the worker and monitor
processes a test starts (which inherit or override that environment) agree with the test.
"""

import os
import tempfile

from tms_project.settings.public_keys import TEST_SECRET_KEY, TEST_SECRETS_KEY

#: This run's own names (queues, folders). A process of pytest-xdist inherits the environment that
#: its controller already filled in, so a worker that meets its controller's names takes its own:
#: two workers on one queue would consume each other's runs. A platform process a test starts
#: inherits its worker's names, and its PYTEST_XDIST_WORKER with them, and keeps both.
_RUN = str(os.getpid())
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if os.environ.get("TMS_TEST_XDIST_WORKER", "") != _XDIST_WORKER:
    os.environ["TMS_TEST_XDIST_WORKER"] = _XDIST_WORKER
    for _name in ("TMS_QUEUE", "TMS_NOTIFY_QUEUE", "TMS_SUBPROCESS_WORK_DIR", "PROMETHEUS_MULTIPROC_DIR"):
        os.environ.pop(_name, None)

for _name, _value in {
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/tms",
    "CELERY_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//",
    # A key of the suite's own (the base has none); public, so production refuses it (PUBLIC_KEYS).
    "DJANGO_SECRET_KEY": TEST_SECRET_KEY,
    "TMS_HTTP_ALLOWED_NETWORKS": "127.0.0.1/32",
    # The suite's e-mail (tasks and notification channels) goes to example.com only.
    "TMS_EMAIL_ALLOWED_RECIPIENTS": "@example.com",
    # TEST ONLY: the suite's own Fernet key for secret config values (public, like the key above).
    "TMS_SECRET_KEYS": TEST_SECRETS_KEY,
    # A queue of this run's own, so messages left by an earlier or parallel run never reach it.
    "TMS_QUEUE": f"tms.test.{_RUN}",
    "TMS_NOTIFY_QUEUE": f"tms.test.{_RUN}.notify",
    # Beat's notification jobs (registered at migrate) run often enough for tests to wait on them.
    "TMS_NOTIFY_INTERVAL": "1",
    "TMS_NOTIFY_CHECK_INTERVAL": "2",
    "TMS_MATERIALISE_HORIZON": "60",
    "TMS_MONITOR_MAX_SLEEP": "0.5",
    # Subprocess run folders of this run's own: execution ids restart at 1 in each test database.
    "TMS_SUBPROCESS_WORK_DIR": os.path.join(tempfile.gettempdir(), f"tms-test-runs-{_RUN}"),
    "TMS_SUBPROCESS_ALLOW_ARTIFACTS": "true",
    # prometheus_client's multiprocess mode, in a folder of this run's own: the monitor and worker
    # processes a test starts write their metrics where the test's /metrics reads them.
    "PROMETHEUS_MULTIPROC_DIR": os.path.join(tempfile.gettempdir(), f"tms-test-metrics-{_RUN}"),
    "TMS_SUBPROCESS_ALLOWED_EXECUTABLES": "/bin/sh,/usr/bin/env,sleep,echo,true,false",
    # Throttling stays on (as in production) but far above anything the suite sends.
    "TMS_API_THROTTLE_USER": "1000000/minute",
    "TMS_API_THROTTLE_ANON": "1000000/minute",
    "TMS_CALLBACK_THROTTLE": "1000000/minute",
    "TMS_HOOK_THROTTLE": "1000000/minute",
}.items():
    os.environ.setdefault(_name, _value)

from tms_project.settings.base import *  # noqa: E402,F403
from tms_project.settings.base import DEVELOPMENT_APPS, INSTALLED_APPS, TMS_RUNNERS, logging_from_env  # noqa: E402

# The benchmark's and the chaos run's commands and Celery task, which the suite runs.
INSTALLED_APPS = [*INSTALLED_APPS, *DEVELOPMENT_APPS]

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The sleep runner stands in for real work in the suite's running-system tests, which schedule it
# every 50 ms to make runs overlap: no minimum interval for it here (the others keep theirs).
TMS_RUNNERS = TMS_RUNNERS | {
    "crash": {"BACKEND": "tests.runners_for_tests.CrashRunner"},
    "sleep": {**TMS_RUNNERS["sleep"], "MIN_INTERVAL": 0},
}
# Readable test logs (var/test-logs); the JSON format has its own test (TMS_LOG_FORMAT=json).
LOGGING = logging_from_env("plain")
