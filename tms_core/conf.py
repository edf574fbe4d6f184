"""Typed access to the ``TMS`` settings dict, with defaults."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    import environ

#: Bounds of the retention settings (a task's ``keep_last`` and ``keep_for`` and their defaults).
MAX_KEEP_LAST = 1_000_000
MIN_KEEP_FOR = 3600.0
MAX_KEEP_FOR = 3650 * 86400.0


@dataclass(frozen=True)
class TmsSettings:
    #: ``transaction`` when the database connections go through PgBouncer in transaction pooling
    #: mode (the settings then turn server-side cursors off and demand LISTEN_DATABASE_URL).
    DATABASE_POOLER: str = "none"
    #: A URL of the database on PostgreSQL itself, for the monitor's LISTEN connection (a session,
    #: which a transaction-pooling pooler cannot give); empty: the default database's settings.
    LISTEN_DATABASE_URL: str = ""
    #: Seconds ahead for which recurring tasks are turned into executions.
    MATERIALISE_HORIZON: float = 300.0
    #: Seconds between beat-run materialiser passes.
    MATERIALISE_INTERVAL: float = 5.0
    #: Tasks locked per materialiser transaction.
    MATERIALISE_BATCH: int = 2000
    #: Threads (each with its own connection) that drain a backlog of due tasks in one pass.
    MATERIALISE_THREADS: int = 2
    #: Executions published per monitor transaction.
    MONITOR_BATCH: int = 500
    #: Most runs the monitor puts in one message when a pass takes many at once (a herd): one
    #: message, one acknowledgement and one task call for several runs (a pass is split into at
    #: least MONITOR_MIN_PENDING messages, so every pool process gets work). 1: a message per run.
    DISPATCH_BATCH: int = 16
    #: Longest the monitor sleeps when it knows of no due work and hears no NOTIFY.
    MONITOR_MAX_SLEEP: float = 1.0
    #: A PENDING execution unclaimed for this many seconds is published again.
    PENDING_REPUBLISH_AFTER: float = 120.0
    #: Fair share (docs/when-a-run-may-start.md): the monitor keeps about this many seconds of
    #: work published and not yet started (PENDING), at the rate workers start runs, and picks what
    #: to publish next by weighted round-robin between owners. 0: publish everything due at once,
    #: in due order (no fair share: a later owner's run queues behind a herd in the broker).
    MONITOR_QUEUE_SECONDS: float = 0.5
    #: The fewest runs kept published (PENDING) while more are due, whatever the measured rate:
    #: at least the workers' prefetch (pool processes of all workers), so none idles at the start.
    MONITOR_MIN_PENDING: int = 8
    #: Seconds between top-ups while the monitor holds due runs back (the queue is full enough).
    MONITOR_TOPUP_INTERVAL: float = 0.1
    #: Seconds ahead of its due time that a run may be taken and published, with its due time as
    #: the message's ETA: a worker holds it until then and claims it on time, instead of the
    #: monitor's pass and the broker's delivery both coming after the due time (issue 33). 0: at
    #: the due time, never before.
    MONITOR_LOOKAHEAD: float = 0.1
    #: RabbitMQ queue type of TMS's queues, classic or quorum (TMS_QUEUE_TYPE, read by the settings
    #: that declare the queues). With quorum, no message carries an ETA: a worker consuming a
    #: quorum queue has no global QoS to hold one with, so the lookahead is off (0) whatever
    #: MONITOR_LOOKAHEAD says, and a run is published at its due time, never before.
    QUEUE_TYPE: str = "classic"
    #: Runs taken ahead whose due times lie within this many seconds of each other share one
    #: message, whose ETA is the latest of them: the earlier ones start up to that much late,
    #: and a steady stream of runs is claimed, started and ended a few at a time instead of one
    #: message, claim and commit each (at 1,000 runs/s one run per message took 1 ms of worker
    #: CPU each, more than the two cores had). 0: only runs due at one instant share a message.
    DISPATCH_WINDOW: float = 0.005
    #: A team's weight in the fair share when its TeamQuota sets none.
    FAIR_WEIGHT: int = 1
    #: Seconds between worker heartbeats, and between the lease extensions that the process
    #: working on an execution makes (a keeper thread: see executions.worker_services).
    HEARTBEAT_INTERVAL: float = 5.0
    #: A worker silent for this long is dead; its leases expire after the same time.
    WORKER_TIMEOUT: float = 30.0
    #: Lease losses (dead workers) tolerated while an attempt has no external run yet; past it
    #: the attempt fails (and is retried per the task's policy), so a crash loop ends.
    MAX_HANDBACKS: int = 3
    #: On SIGTERM a worker stops taking messages and lets its runs go on for this many seconds;
    #: then it stops the pool processes still running one and hands their leases back at once,
    #: so another worker resumes them (executions.heartbeat.worker_hand_back).
    SHUTDOWN_GRACE: float = 5.0
    #: Bound on the stored output and error text of an execution.
    OUTPUT_MAX_CHARS: int = 16384
    #: Default task timeout in seconds.
    DEFAULT_TIMEOUT: float = 1200.0
    #: Default of a task's misfire_grace (seconds): a fire time later than this is a misfire.
    MISFIRE_GRACE: float = 60.0
    #: Default of a task's catch_up_limit: the most missed fire times run_all runs.
    CATCH_UP_LIMIT: int = 100
    #: Most executions one "materialise up to" request (POST /tasks/<id>/materialise) may create.
    MATERIALISE_MAX: int = 1000
    #: Furthest ahead, in seconds, a "materialise up to" request may reach.
    MATERIALISE_MAX_AHEAD: float = 7 * 86400.0
    #: Seconds an ``Idempotency-Key`` of a create request is remembered.
    IDEMPOTENCY_KEY_TTL: float = 86400.0
    #: Seconds the per-minute rollup of finished runs (the dashboard's charts) is kept.
    ROLLUP_RETENTION: float = 7 * 86400.0
    #: Seconds the per-task hourly rollup ("tasks failing most") is kept: one row per task and hour.
    TASK_ROLLUP_RETENTION: float = 2 * 86400.0
    #: Retention default of a task's ``keep_last``: the most finished runs of a task kept.
    RETENTION_KEEP_LAST: int = 1000
    #: Retention default of a task's ``keep_for``, in seconds: finished runs older than this go.
    RETENTION_KEEP_FOR: float = 30 * 86400.0
    #: Executions pruned (archived, then deleted) per transaction.
    RETENTION_BATCH: int = 1000
    #: Seconds between beat's pruning runs.
    RETENTION_INTERVAL: float = 3600.0
    #: Bearer token ``/metrics`` requires (``Authorization: Bearer <token>``); empty: none.
    METRICS_TOKEN: str = ""
    #: Client networks (CIDR) allowed to read ``/metrics``. Empty: loopback only when no token is
    #: set, any address with the right token when one is.
    METRICS_ALLOWED_NETWORKS: tuple[str, ...] = ()
    #: Most tasks with ``expose_metrics`` that get a per-task series (the label cardinality bound).
    METRICS_MAX_TASKS: int = 100
    #: Proxies (addresses or CIDR networks) in front of the web whose ``X-Forwarded-For`` is
    #: believed, for the client address (:mod:`tms_core.client_address`;
    #: docs/configuration.md#client-addresses). Empty: none, the peer is the client.
    TRUSTED_PROXIES: tuple[str, ...] = ()
    #: Longest life of a callback token, in seconds, before its grace (a shorter task timeout
    #: shortens it); a job that reports for longer renews it with each heartbeat.
    CALLBACK_TOKEN_MAX_AGE: float = 3600.0
    #: Seconds a callback token is still accepted after its life, for a report sent at the end.
    CALLBACK_TOKEN_GRACE: float = 300.0
    #: Life of a personal access token created without an expiry, in seconds (90 days).
    ACCESS_TOKEN_DEFAULT_AGE: float = 90 * 86400.0
    #: Longest life a personal access token may be given, in seconds (a year); 0: no limit, and
    #: tokens that never expire are allowed.
    ACCESS_TOKEN_MAX_AGE: float = 365 * 86400.0
    #: How the subprocess runner isolates a run (runners.sandbox): ``auto`` (``bwrap`` when the
    #: worker is privileged and bubblewrap is installed, else ``user`` when privileged, else
    #: refuse), ``bwrap`` (namespaces + a run user), ``user`` (a run user only) or ``none``
    #: (explicit opt-in: the run shares the worker's user; not a sandbox).
    SUBPROCESS_SANDBOX: str = "auto"
    #: Run users ``<prefix>0 .. <prefix>N-1`` (created by ``manage.py tms_sandbox_setup``); each
    #: concurrent run on a host gets one of its own.
    SUBPROCESS_RUN_USER_PREFIX: str = "tms-run-"
    SUBPROCESS_RUN_USERS: int = 32
    #: Host-wide folder of the run users' claim files (root-only; one per busy run user).
    SUBPROCESS_RUN_USER_LOCKS: str = "/run/tms-run-users"
    #: Seconds a finished run's folder (output, exit record) is kept before it is removed.
    SUBPROCESS_RUN_RETENTION: float = 7 * 86400.0
    #: Seconds a signed upload URL (POST /api/v1/artifacts/uploads) stays valid; an upload not
    #: finished by then is REJECTED and its bytes removed by the periodic cleanup.
    ARTIFACT_UPLOAD_TTL: float = 900.0
    #: Fernet keys (url-safe base64 of 32 bytes) that encrypt the secret values of task configs
    #: at rest: the first encrypts, every one decrypts (rotation: put a new key first, run
    #: ``manage.py tms_rotate_keys``, then drop the old one). Production refuses to start without.
    SECRET_KEYS: tuple[str, ...] = ()
    #: Largest runner config (payloads included) a task may have, in bytes of compact JSON.
    MAX_CONFIG_BYTES: int = 65536
    #: Most fire times one backfill request may create.
    BACKFILL_MAX: int = 500
    #: Default per-team quotas (an operator overrides them per team: tasks_app.models.TeamQuota);
    #: 0 means no limit. Tasks a team may have (not deleted) ...
    QUOTA_MAX_TASKS: int = 1000
    #: ... executions a team's tasks may be given on request (run now, backfill, retry) per rolling hour ...
    QUOTA_EXECUTIONS_PER_HOUR: int = 1000
    #: ... and bytes of uploaded artifacts a team may keep.
    QUOTA_ARTIFACT_BYTES: int = 1024**3

    #: Seconds between beat-run notification dispatches (outbox -> deliveries -> senders).
    NOTIFY_INTERVAL: float = 2.0
    #: Seconds between the periodic notification checks (ran longer than X, dead man's switch).
    NOTIFY_CHECK_INTERVAL: float = 10.0
    #: Seconds a sender holds a delivery; a delivery whose sender died is sent again after it.
    NOTIFY_LEASE: float = 60.0
    #: Seconds one send (HTTP request, SMTP conversation) may take; below NOTIFY_LEASE.
    NOTIFY_TIMEOUT: float = 10.0
    #: Attempts of a delivery before it fails for good (and marks its channel failing).
    NOTIFY_MAX_ATTEMPTS: int = 8
    #: First retry delay of a delivery, doubling per attempt up to NOTIFY_BACKOFF_MAX.
    NOTIFY_BACKOFF: float = 5.0
    NOTIFY_BACKOFF_MAX: float = 3600.0

    @property
    def lookahead(self) -> float:
        """Seconds ahead of its due time the monitor takes and publishes a run (with an ETA):
        MONITOR_LOOKAHEAD on classic queues, 0 on quorum queues (see QUEUE_TYPE)."""
        return 0.0 if self.QUEUE_TYPE == "quorum" else self.MONITOR_LOOKAHEAD

    def __post_init__(self) -> None:
        """Check every value (:class:`ImproperlyConfigured` naming the setting) and make the lists tuples."""
        self._check_deployment()
        self._check_scheduling()
        self._check_metrics_and_retention()
        self._as_tuples()
        self._check_networks()
        self._check_api_limits()
        self._check_notifications()

    def _check_deployment(self) -> None:
        """The database pooler, the subprocess sandbox and the artifact uploads."""
        if self.DATABASE_POOLER not in ("none", "transaction"):
            raise ImproperlyConfigured("TMS_DATABASE_POOLER must be none or transaction (PgBouncer's pool_mode).")
        if self.DATABASE_POOLER == "transaction" and not self.LISTEN_DATABASE_URL:
            raise ImproperlyConfigured("TMS_DATABASE_POOLER=transaction needs TMS_LISTEN_DATABASE_URL.")
        if self.SUBPROCESS_SANDBOX not in ("auto", "bwrap", "user", "none"):
            raise ImproperlyConfigured("TMS_SUBPROCESS_SANDBOX must be one of auto, bwrap, user, none.")
        if not 1 <= self.SUBPROCESS_RUN_USERS <= 1000:
            raise ImproperlyConfigured("TMS_SUBPROCESS_RUN_USERS must be between 1 and 1000.")
        if self.SUBPROCESS_RUN_RETENTION < 60:
            raise ImproperlyConfigured("TMS_SUBPROCESS_RUN_RETENTION must be at least 60 (seconds).")
        if not 60 <= self.ARTIFACT_UPLOAD_TTL <= 86400:
            raise ImproperlyConfigured("TMS_ARTIFACT_UPLOAD_TTL must be between 60 and 86400 (seconds).")

    def _check_scheduling(self) -> None:
        """The monitor's dispatch, the fair share, the materialiser and the misfire defaults."""
        if not 0 <= self.MONITOR_QUEUE_SECONDS <= 60:
            raise ImproperlyConfigured("TMS_MONITOR_QUEUE_SECONDS must be between 0 (off) and 60.")
        if not 1 <= self.DISPATCH_BATCH <= 500:
            raise ImproperlyConfigured("TMS_DISPATCH_BATCH must be between 1 (a message per run) and 500.")
        if not 1 <= self.MONITOR_MIN_PENDING <= 100_000:
            raise ImproperlyConfigured("TMS_MONITOR_MIN_PENDING must be between 1 and 100000.")
        if not 0.01 <= self.MONITOR_TOPUP_INTERVAL <= 5:
            raise ImproperlyConfigured("TMS_MONITOR_TOPUP_INTERVAL must be between 0.01 and 5 (seconds).")
        if not 0 <= self.MONITOR_LOOKAHEAD <= 1:
            raise ImproperlyConfigured("TMS_MONITOR_LOOKAHEAD must be between 0 (off) and 1 (seconds).")
        if self.QUEUE_TYPE not in ("classic", "quorum"):
            raise ImproperlyConfigured("TMS_QUEUE_TYPE must be classic or quorum.")
        if not 0 <= self.DISPATCH_WINDOW <= 0.1:
            raise ImproperlyConfigured("TMS_DISPATCH_WINDOW must be between 0 (off) and 0.1 (seconds).")
        if not 1 <= self.FAIR_WEIGHT <= 1000:
            raise ImproperlyConfigured("TMS_FAIR_WEIGHT must be between 1 and 1000.")
        if self.MATERIALISE_THREADS < 1:
            raise ImproperlyConfigured("TMS_MATERIALISE_THREADS must be at least 1.")
        # The bounds of the task fields these are defaults for (tasks_app.models).
        if self.MISFIRE_GRACE < 1:
            raise ImproperlyConfigured("TMS_MISFIRE_GRACE must be at least 1 (second).")
        if not 1 <= self.CATCH_UP_LIMIT <= 1000:
            raise ImproperlyConfigured("TMS_CATCH_UP_LIMIT must be between 1 and 1000.")

    def _check_metrics_and_retention(self) -> None:
        """The per-task metrics bound and the retention defaults."""
        if not 0 <= self.METRICS_MAX_TASKS <= 10000:
            raise ImproperlyConfigured("TMS_METRICS_MAX_TASKS must be between 0 and 10000.")
        if not 1 <= self.RETENTION_KEEP_LAST <= MAX_KEEP_LAST:
            raise ImproperlyConfigured(f"TMS_RETENTION_KEEP_LAST must be between 1 and {MAX_KEEP_LAST}.")
        if not MIN_KEEP_FOR <= self.RETENTION_KEEP_FOR <= MAX_KEEP_FOR:
            raise ImproperlyConfigured(
                f"TMS_RETENTION_KEEP_FOR must be between {MIN_KEEP_FOR:g} and {MAX_KEEP_FOR:g} (seconds)."
            )
        if not 1 <= self.RETENTION_BATCH <= 10000:
            raise ImproperlyConfigured("TMS_RETENTION_BATCH must be between 1 and 10000.")
        if self.RETENTION_INTERVAL < 60:
            raise ImproperlyConfigured("TMS_RETENTION_INTERVAL must be at least 60 (seconds).")

    def _as_tuples(self) -> None:
        """Store the list settings (given as lists in settings.TMS) as tuples, as their types say."""
        object.__setattr__(self, "METRICS_ALLOWED_NETWORKS", tuple(self.METRICS_ALLOWED_NETWORKS))
        object.__setattr__(self, "SECRET_KEYS", tuple(self.SECRET_KEYS))
        object.__setattr__(self, "TRUSTED_PROXIES", tuple(self.TRUSTED_PROXIES))

    def _check_networks(self) -> None:
        """Check that each trusted proxy and each network allowed to read /metrics parses."""
        for network in self.TRUSTED_PROXIES:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as exc:
                raise ImproperlyConfigured(
                    f"TMS_TRUSTED_PROXIES: {network!r} is not an address or a network ({exc})."
                ) from exc
        for network in self.METRICS_ALLOWED_NETWORKS:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as exc:
                raise ImproperlyConfigured(
                    f"TMS_METRICS_ALLOWED_NETWORKS: {network!r} is not a network ({exc})."
                ) from exc

    def _check_api_limits(self) -> None:
        """The callback and access tokens' lives, the config size, backfills and the quotas."""
        if not 60 <= self.CALLBACK_TOKEN_MAX_AGE <= 86400:
            raise ImproperlyConfigured("TMS_CALLBACK_TOKEN_MAX_AGE must be between 60 and 86400 (seconds).")
        if self.ACCESS_TOKEN_MAX_AGE < 0 or self.ACCESS_TOKEN_DEFAULT_AGE < 60:
            raise ImproperlyConfigured(
                "TMS_ACCESS_TOKEN_DEFAULT_AGE must be at least 60 (seconds) and TMS_ACCESS_TOKEN_MAX_AGE at least 0."
            )
        if self.ACCESS_TOKEN_MAX_AGE and self.ACCESS_TOKEN_DEFAULT_AGE > self.ACCESS_TOKEN_MAX_AGE:
            raise ImproperlyConfigured("TMS_ACCESS_TOKEN_DEFAULT_AGE must not exceed TMS_ACCESS_TOKEN_MAX_AGE.")
        if not 1024 <= self.MAX_CONFIG_BYTES <= 16 * 1024 * 1024:
            raise ImproperlyConfigured("TMS_MAX_CONFIG_BYTES must be between 1024 and 16777216.")
        if not 1 <= self.BACKFILL_MAX <= 100000:
            raise ImproperlyConfigured("TMS_BACKFILL_MAX must be between 1 and 100000.")
        for name in ("QUOTA_MAX_TASKS", "QUOTA_EXECUTIONS_PER_HOUR", "QUOTA_ARTIFACT_BYTES"):
            if getattr(self, name) < 0:
                raise ImproperlyConfigured(f"TMS_{name} must be 0 (no limit) or positive.")
        if not 0 <= self.CALLBACK_TOKEN_GRACE <= 3600:
            raise ImproperlyConfigured("TMS_CALLBACK_TOKEN_GRACE must be between 0 and 3600 (seconds).")

    def _check_notifications(self) -> None:
        """The notification sender's timeout, lease, attempts and intervals."""
        if not 0 < self.NOTIFY_TIMEOUT < self.NOTIFY_LEASE:
            # A send outliving its lease could be sent again by another sender while still going.
            raise ImproperlyConfigured("TMS_NOTIFY_TIMEOUT must be above 0 and below TMS_NOTIFY_LEASE.")
        if self.NOTIFY_MAX_ATTEMPTS < 1 or self.NOTIFY_INTERVAL <= 0 or self.NOTIFY_CHECK_INTERVAL <= 0:
            raise ImproperlyConfigured("TMS_NOTIFY_MAX_ATTEMPTS, _INTERVAL and _CHECK_INTERVAL must be positive.")


#: django-environ's reader of each field type (a tuple is a comma-separated list).
_READERS = {"int": "int", "float": "float", "str": "str", "tuple[str, ...]": "list"}


def tms_from_environment(env: environ.Env, **given: Any) -> dict[str, Any]:
    """The ``TMS`` settings dict, for the settings modules: each :class:`TmsSettings` field
    ``NAME`` read from the environment variable ``TMS_NAME``, with the field's type and default,
    so that a default is written once, here. ``given`` holds the fields the settings read
    themselves (needed earlier, or read in a way of their own)."""
    values = dict(given)
    for field in fields(TmsSettings):
        if field.name in values:
            continue
        read = getattr(env, _READERS[str(field.type)])
        if isinstance(field.default, tuple):
            values[field.name] = tuple(read(f"TMS_{field.name}", default=list(field.default)))
        else:
            values[field.name] = read(f"TMS_{field.name}", default=field.default)
    return values


#: The last ``settings.TMS`` read and what it gave: building and checking a TmsSettings costs
#: about 0.3 ms, and the hot paths ask for it several times per task or run (four times per task
#: of a bulk create). Settings are replaced, never changed in place (``override_settings`` and
#: pytest-django's ``settings`` assign a new dict), so the dict's identity says when to build again.
_last: tuple[object, TmsSettings] | None = None


def tms_settings() -> TmsSettings:
    """The ``TMS`` settings, typed and checked (:class:`ImproperlyConfigured` if invalid)."""
    global _last
    configured = getattr(settings, "TMS", {})
    last = _last
    if last is not None and last[0] is configured:
        return last[1]
    known = {f.name for f in fields(TmsSettings)}
    unknown = set(configured) - known
    if unknown:
        raise ImproperlyConfigured(f"Unknown TMS settings: {', '.join(sorted(unknown))}")
    built = TmsSettings(**configured)
    _last = (configured, built)
    return built
