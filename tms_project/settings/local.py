"""Settings for a checkout: ``make run``, ``manage.py`` and ``celery`` use these by default.

DEBUG is on and, with ``DJANGO_SECRET_KEY`` unset, the public development key signs sessions and
callback tokens: fine on a laptop, never on a reachable server (``production`` refuses it). Logs
stay human-readable.
"""

from tms_project.settings.base import *  # noqa: F403
from tms_project.settings.base import (
    DEVELOPMENT_APPS,
    DEVELOPMENT_SECRET_KEY,
    INSTALLED_APPS,
    TMS,
    development_secrets_key,
    env,
    logging_from_env,
)

# make run's demo set-up (tms_demo), the benchmark and the chaos run are run from a checkout.
INSTALLED_APPS = [*INSTALLED_APPS, *DEVELOPMENT_APPS]
DEBUG = env.bool("DJANGO_DEBUG", default=True)
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default=DEVELOPMENT_SECRET_KEY)
# Human-readable lines on the console of `make run` (TMS_LOG_FORMAT=json shows what production writes).
LOGGING = logging_from_env("plain")

if not TMS["SECRET_KEYS"]:
    # DEVELOPMENT ONLY: a key derived from SECRET_KEY encrypts secret config values when
    # TMS_SECRET_KEYS is unset (production refuses to start without TMS_SECRET_KEYS).
    TMS = {**TMS, "SECRET_KEYS": (development_secrets_key(SECRET_KEY),)}
