"""Dependency checks shared by ``/readyz`` and ``manage.py tms_check``.

Each check returns a :class:`CheckResult` and never raises: a dependency that is down is a
result (``ok=False`` with the reason), not an error. ``/readyz`` runs the cheap ones a load
balancer needs (:data:`READINESS`); ``tms_check`` runs them all (:data:`OPERATOR`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from kombu import Connection

from tms_core.queue_type import queue_type_mismatch

#: Seconds the broker check waits for a TCP connection and the AMQP handshake.
BROKER_TIMEOUT = 3.0


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str = ""


def check_database(alias: str = "default") -> CheckResult:
    """The database answers a query."""
    conn = connections[alias]
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        # A broken connection would fail every later check (and request): start afresh next time.
        conn.close_if_unusable_or_obsolete()
        return CheckResult("database", False, f"unreachable: {_first_line(exc)}")
    return CheckResult("database", True, f"{conn.vendor} {conn.settings_dict.get('NAME')}")


def check_broker(timeout: float = BROKER_TIMEOUT) -> CheckResult:
    """The broker accepts a connection (one attempt, no retries)."""
    try:
        with _broker_connection(timeout) as conn:
            conn.ensure_connection(max_retries=0)
    except Exception as exc:  # noqa: BLE001 - every transport raises its own errors; all mean "down"
        return CheckResult("broker", False, f"unreachable: {_first_line(exc)}")
    return CheckResult("broker", True, _safe_broker_url())


_migrations_applied: set[str] = set()


def check_migrations(alias: str = "default") -> CheckResult:
    """Every migration is applied. Cached once true: new migrations only come with new code."""
    if alias in _migrations_applied:
        return CheckResult("migrations", True, "all applied")
    try:
        loader = MigrationExecutor(connections[alias]).loader
    except DatabaseError as exc:
        connections[alias].close_if_unusable_or_obsolete()
        return CheckResult("migrations", False, f"cannot read: {_first_line(exc)}")
    # Every node of the graph, not a plan to the leaves: a plan skips a hole below an applied leaf
    # (a migration recorded out of order, or its record deleted), which is still not applied.
    missing = sorted(key for key in loader.graph.nodes if key not in loader.applied_migrations)
    if missing:
        names = ", ".join(f"{app}.{name}" for app, name in missing[:5])
        more = ", ..." if len(missing) > 5 else ""
        return CheckResult("migrations", False, f"{len(missing)} not applied ({names}{more})")
    _migrations_applied.add(alias)
    return CheckResult("migrations", True, "all applied")


def check_queue(timeout: float = BROKER_TIMEOUT) -> CheckResult:
    """The execution queues exist with the arguments the app declares (TMS_QUEUE_TYPE: a classic
    queue with ``x-max-priority``, or a quorum queue).

    A queue declared with other arguments makes every worker's declare fail, so this declares
    each existing queue again with the app's arguments: RabbitMQ answers PRECONDITION_FAILED
    when they differ, and does nothing when they match. A missing queue is reported, not created.
    """
    if getattr(settings, "TMS_EMBEDDED_BROKER", False):
        return CheckResult("queue", True, "embedded broker: no queue arguments")
    found = []
    try:
        with _broker_connection(timeout) as conn:
            conn.ensure_connection(max_retries=0)
            for queue in settings.CELERY_TASK_QUEUES:
                # The stubs' StdChannel lacks queue_declare, which every transport's channel has (and
                # kombu's Queue.queue_declare is typed to return str), hence the two ignores below.
                channel = conn.channel()
                try:
                    _, messages, consumers = channel.queue_declare(queue=queue.name, passive=True)  # type: ignore[attr-defined]
                except Exception as exc:  # noqa: BLE001 - amqp's NotFound closes the channel
                    return CheckResult(
                        "queue", False, f"{queue.name}: not declared; no worker has started ({_first_line(exc)})"
                    )
                channel = conn.channel()
                try:
                    channel.queue_declare(  # type: ignore[attr-defined]
                        queue=queue.name, durable=queue.durable, auto_delete=False, arguments=queue.queue_arguments
                    )
                except Exception as exc:  # noqa: BLE001 - PRECONDITION_FAILED closes the channel
                    detail = f"{queue.name}: arguments differ from {queue.queue_arguments}: {_first_line(exc)}"
                    mismatch = queue_type_mismatch(exc, settings.TMS_QUEUE_TYPE)
                    if mismatch is not None:
                        detail += f". {mismatch}"  # names the setting and the way to migrate
                    return CheckResult("queue", False, detail)
                found.append(f"{queue.name} {queue.queue_arguments or {}}, {messages} ready, {consumers} consumers")
    except Exception as exc:  # noqa: BLE001 - any transport error means the broker is down
        return CheckResult("queue", False, f"broker unreachable: {_first_line(exc)}")
    return CheckResult("queue", True, "; ".join(found))


def check_runners() -> CheckResult:
    """Every runner alias in ``TMS_RUNNERS`` loads with its options."""
    from runners.registry import all_runners

    all_runners.cache_clear()
    try:
        aliases = sorted(all_runners())
    except ImproperlyConfigured as exc:
        return CheckResult("runners", False, str(exc))
    except Exception as exc:  # noqa: BLE001 - a backend's own constructor may raise anything
        return CheckResult("runners", False, f"{type(exc).__name__}: {_first_line(exc)}")
    return CheckResult("runners", True, f"{len(aliases)} loaded: {', '.join(aliases)}")


def check_beat_schedule() -> CheckResult:
    """The system jobs beat runs are registered in django_celery_beat and enabled."""
    from django_celery_beat.models import PeriodicTask

    from executions.periodic import periodic_jobs

    try:
        expected = periodic_jobs()
        rows = {row.name: row for row in PeriodicTask.objects.filter(name__in=expected)}
    except DatabaseError as exc:
        return CheckResult("beat schedule", False, f"cannot read: {_first_line(exc)}")
    missing = sorted(set(expected) - set(rows))
    if missing:
        return CheckResult("beat schedule", False, f"not registered (run migrate): {', '.join(missing)}")
    disabled = sorted(name for name, row in rows.items() if not row.enabled)
    if disabled:
        return CheckResult("beat schedule", False, f"disabled in the admin: {', '.join(disabled)}")
    runs = [row.last_run_at for row in rows.values() if row.last_run_at]
    last = f"last sent {max(runs):%Y-%m-%d %H:%M:%S} UTC" if runs else "not sent yet"
    return CheckResult("beat schedule", True, f"{len(rows)} jobs registered and enabled, {last}")


def check_monitor(*, lag: float | None = None) -> CheckResult:
    """A monitor is connected, and no execution waits past its due time for one.

    A running monitor holds a connection that ``LISTEN``s for new work for its whole life
    (:class:`executions.notify.DueListener`), so PostgreSQL's ``pg_stat_activity`` shows it (to
    the same database user or a superuser). And a working monitor leaves no SCHEDULED execution
    due more than ``lag`` seconds ago (``TMS_CHECK_MONITOR_LAG``, default 60).
    """
    from executions.models import Execution, ExecutionStatus
    from executions.notify import CHANNEL

    lag = lag if lag is not None else float(settings.TMS_CHECK_MONITOR_LAG)
    conn = connections["default"]
    try:
        late = Execution.objects.filter(
            status=ExecutionStatus.SCHEDULED, due_at__lt=timezone.now() - timedelta(seconds=lag)
        ).count()
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
                [f"LISTEN {CHANNEL}"],
            )
            (listeners,) = cursor.fetchone()
    except DatabaseError as exc:
        return CheckResult("monitor", False, f"cannot read: {_first_line(exc)}")
    problems = []
    if listeners == 0:
        problems.append("no monitor connected (no LISTEN session in pg_stat_activity)")
    if late:
        problems.append(f"{late} executions overdue by more than {lag:.0f}s")
    if problems:
        return CheckResult("monitor", False, "; ".join(problems))
    return CheckResult("monitor", True, f"{listeners} connected, no execution overdue by more than {lag:.0f}s")


def check_workers() -> CheckResult:
    """At least one worker heartbeated within ``TMS_WORKER_TIMEOUT``."""
    from executions.models import Worker, WorkerStatus
    from tms_core.conf import tms_settings

    timeout = tms_settings().WORKER_TIMEOUT
    cutoff = timezone.now() - timedelta(seconds=timeout)
    try:
        rows = list(Worker.objects.filter(status=WorkerStatus.ALIVE).values_list("id", "last_heartbeat"))
    except DatabaseError as exc:
        return CheckResult("workers", False, f"cannot read: {_first_line(exc)}")
    alive = sorted(worker_id for worker_id, beat in rows if beat >= cutoff)
    silent = len(rows) - len(alive)
    note = f"; {silent} silent for over {timeout:.0f}s" if silent else ""
    if not alive:
        return CheckResult("workers", False, f"none alive (no heartbeat within {timeout:.0f}s){note}")
    shown = ", ".join(alive[:5]) + (", ..." if len(alive) > 5 else "")
    return CheckResult("workers", True, f"{len(alive)} alive ({shown}){note}")


#: Checks that read the database (skipped once it is found unreachable).
NEEDS_DATABASE = frozenset({check_migrations, check_beat_schedule, check_monitor, check_workers})
#: What ``/readyz`` checks: can this web process serve requests?
READINESS: tuple[Callable[[], CheckResult], ...] = (check_database, check_broker, check_migrations)
#: What ``manage.py tms_check`` checks: is the whole platform working?
OPERATOR: tuple[Callable[[], CheckResult], ...] = (
    check_database,
    check_broker,
    check_migrations,
    check_queue,
    check_runners,
    check_beat_schedule,
    check_monitor,
    check_workers,
)


def run_checks(checks: tuple[Callable[[], CheckResult], ...]) -> list[CheckResult]:
    """Run ``checks`` in order. Once the database check fails, the checks that read the database
    report that instead of each waiting on it again."""
    results: list[CheckResult] = []
    database_down = False
    for check in checks:
        if database_down and check in NEEDS_DATABASE:
            name = check.__name__.removeprefix("check_").replace("_", " ")
            results.append(CheckResult(name, False, "skipped: database unreachable"))
            continue
        result = check()
        results.append(result)
        database_down = database_down or (check is check_database and not result.ok)
    return results


def _broker_connection(timeout: float) -> Connection:
    return Connection(
        settings.CELERY_BROKER_URL,
        connect_timeout=timeout,
        transport_options=dict(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}),
    )


def _safe_broker_url() -> str:
    return Connection(settings.CELERY_BROKER_URL).as_uri()  # password masked


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
