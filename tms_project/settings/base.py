"""TMS settings shared by every environment. Every value comes from the environment (12-factor)
through django-environ. Run with one of the modules beside it: ``local`` (a checkout: the default
of ``manage.py`` and ``celery``), ``production`` (the docker image, and the default of ``wsgi``) or
``test`` (pytest). This module sets no secret key of its own.

With neither ``DATABASE_URL`` nor ``CELERY_BROKER_URL`` set, the platform runs on an embedded
default (a private PostgreSQL and kombu's filesystem broker under ``var/``: see
tms_core/embedded_db.py), so one command starts everything on a laptop. Production and the tests
set both, to PostgreSQL and RabbitMQ.
"""

from __future__ import annotations

import base64
import hashlib
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

from tms_core.conf import tms_from_environment
from tms_project.log_config import LoggingConfigError, build_logging
from tms_project.oidc_config import OidcConfigError, build_oidc_settings

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(environ.Env().str("TMS_VAR_DIR", default=str(BASE_DIR / "var")))

env = environ.Env()

DEBUG = env.bool("DJANGO_DEBUG", default=False)
#: The key a checkout runs with (``local.py`` only). It is public, so ``production.py`` refuses it:
#: anyone could sign callback tokens and sessions with it.
DEVELOPMENT_SECRET_KEY = "dev-only-insecure-key-change-me-in-production"  # noqa: S105 - public on purpose


def development_secrets_key(secret_key: str) -> str:
    """DEVELOPMENT ONLY: a Fernet key derived from ``secret_key``, used by ``local`` when
    ``TMS_SECRET_KEYS`` is unset (``production`` refuses to start without TMS_SECRET_KEYS)."""
    digest = hashlib.sha256(b"tms-development-secrets-key:" + secret_key.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()


from tms_project.settings.public_keys import TEST_SECRET_KEY, TEST_SECRETS_KEY  # noqa: E402 - beside its use

#: Every key that appears in this repository (settings, tests, documentation), and the secrets
#: keys ``local`` derives from them: anyone can read them, so ``production`` refuses each one as
#: ``DJANGO_SECRET_KEY`` and in ``TMS_SECRET_KEYS`` (a forged callback token or session, or a
#: decrypted secret, would follow). ``tests/ops/test_settings_modules.py`` scans the repository for
#: key-like values and fails on any that is not here.
PUBLIC_KEYS = frozenset(
    {
        DEVELOPMENT_SECRET_KEY,
        TEST_SECRET_KEY,
        TEST_SECRETS_KEY,
        development_secrets_key(DEVELOPMENT_SECRET_KEY),
        development_secrets_key(TEST_SECRET_KEY),
    }
)

# No fallback: with DJANGO_SECRET_KEY unset, Django refuses to sign anything (ImproperlyConfigured)
# instead of signing with a key that is in the repository.
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Index expressions with an operator class (the task search's trigram index, tasks_app 0017);
    "django.contrib.postgres",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    # Login lockout for the admin, the back office and the browsable API's login (see below).
    "axes",
    "runners",
    "tasks_app",
    "executions",
    "tasks_api",
    "accounts",
    "notifications",
    "ops",
    "backoffice",
]
#: The benchmark, chaos run, scale check and demo set-up (commands, and the benchmark's Celery task
#: ``tms.bench_noop``): installed by the settings of a checkout (``local``: make run, tms_bench) and of
#: the suite (``test``), never by ``production``, and left out of the docker image. The product never
#: imports it (tests/test_layering.py).
DEVELOPMENT_APPS = ["tooling"]

MIDDLEWARE = [
    # First: probes answer before the SSL redirect and the host check (a container platform
    # probes by IP over plain HTTP).
    "ops.middleware.HealthCheckMiddleware",
    # Prometheus scrapes by container name over plain HTTP too (ops/metrics.py).
    "ops.metrics.MetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's, and Swagger UI and ReDoc from drf-spectacular-sidecar) are
    # served by the web process itself, also under gunicorn with DEBUG off: no CDN, no extra server.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # SSO sessions are checked again with the provider every TMS_OIDC_RENEW_SECONDS (a GET is sent
    # back to it, silently); other sessions and API tokens pass untouched, and so does all with SSO off.
    "accounts.oidc.SessionRefresh",
    # Who acts and from where, for the audit log the services write (tasks_app/audit.py).
    "tasks_app.audit.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # With DEBUG on (make run), a mistyped URL gets the styled 404, not Django's list of URL patterns.
    "tms_project.pages.NotFoundPageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Answers a locked-out login with its lockout response (after the view has run).
    "axes.middleware.AxesMiddleware",
    # Last, so its process_exception sees a view's database or broker error first: a 503, not a 500.
    "ops.middleware.OutageMiddleware",
]

# --- Login lockout (django-axes) --------------------------------------------------------------
# Every password login goes through django.contrib.auth's authenticate() with the request: the
# admin's, the back office's /ui/login/ and the browsable API's /api-auth/login/. Axes counts the
# failures per username and client address together (one attacker cannot lock a user out from
# everywhere, nor try many passwords from one place) and refuses that pair, the right password
# included, until the cool-off has passed. API tokens are not passwords: token requests never
# reach authenticate() and are not affected. The address is tms_core.client_address's, as for the
# throttles and the audit log: the peer's, or behind the proxies of TMS_TRUSTED_PROXIES the one
# they forwarded (X-Forwarded-For from anyone else, which a client can forge, is never believed).
AXES_CLIENT_IP_CALLABLE = "tms_core.client_address.client_address"
AUTHENTICATION_BACKENDS = [
    # A service account (accounts/service_accounts.py) never signs in with a password, whatever it is.
    "accounts.service_accounts.ServiceAccountLoginGate",
    # With SSO on and TMS_OIDC_LOCAL_LOGIN=false, refuses every password login made through a page.
    "accounts.oidc.LocalLoginGate",
    # Single sign-on (docs/sso.md): answers only the OIDC callback, and only with SSO on (axes
    # leaves that callback alone: AXES_WHITELIST_CALLABLE below).
    "accounts.oidc.OidcBackend",
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_ENABLED = env.bool("TMS_LOGIN_LOCKOUT", default=True)
#: Wrong passwords in a row (per username and address) before the lockout.
AXES_FAILURE_LIMIT = env.int("TMS_LOGIN_FAILURE_LIMIT", default=5)
#: How long a lockout lasts; failures older than this are forgotten too.
AXES_COOLOFF_TIME = timedelta(seconds=env.int("TMS_LOGIN_COOLOFF_SECONDS", default=15 * 60))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
#: A try during the lockout does not extend it (else an attacker keeps the user out for good).
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_HTTP_RESPONSE_CODE = 429
#: The SSO callback guesses no password (the provider applies its own lockout): axes neither counts
#: nor refuses it, so refused sign-ins (counted without a username) never lock an address out.
AXES_WHITELIST_CALLABLE = "accounts.oidc.axes_exempt"

ROOT_URLCONF = "tms_project.urls"
WSGI_APPLICATION = "tms_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "tms_project" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "backoffice.context_processors.backoffice",
                "accounts.oidc.sso_context",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------------------------
# https://django-environ.readthedocs.io/en/latest/types.html#environ-env-db-url
#: Whether this process runs on the embedded default database (no DATABASE_URL configured).
TMS_EMBEDDED_DATABASE = not env.str("DATABASE_URL", default="")
if TMS_EMBEDDED_DATABASE:
    from tms_core.embedded_db import settings_dict as _embedded_database

    DATABASES = {"default": _embedded_database(VAR_DIR)}
else:
    DATABASES = {"default": env.db_url("DATABASE_URL")}
    if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured(
            "DATABASE_URL must be a postgres:// URL: TMS runs on PostgreSQL only (leave it unset for the"
            " embedded default, a private PostgreSQL under var/)."
        )
# Persistent connections: django-environ's URL parser sets CONN_MAX_AGE=0 (a new connection,
# and a new PostgreSQL backend process, for every request and every Celery task), so set it
# here. https://docs.djangoproject.com/en/5.2/ref/databases/#persistent-connections
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = env.bool("DATABASE_CONN_HEALTH_CHECKS", default=True)
# An unreachable server fails a request (a 503) in seconds instead of hanging it.
DATABASES["default"].setdefault("OPTIONS", {})
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", env.int("DATABASE_CONNECT_TIMEOUT", default=5))
# Behind PgBouncer in transaction pooling mode (docs/deployment.md "Behind PgBouncer"): a client
# holds a server connection for one transaction at a time, so nothing may outlive a transaction.
# Django's server-side cursors (.iterator() outside a transaction: a WITH HOLD cursor fetched from
# in later transactions) are turned off, and the monitor's LISTEN, which needs a session, goes to
# PostgreSQL directly (TMS_LISTEN_DATABASE_URL) while everything else goes through the pooler.
DATABASE_POOLER = env.str("TMS_DATABASE_POOLER", default="none")
LISTEN_DATABASE_URL = env.str("TMS_LISTEN_DATABASE_URL", default="")
if DATABASE_POOLER not in ("none", "transaction"):
    raise ImproperlyConfigured("TMS_DATABASE_POOLER must be none or transaction (PgBouncer's pool_mode).")
if LISTEN_DATABASE_URL and not LISTEN_DATABASE_URL.startswith(("postgres://", "postgresql://")):
    raise ImproperlyConfigured("TMS_LISTEN_DATABASE_URL must be a postgres:// URL.")
if DATABASE_POOLER == "transaction":
    if not LISTEN_DATABASE_URL:
        raise ImproperlyConfigured(
            "TMS_DATABASE_POOLER=transaction needs TMS_LISTEN_DATABASE_URL: a URL of the same database on"
            " PostgreSQL itself, not through the pooler, for the monitor's LISTEN (a session)."
        )
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Times with seconds everywhere (the admin included): tms_project/formats/en/formats.py.
FORMAT_MODULE_PATH = ["tms_project.formats"]

STATIC_URL = "static/"
STATIC_ROOT = env.str("DJANGO_STATIC_ROOT", default=str(VAR_DIR / "static"))
# https://whitenoise.readthedocs.io/en/stable/django.html#WHITENOISE_USE_FINDERS
# Serve from the apps' static folders, so no collectstatic step is needed (run it, with
# DJANGO_STATIC_ROOT, to serve from one folder instead).
WHITENOISE_USE_FINDERS = env.bool("TMS_STATIC_USE_FINDERS", default=True)
# Without collectstatic, STATIC_ROOT does not exist; with the finders that is expected, not a warning.
warnings.filterwarnings("ignore", message=r"No directory at: ", category=UserWarning)
MEDIA_ROOT = env.str("DJANGO_MEDIA_ROOT", default=str(VAR_DIR / "media"))
MEDIA_URL = "media/"

# --- Logging ----------------------------------------------------------------------------------
# One JSON object per line by default (production, the docker image); ``local`` (make run) and
# ``test`` default to the plain format. Every line of an execution's life carries its ids
# (tms_core.logcontext). Housekeeping tasks (materialise, liveness every 5 s) log nothing below
# WARNING from the worker and beat unless TMS_LOG_HOUSEKEEPING is set: see tms_project/log_filters.py.
TMS_LOG_HOUSEKEEPING = env.bool("TMS_LOG_HOUSEKEEPING", default=False)


def logging_from_env(default_format: str) -> dict:
    """The LOGGING dictionary for ``TMS_LOG_FORMAT`` (else ``default_format``) and ``TMS_LOG_LEVEL``."""
    try:
        return build_logging(
            fmt=env.str("TMS_LOG_FORMAT", default=default_format),
            level=env.str("TMS_LOG_LEVEL", default="INFO"),
            quiet_housekeeping=not TMS_LOG_HOUSEKEEPING,
        )
    except LoggingConfigError as exc:
        raise ImproperlyConfigured(str(exc)) from None


LOGGING = logging_from_env("json")

# --- Caches -----------------------------------------------------------------------------------
# Throttling counts requests in the cache: with several web processes, point CACHE_URL at a
# shared cache (e.g. "dbcache://tms_cache" after `manage.py createcachetable`, or Redis/Memcached).
# https://django-environ.readthedocs.io/en/latest/types.html#environ-env-cache-url
CACHES = {"default": env.cache_url("CACHE_URL", default="locmemcache://")}
# The dashboard keeps the rollup's settled hours between renders (executions.rollup): in each
# process's own memory, so a render reads them without a round trip. Keys carry the set of teams,
# the hour and the rollup's epoch, so several processes each holding their own copy stay correct.
# Per set of teams (staff: all teams) a day is 24 entries; an entry is one hour's per-minute counts.
CACHES["dashboard"] = {
    "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
    "LOCATION": "tms-dashboard",
    "TIMEOUT": 25 * 3600,
    "OPTIONS": {"MAX_ENTRIES": env.int("TMS_DASHBOARD_CACHE_ENTRIES", default=5000)},
}

# --- REST framework ---------------------------------------------------------------------------
# https://www.django-rest-framework.org/api-guide/settings/
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Personal access tokens (tms_pat_...) and the older per-user DRF keys, as Bearer or Token.
        "accounts.authentication.AccessTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "accounts.permissions.TokenScopePermission",
    ],
    "DEFAULT_PARSER_CLASSES": ["tms_core.api.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "tms_core.api.base.Pagination",
    "PAGE_SIZE": env.int("TMS_API_PAGE_SIZE", default=50),
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
        "rest_framework.filters.SearchFilter",
    ],
    # Per-user (and, before authentication, per-IP) request rates: "<n>/<second|minute|hour|day>".
    # https://www.django-rest-framework.org/api-guide/throttling/
    "DEFAULT_THROTTLE_CLASSES": [
        "tms_core.api.throttling.UserRateThrottle",
        "tms_core.api.throttling.AnonRateThrottle",
    ],
    # Counted per tms_core.client_address (TMS_TRUSTED_PROXIES), never per a client's own
    # X-Forwarded-For (which DRF's NUM_PROXIES, unset, would count by).
    "DEFAULT_THROTTLE_RATES": {
        "user": env.str("TMS_API_THROTTLE_USER", default="2000/minute"),
        "anon": env.str("TMS_API_THROTTLE_ANON", default="100/minute"),
    },
    "DEFAULT_SCHEMA_CLASS": "tasks_api.schema.AutoSchema",
    "EXCEPTION_HANDLER": "tms_core.api.errors.exception_handler",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

# The API's own knobs, read through tms_core.api.conf.api_settings (the limits services
# apply, such as TMS_MATERIALISE_MAX, are in TMS below).
if env.str("TMS_API_NUM_PROXIES", default=""):
    # Not read any more: ignoring it silently would leave a deployment counting whom it did not mean to.
    raise ImproperlyConfigured(
        "TMS_API_NUM_PROXIES is replaced by TMS_TRUSTED_PROXIES: list the addresses or networks of the proxies "
        "in front of the web (docs/configuration.md), then unset TMS_API_NUM_PROXIES."
    )

TMS_API = {
    "COMPAT_LIST_MAX": env.int("TMS_API_COMPAT_LIST_MAX", default=1000),
}

# https://drf-spectacular.readthedocs.io/en/latest/settings.html
SPECTACULAR_SETTINGS = {
    "TITLE": "TMS API",
    "DESCRIPTION": (
        "Distributed task scheduler: register tasks (what to run, on which runner, when), watch, cancel and "
        "retry their executions.\n\n"
        "Authenticate with `Authorization: Token <key>` or, the same key, `Authorization: Bearer <key>` "
        "(`manage.py tms_create_user <name>` prints a key). "
        "You see and change only your own tasks and executions; another user's ids answer 404. Every error "
        "has one shape: `{type, detail, errors?}`. `POST /tasks`, `GET /tasks` and `GET /tasks/{id}` keep the "
        "original service's API."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # No validator badge: Swagger UI would otherwise send the schema to validator.swagger.io.
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v[0-9]+",
    "TAGS": [
        {"name": "tasks", "description": "Tasks: what to run, on which runner, and when."},
        {"name": "executions", "description": "Executions: one run of a task, with its event timeline."},
        {"name": "workers", "description": "Worker processes (staff only)."},
        {"name": "compat", "description": "The original service's API (`/tasks`), kept for its clients."},
    ],
    "ENUM_NAME_OVERRIDES": {
        "TaskStatusEnum": "tasks_app.models.TaskStatus",
        "ExecutionStatusEnum": "executions.models.ExecutionStatus",
        "WorkerStatusEnum": "executions.models.WorkerStatus",
        "CompatStatusEnum": "tasks_api.compat.CompatStatus.choices",
        "OccurrenceStateEnum": "tasks_api.selectors.OccurrenceState",
        "TaskStateEnum": "tasks_api.states.TaskState",
        "SkipReasonEnum": "executions.models.SkipReason",
        "WorkflowRunStateEnum": "executions.workflow_selectors.RUN_STATE_CHOICES",
        # Two sets of roles: a member may hold any, a service account never admin.
        "TeamRoleEnum": "tasks_app.models.TeamRole",
        "ServiceAccountRoleEnum": "accounts.service_accounts.ROLE_CHOICES",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "tms_core.api.schema.strip_trailing_slashes",
        "tms_core.api.schema.null_as_alternative",
    ],
}

# --- Celery -----------------------------------------------------------------------------------
# https://docs.celeryq.dev/en/stable/userguide/configuration.html
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
TMS_EMBEDDED_BROKER = CELERY_BROKER_URL.startswith("filesystem://")
if TMS_EMBEDDED_BROKER:
    _broker_dir = VAR_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        # How often an idle consumer looks for new message files (kombu's default is 1 s): also
        # how long a run may wait for a worker to see it, and a stop for a worker to see it.
        "polling_interval": 0.2,
    }
    # kombu's filesystem transport with short drains, so a worker sees a stop at once (issue 34).
    CELERY_BROKER_TRANSPORT = "tms_project.embedded_broker:Transport"
else:
    # Publisher confirms: publish() returns only once the broker has taken the message.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}
# AMQP heartbeats on a worker's consumer connection (Celery's default is 120 s). A worker that stops
# answering (SIGSTOP, a frozen VM, a network partition) loses its connection once RabbitMQ has
# seen no frame in two consecutive checks (one per interval: so at most three intervals after the
# last frame), and the messages it held unacknowledged go back to the queue for another worker.
# With 5 s a paused worker's messages are running elsewhere within ~16 s of the pause (3 x 5 s, plus
# a claim; measured 3 x 4 s = 12.0 s with a 4 s heartbeat in tests/executions/test_paused_worker.py).
# Not much lower: the worker's main process sends them (every 2.5 s here) between its other work.
# The monitor and the web publish over connections without heartbeats, so this costs them nothing.
# RabbitMQ's consumer_timeout (server-wide, 30 min by default) is left as it is: it bounds
# a live worker that never acknowledges, not a paused one, and must stay above the longest run a
# worker handles inline; the per-queue x-consumer-timeout argument needs RabbitMQ 3.12 (this
# server is 3.10), and changing a durable queue's arguments makes its existing declaration fail.
CELERY_BROKER_HEARTBEAT = env.int("TMS_BROKER_HEARTBEAT", default=5)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# A channel error while the worker's consumer starts is retried as a lost connection is (reconnect,
# with failover to the next node of a URL list, and declare again), instead of ending the worker
# with "Unrecoverable error". On a RabbitMQ cluster, the declare of a classic queue whose home
# node is down answers 404 NOT_FOUND ("home node ... of durable queue ... is down") until that node
# is back: every worker exited, and again after each restart (issue 45).
# https://docs.celeryq.dev/en/stable/userguide/configuration.html#broker-channel-error-retry
CELERY_BROKER_CHANNEL_ERROR_RETRY = True
# Celery's consumer with a wait between those restarts (tms_project.celery.TmsConsumer).
CELERY_WORKER_CONSUMER = "tms_project.celery:TmsConsumer"
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# How long a worker waits for the result of a pool process that died before it calls the job lost
# (Celery's default is 10 s). A pool process is killed on purpose when a stopping worker hands its
# run back (executions.heartbeat.worker_hand_back): the worker's stop waited this long for a result
# that cannot come, and a busy worker of the embedded broker outlived its grace by 10 s (issue 34).
# A result a process wrote before it died is in its pipe already; 2 s is ample to read it.
CELERY_WORKER_LOST_WAIT = 2.0
# Messages each pool process may hold beyond the one it runs (with acks_late, unacknowledged). 1 keeps a
# long launch from holding work another process could start; tms_bench's herd measures more.
CELERY_WORKER_PREFETCH_MULTIPLIER = env.int("TMS_WORKER_PREFETCH_MULTIPLIER", default=1)
CELERY_TASK_DEFAULT_DELIVERY_MODE = "persistent"
# Task events (received, started, succeeded) cost the worker's main process a publish each and the
# broker a fan-out: two to three messages more per execution, measured by tms_bench's herd. Off
# unless asked for: Flower turns them on in the workers it watches (its enable_events option,
# default on), so they are sent while someone looks, and TMS_WORKER_TASK_EVENTS=true sends them always.
CELERY_WORKER_SEND_TASK_EVENTS = env.bool("TMS_WORKER_TASK_EVENTS", default=False)
# Logging is Django's LOGGING in every process (tms_project/celery.py connects setup_logging).
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_SEND_SENT_EVENT = False
CELERY_TIMEZONE = "UTC"
# django-celery-beat's DatabaseScheduler without its idle costs: no spin before a due job, one
# change check per loop interval (tms_project/beat.py).
CELERY_BEAT_SCHEDULER = "tms_project.beat:TmsDatabaseScheduler"
# Celery's Django fixup closes every database connection after every task unless this is set
# (a new connection, and a new PostgreSQL backend, per task); reuse it for this many tasks.
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=1000)

#: The RabbitMQ queue type of TMS's queues (docs/deployment.md, "Availability: a RabbitMQ
#: cluster"). ``classic`` (the default): a classic queue with ``x-max-priority: 9``, on the node
#: that declared it; it does not survive that node's loss. ``quorum``: a quorum queue, replicated
#: on the cluster's nodes, which another node leads within a fraction of a second of its leader's
#: loss, its messages kept. A quorum queue of RabbitMQ 3.10 refuses ``x-max-priority`` (406), has no
#: global QoS and no held ETA messages (the monitor then publishes no run before it is due: see
#: executions.monitor). The default stays classic because an existing queue keeps the type it was
#: declared with: RabbitMQ refuses to declare it again as the other type (406 PRECONDITION_FAILED),
#: so a change needs new queue names (TMS_QUEUE, TMS_NOTIFY_QUEUE) or the old queues drained and
#: deleted first (docs/operations.md), and a single node gains nothing from a quorum queue.
TMS_QUEUE_TYPE = env.str("TMS_QUEUE_TYPE", default="classic")
if TMS_QUEUE_TYPE not in ("classic", "quorum"):
    raise ImproperlyConfigured(f"TMS_QUEUE_TYPE must be classic or quorum, not {TMS_QUEUE_TYPE!r}.")
if TMS_QUEUE_TYPE == "quorum" and TMS_EMBEDDED_BROKER:
    raise ImproperlyConfigured(
        "TMS_QUEUE_TYPE=quorum needs RabbitMQ (CELERY_BROKER_URL): the embedded broker has none."
    )


def _queue_arguments() -> dict[str, Any] | None:
    """The arguments every declarer of TMS's queues passes (workers, publishers, the monitor's
    declare, tms_check): RabbitMQ refuses a second declaration with other arguments."""
    if TMS_EMBEDDED_BROKER:
        return None
    if TMS_QUEUE_TYPE == "quorum":
        return {"x-queue-type": "quorum"}
    return {"x-max-priority": 9}


def _durable_queue(name: str) -> Queue:
    """A durable queue on a direct exchange of its name, with :func:`_queue_arguments`: every queue
    written out alike, so every declarer (workers, publishers, tms_check) declares it alike
    (RabbitMQ refuses a second declaration with other arguments)."""
    return Queue(
        name,
        Exchange(name, type="direct", durable=True),
        routing_key=name,
        durable=True,
        queue_arguments=_queue_arguments(),
    )


#: Queue that carries execution work. On a classic queue, priorities 0-9 map to RabbitMQ's
#: x-max-priority; a quorum queue delivers in publish order (the monitor publishes in priority order).
TMS_QUEUE = env.str("TMS_QUEUE", default="tms.executions")
CELERY_TASK_DEFAULT_QUEUE = TMS_QUEUE
#: Queue of the notification dispatcher and senders: a slow webhook never delays execution work.
#: A worker started without -Q consumes both queues. (The same arguments as Celery gives a queue
#: under CELERY_TASK_QUEUE_MAX_PRIORITY.)
TMS_NOTIFY_QUEUE = env.str("TMS_NOTIFY_QUEUE", default="tms.notifications")
CELERY_TASK_QUEUES: tuple[Queue, ...] = (_durable_queue(TMS_QUEUE), _durable_queue(TMS_NOTIFY_QUEUE))
CELERY_TASK_ROUTES = {"tms.notify_*": {"queue": TMS_NOTIFY_QUEUE, "routing_key": TMS_NOTIFY_QUEUE}}
# Celery adds x-max-priority to the queues it declares of its own (none here: every queue is
# above); a quorum queue would refuse it.
CELERY_TASK_QUEUE_MAX_PRIORITY = None if TMS_EMBEDDED_BROKER or TMS_QUEUE_TYPE == "quorum" else 9
# A queue Celery creates of its own (a -Q name not above) gets the same type.
CELERY_TASK_DEFAULT_QUEUE_TYPE = "classic" if TMS_EMBEDDED_BROKER else TMS_QUEUE_TYPE
CELERY_TASK_CREATE_MISSING_QUEUE_TYPE = CELERY_TASK_DEFAULT_QUEUE_TYPE
# Celery's quorum-queue detection (worker_detect_quorum_queues, on by default) turns global QoS
# off on a worker consuming a quorum queue, so the prefetch stays fixed and an ETA message would
# be held against none: TMS sends none to a quorum queue (executions.messages.eta_of).
CELERY_TASK_DEFAULT_PRIORITY = 5

# --- TMS --------------------------------------------------------------------------------------
# Read through tms_core.conf.tms_settings; see that module for what each knob does. Each TmsSettings
# field NAME is read from the environment variable TMS_NAME, with the field's type and default
# (docs/configuration.md); these few are read above, or read in a way of their own.
TMS = tms_from_environment(
    env,
    DATABASE_POOLER=DATABASE_POOLER,
    LISTEN_DATABASE_URL=LISTEN_DATABASE_URL,
    QUEUE_TYPE=TMS_QUEUE_TYPE,
    # Comma-separated Fernet keys, newest first (tasks_app/secrets.py). local.py derives a
    # development key when unset; production.py refuses to start without them.
    SECRET_KEYS=tuple(key.strip() for key in env.list("TMS_SECRET_KEYS", default=[]) if key.strip()),
)

TMS_RUNNERS: dict[str, dict[str, Any]] = {
    "noop": {"BACKEND": "runners.noop.NoopRunner"},
    "sleep": {"BACKEND": "runners.noop.SleepRunner"},
    "approval": {"BACKEND": "runners.approval.ApprovalRunner"},
    "wait_event": {"BACKEND": "runners.wait_event.WaitEventRunner"},
    "http": {
        "BACKEND": "runners.http.HttpRunner",
        "OPTIONS": {"allowed_networks": env.list("TMS_HTTP_ALLOWED_NETWORKS", default=[])},
    },
    "subprocess": {
        "BACKEND": "runners.subprocess.SubprocessRunner",
        "OPTIONS": {
            "allowed_executables": env.list("TMS_SUBPROCESS_ALLOWED_EXECUTABLES", default=[]),
            "allow_artifacts": env.bool("TMS_SUBPROCESS_ALLOW_ARTIFACTS", default=False),
            "work_dir": env.str("TMS_SUBPROCESS_WORK_DIR", default=str(VAR_DIR / "runs")),
            "inline_wait_seconds": env.float("TMS_SUBPROCESS_INLINE_WAIT", default=1.0),
            # Runs reach no network but their own loopback unless these open it (runners/sandbox.py).
            "egress": {
                "internet": env.bool("TMS_SUBPROCESS_EGRESS_INTERNET", default=False),
                "allow": env.list("TMS_SUBPROCESS_EGRESS_ALLOW", default=[]),
            },
        },
    },
    "kubernetes": {
        "BACKEND": "runners.kubernetes.KubernetesRunner",
        "OPTIONS": {
            "kubeconfig": env.str("TMS_K8S_KUBECONFIG", default=None),
            "context": env.str("TMS_K8S_CONTEXT", default=None),
            "namespace": env.str("TMS_K8S_NAMESPACE", default="default"),
            "allowed_namespaces": env.list("TMS_K8S_ALLOWED_NAMESPACES", default=[]),
            "host": env.str("TMS_K8S_HOST", default=None),
        },
    },
    "lambda": {
        "BACKEND": "runners.aws_lambda.LambdaRunner",
        "OPTIONS": {
            "region_name": env.str("TMS_LAMBDA_REGION", default=None),
            "endpoint_url": env.str("TMS_LAMBDA_ENDPOINT_URL", default=None),
            "account_id": env.str("TMS_LAMBDA_ACCOUNT_ID", default=None),
            # Nothing by default: an operator lists the functions (ARN patterns, or bare name
            # patterns of TMS_LAMBDA_ACCOUNT_ID in TMS_LAMBDA_REGION) tasks may invoke.
            "allowed_functions": env.list("TMS_LAMBDA_ALLOWED_FUNCTIONS", default=[]),
        },
    },
    "function": {
        "BACKEND": "runners.function.AsyncHttpFunctionRunner",
        "OPTIONS": {"allowed_urls": env.list("TMS_FUNCTION_ALLOWED_URLS", default=[])},
    },
    "email": {
        "BACKEND": "runners.email.EmailRunner",
        "OPTIONS": {
            "default_from": env.str("TMS_EMAIL_FROM", default=None),
            "allowed_senders": env.list("TMS_EMAIL_ALLOWED_SENDERS", default=[]),
            # Nobody by default: an operator lists addresses, @domain or @*.domain entries (or *).
            "allowed_recipients": env.list("TMS_EMAIL_ALLOWED_RECIPIENTS", default=[]),
            "max_per_minute": env.int("TMS_EMAIL_MAX_PER_MINUTE", default=10),
        },
        "MIN_INTERVAL": env.float("TMS_EMAIL_MIN_INTERVAL", default=300.0),
    },
}
# Outgoing e-mail for the email runner: https://docs.djangoproject.com/en/5.2/topics/email/
EMAIL_BACKEND = env.str("DJANGO_EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env.str("DJANGO_EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("DJANGO_EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("DJANGO_EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("DJANGO_EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("DJANGO_EMAIL_USE_TLS", default=False)
EMAIL_TIMEOUT = env.int("DJANGO_EMAIL_TIMEOUT", default=30)

if TMS_EMBEDDED_BROKER or TMS_EMBEDDED_DATABASE:
    for _folder in (VAR_DIR, *(VAR_DIR / "broker" / name for name in ("queue", "processed", "control"))):
        _folder.mkdir(parents=True, exist_ok=True)

# --- Artifacts (uploaded binaries for the subprocess runner) ---------------------------------
# https://docs.djangoproject.com/en/5.2/ref/settings/#storages ; S3 through django-storages:
# https://django-storages.readthedocs.io/en/latest/backends/amazon-S3.html
STORAGES = {
    "default": (
        {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {"bucket_name": env.str("TMS_ARTIFACT_S3_BUCKET")}}
        if env.str("TMS_ARTIFACT_S3_BUCKET", default="")
        else {"BACKEND": "django.core.files.storage.FileSystemStorage"}
    ),
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    # Pruned executions, as gzipped JSON Lines (executions.retention): S3 when a bucket is set.
    "tms_archive": (
        {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {"bucket_name": env.str("TMS_ARCHIVE_S3_BUCKET"), "location": "tms-archive"},
        }
        if env.str("TMS_ARCHIVE_S3_BUCKET", default="")
        else {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": env.str("TMS_ARCHIVE_DIR", default=str(VAR_DIR / "archive"))},
        }
    ),
}
TMS_ARTIFACT_MAX_BYTES = env.int("TMS_ARTIFACT_MAX_BYTES", default=100 * 1024 * 1024)
TMS_ARTIFACT_CACHE_DIR = env.str("TMS_ARTIFACT_CACHE_DIR", default=str(VAR_DIR / "artifact-cache"))
# Largest request body (JSON, or a form without its files: uploads are bounded by
# TMS_ARTIFACT_MAX_BYTES) a view reads; larger ones answer 413 (400 outside the API).
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("TMS_MAX_REQUEST_BYTES", default=2 * 1024 * 1024)
#: Callback reports accepted per client address (jobs report from wherever they run, unauthenticated
#: but for their token): "<n>/<second|minute|hour|day>".
TMS_CALLBACK_THROTTLE = env.str("TMS_CALLBACK_THROTTLE", default="600/minute")
#: Requests to trigger URLs (/hooks/v1/<id>) accepted per client address, before their
#: signature is checked: "<n>/<second|minute|hour|day>".
TMS_HOOK_THROTTLE = env.str("TMS_HOOK_THROTTLE", default="600/minute")
# Where outside systems reach this platform (trigger, upload and callback URLs; tms_core/public_url.py).
# Unset: the address each request reached, and http://127.0.0.1:8000 where there is no request
# (a worker's callback URLs). `make run` sets it from its PORT.
TMS_PUBLIC_URL = env.str("TMS_PUBLIC_URL", default="").rstrip("/")

# --- Operations (ops app) ---------------------------------------------------------------------
#: Seconds a client is told to wait (Retry-After) when a dependency outage answers 503.
TMS_RETRY_AFTER = env.int("TMS_RETRY_AFTER", default=5)
#: tms_check fails the monitor when a SCHEDULED execution is overdue by more than this (seconds).
TMS_CHECK_MONITOR_LAG = env.float("TMS_CHECK_MONITOR_LAG", default=60.0)
# --- Back office (the operator pages at /) ----------------------------------------------------
# Session login for the pages; the API keeps its token (and session) authentication.
LOGIN_URL = "backoffice:login"
LOGIN_REDIRECT_URL = "backoffice:dashboard"
LOGOUT_REDIRECT_URL = "backoffice:login"
#: Where operators reach Flower (linked from the pages, and each execution to its Celery task).
TMS_FLOWER_URL = env.str("TMS_FLOWER_URL", default="http://127.0.0.1:5555").rstrip("/")
#: The trace viewer's page of a trace, ``{trace_id}`` standing for its id (32 hex digits): each
#: execution's page links its trace (tms_core/tracing.py). E.g. Jaeger
#: ``http://127.0.0.1:16686/trace/{trace_id}``; empty: no link.
TMS_TRACE_URL = env.str("TMS_TRACE_URL", default="")
#: Seconds between the dashboard's live refreshes (0: no refresh).
TMS_DASHBOARD_REFRESH = env.float("TMS_DASHBOARD_REFRESH", default=5.0)

# --- Single sign-on (OpenID Connect, mozilla-django-oidc) ---------------------------------------
# Off unless TMS_OIDC_CLIENT_ID is set. docs/sso.md has a worked example; tms_project/oidc_config.py
# checks the values (an unknown role or a malformed pair in TMS_OIDC_GROUPS stops start-up). Sets TMS_OIDC (read by
# accounts.oidc) and mozilla-django-oidc's OIDC_* settings.
# https://mozilla-django-oidc.readthedocs.io/en/stable/settings.html
try:
    globals().update(
        build_oidc_settings(
            client_id=env.str("TMS_OIDC_CLIENT_ID", default=""),
            client_secret=env.str("TMS_OIDC_CLIENT_SECRET", default=""),
            issuer=env.str("TMS_OIDC_ISSUER", default=""),
            # Explicit endpoints win over the discovered ones (all four, without TMS_OIDC_ISSUER).
            endpoints={
                "OIDC_OP_AUTHORIZATION_ENDPOINT": env.str("TMS_OIDC_AUTHORIZATION_ENDPOINT", default=""),
                "OIDC_OP_TOKEN_ENDPOINT": env.str("TMS_OIDC_TOKEN_ENDPOINT", default=""),
                "OIDC_OP_USER_ENDPOINT": env.str("TMS_OIDC_USERINFO_ENDPOINT", default=""),
                "OIDC_OP_JWKS_ENDPOINT": env.str("TMS_OIDC_JWKS_ENDPOINT", default=""),
            },
            end_session_endpoint=env.str("TMS_OIDC_END_SESSION_ENDPOINT", default=""),
            provider_name=env.str("TMS_OIDC_PROVIDER_NAME", default=""),
            scopes=env.str("TMS_OIDC_SCOPES", default="openid email profile"),
            username_claim=env.str("TMS_OIDC_USERNAME_CLAIM", default="preferred_username"),
            groups_claim=env.str("TMS_OIDC_GROUPS_CLAIM", default="groups"),
            # "group=role,group=role": TMS_OIDC_GROUPS=tms-admins=superuser,ops=team:ops:operator
            # (read by oidc_config.parse_groups: a malformed pair is a clear error, not a ValueError).
            groups=env.str("TMS_OIDC_GROUPS", default=""),
            renew_seconds=env.int("TMS_OIDC_RENEW_SECONDS", default=900),
            local_login=env.bool("TMS_OIDC_LOCAL_LOGIN", default=True),
            sign_algo=env.str("TMS_OIDC_SIGN_ALGO", default="RS256"),
            use_pkce=env.bool("TMS_OIDC_USE_PKCE", default=True),
            timeout=env.float("TMS_OIDC_TIMEOUT", default=10.0),
            verify_ssl=env.bool("TMS_OIDC_VERIFY_SSL", default=True),
        )
    )
except OidcConfigError as exc:
    raise ImproperlyConfigured(str(exc)) from None
