"""``/metrics`` for Prometheus: what the database knows, read at scrape time, plus the
process-local metrics of :mod:`tms_core.metrics`.

Database-derived metrics come from :class:`DatabaseCollector`, which runs a handful of cheap
queries each scrape (the rollup summed by runner, the live states on their partial indexes,
skipped occurrences by reason, the opted-in tasks). They are the same whichever web process
(or gunicorn worker) answers, and need nothing from the worker, monitor or beat processes.

* ``tms_executions_total{runner,outcome}`` (counter): finished attempts by outcome
  (succeeded, failed, cancelled, retried), from the rollup the execution table's trigger keeps.
  The rollup keeps minutes for ``TMS_ROLLUP_RETENTION``; older minutes are folded into one
  carry row per team and runner (:func:`executions.rollup.rollup_prune`), so totals never go
  back.
* ``tms_execution_lateness_seconds{runner}`` and ``tms_execution_duration_seconds{runner}``
  (histograms; buckets: :data:`executions.histogram.EDGES`): start minus due, end minus start,
  of finished attempts that started. The rollup keeps counts per bucket, not sums, so there is
  no ``_sum``/``_count``: the ``+Inf`` bucket is the count. Lateness below 10 ms (negative
  included: jitter) is in the first bucket.
* ``tms_skipped_occurrences_total{reason}`` (counter): fire times that did not run. A deleted
  task takes its rows with it, which Prometheus reads as a counter reset.
* ``tms_executions_due_backlog`` (held runs included), ``tms_executions_pending``, ``tms_executions_running``
  (gauges): SCHEDULED and due now, PENDING (published, not yet claimed), RUNNING.
* ``tms_workers_alive`` (gauge): workers heartbeating.
* ``tms_task_last_success_timestamp_seconds{task_id,task}`` (gauge): finish time of the task's
  latest occurrence that succeeded, for tasks (not deleted) with ``expose_metrics`` only, at
  most ``TMS_METRICS_MAX_TASKS`` (default 100) of them, lowest ids first;
  ``tms_tasks_metrics_opted_in`` counts every opted-in task, so a cut is visible.
* ``tms_metrics_database_up`` and ``tms_metrics_collect_duration_seconds`` (gauges): whether the
  queries above succeeded and how long they took. With the database down the scrape still
  answers, with the process-local metrics only.

Process-local metrics (:mod:`tms_core.metrics`, summed over the processes of this machine in
multiprocess mode): ``tms_monitor_pass_duration_seconds`` (histogram),
``tms_monitor_messages_published_total{kind}``, ``tms_monitor_publish_errors_total``,
``tms_monitor_pass_errors_total``, ``tms_materialiser_pass_duration_seconds`` (histogram),
``tms_materialiser_executions_created_total``, and the notifications':
``tms_notifications_delivered_total{kind}`` (deliveries that reached their channel) and
``tms_notifications_failed_total{kind,outcome}`` (send attempts that failed: ``retry`` or ``final``).
Only ``tms_*`` families are served: Flower's ``flower_*`` are Flower's own ``/metrics``.

Access (:func:`metrics_access`): a bearer token (``TMS_METRICS_TOKEN``) and/or client networks
(``TMS_METRICS_ALLOWED_NETWORKS``); with neither configured, loopback only. The endpoint is
answered first thing in the middleware chain (:class:`MetricsMiddleware`), before the SSL
redirect and the host check, as ``/healthz`` is: Prometheus scrapes a container by name over
plain HTTP.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from collections.abc import Callable, Iterable, Iterator

from django.db import DatabaseError, connection
from django.db.backends.utils import CursorWrapper
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from executions.histogram import BUCKETS, EDGES
from executions.models import (
    DURATION_COLUMNS,
    LATENESS_COLUMNS,
    OUTCOME_COLUMNS,
    Execution,
    ExecutionStatus,
    RunRollup,
    SkippedOccurrence,
    Worker,
    WorkerStatus,
)
from tasks_app.models import Task, TaskStatus
from tms_core import metrics as process_metrics
from tms_core.client_address import client_address
from tms_core.conf import tms_settings

logger = logging.getLogger(__name__)

METRICS_PATHS = ("/metrics", "/metrics/")
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
#: ``le`` labels of the rollup's buckets: bucket i holds [EDGES[i-1], EDGES[i]), so the
#: cumulative count up to bucket i is the count below EDGES[i]. Prometheus' ``le`` is "less
#: than or equal"; a value exactly on an edge is counted one bucket up (a negligible skew).
_LE = (*(repr(edge) for edge in EDGES), "+Inf")


def _cumulative(counts: Iterable[int]) -> list[tuple[str, float]]:
    total, buckets = 0, []
    for le, count in zip(_LE, counts, strict=True):
        total += count
        buckets.append((le, float(total)))
    return buckets


class DatabaseCollector(Collector):
    """Metrics read from PostgreSQL at scrape time (see the module docstring for each one)."""

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            families = list(self._families())
            up = 1.0
        except DatabaseError as exc:
            logger.warning("metrics: database unavailable (%s: %s)", type(exc).__name__, exc)
            families, up = [], 0.0
        yield from families
        yield GaugeMetricFamily(
            "tms_metrics_database_up", "1 when the database-derived metrics could be read at this scrape.", value=up
        )
        yield GaugeMetricFamily(
            "tms_metrics_collect_duration_seconds",
            "Time the database-derived metrics took to read at this scrape.",
            value=time.perf_counter() - started,
        )

    def _families(self) -> Iterator[Metric]:
        with connection.cursor() as cursor:
            yield from self._rollup(cursor)
            yield from self._live(cursor)
            yield from self._skipped(cursor)
            yield from self._tasks(cursor)

    def _rollup(self, cursor: CursorWrapper) -> Iterator[Metric]:
        outcomes = list(OUTCOME_COLUMNS.values())
        columns = outcomes + list(LATENESS_COLUMNS) + list(DURATION_COLUMNS)
        sums = ", ".join(f"COALESCE(SUM({column}), 0)" for column in columns)
        cursor.execute(
            f"SELECT runner, {sums} FROM {RunRollup._meta.db_table} GROUP BY runner ORDER BY runner"  # noqa: S608
        )
        executions = CounterMetricFamily(
            "tms_executions", "Finished attempts by runner and outcome.", labels=["runner", "outcome"]
        )
        lateness = HistogramMetricFamily(
            "tms_execution_lateness_seconds",
            "Start time minus due time of finished attempts that started, by runner.",
            labels=["runner"],
        )
        duration = HistogramMetricFamily(
            "tms_execution_duration_seconds",
            "Run time of finished attempts that started, by runner.",
            labels=["runner"],
        )
        for row in cursor.fetchall():
            runner, values = row[0], [int(v) for v in row[1:]]
            for outcome, count in zip(outcomes, values, strict=False):
                executions.add_metric([runner, outcome], count)
            first = len(outcomes)
            lateness.add_metric([runner], _cumulative(values[first : first + BUCKETS]), None)
            duration.add_metric([runner], _cumulative(values[first + BUCKETS : first + 2 * BUCKETS]), None)
        yield from (executions, lateness, duration)

    def _live(self, cursor: CursorWrapper) -> Iterator[Metric]:
        # Each count reads one partial index (the conditions match the indexes' exactly).
        execution, worker = Execution._meta.db_table, Worker._meta.db_table
        # The due backlog counts runs held back by a limit too (their due time is only their
        # next re-check), as the dashboard does: due ones, less the held among them, plus every
        # held one (execution_held_idx).
        held = f"FROM {execution} WHERE status = %s AND waiting <> ''"
        cursor.execute(
            f"SELECT (SELECT count(*) FROM {execution} WHERE status = %s AND due_at <= now())"  # noqa: S608
            f" - (SELECT count(*) {held} AND due_at <= now()) + (SELECT count(*) {held}),"
            f" (SELECT count(*) FROM {execution} WHERE status = %s),"
            f" (SELECT count(*) FROM {execution} WHERE status = %s),"
            f" (SELECT count(*) FROM {worker} WHERE status = %s)",
            [
                ExecutionStatus.SCHEDULED,
                ExecutionStatus.SCHEDULED,
                ExecutionStatus.SCHEDULED,
                ExecutionStatus.PENDING,
                ExecutionStatus.RUNNING,
                WorkerStatus.ALIVE,
            ],
        )
        backlog, pending, running, alive = cursor.fetchone()
        yield GaugeMetricFamily(
            "tms_executions_due_backlog",
            "SCHEDULED executions past due: not yet published, or held back by a max_concurrency or a named limit.",
            value=backlog,
        )
        yield GaugeMetricFamily(
            "tms_executions_pending", "PENDING executions: published, not yet claimed by a worker.", value=pending
        )
        yield GaugeMetricFamily("tms_executions_running", "RUNNING executions.", value=running)
        yield GaugeMetricFamily("tms_workers_alive", "Workers heartbeating (status ALIVE).", value=alive)

    def _skipped(self, cursor: CursorWrapper) -> Iterator[Metric]:
        cursor.execute(
            f"SELECT reason, count(*) FROM {SkippedOccurrence._meta.db_table} GROUP BY reason ORDER BY reason"  # noqa: S608
        )
        skipped = CounterMetricFamily(
            "tms_skipped_occurrences", "Fire times that did not run, by reason.", labels=["reason"]
        )
        for reason, count in cursor.fetchall():
            skipped.add_metric([reason], count)
        yield skipped

    def _tasks(self, cursor: CursorWrapper) -> Iterator[Metric]:
        cap = tms_settings().METRICS_MAX_TASKS
        task, execution = Task._meta.db_table, Execution._meta.db_table
        cursor.execute(
            f"SELECT count(*) FROM {task} WHERE expose_metrics AND status <> %s",  # noqa: S608
            [TaskStatus.DELETED],
        )
        opted_in = cursor.fetchone()[0]
        # The latest succeeded occurrence walks the (task, scheduled_for) index backwards and
        # stops at the first success: no scan of a task's whole history.
        cursor.execute(
            f"SELECT t.id, t.name, (SELECT e.finished_at FROM {execution} e"  # noqa: S608
            f" WHERE e.task_id = t.id AND e.status = %s ORDER BY e.scheduled_for DESC LIMIT 1)"
            f" FROM {task} t WHERE t.expose_metrics AND t.status <> %s ORDER BY t.id LIMIT %s",
            [ExecutionStatus.SUCCEEDED, TaskStatus.DELETED, cap],
        )
        last_success = GaugeMetricFamily(
            "tms_task_last_success_timestamp_seconds",
            "Finish time (Unix seconds) of the latest succeeded occurrence of each task that opted in.",
            labels=["task_id", "task"],
        )
        for task_id, name, finished_at in cursor.fetchall():
            if finished_at is not None:
                last_success.add_metric([str(task_id), name], finished_at.timestamp())
        yield last_success
        yield GaugeMetricFamily(
            "tms_tasks_metrics_opted_in",
            f"Tasks (not deleted) with expose_metrics; at most TMS_METRICS_MAX_TASKS ({cap}) get a series.",
            value=opted_in,
        )


class _ProcessLocal(Collector):
    """Without multiprocess mode: this process's own metrics (those of tms_core.metrics, and the
    process collector's of prometheus_client's global registry)."""

    def collect(self) -> Iterator[Metric]:
        yield from process_metrics.REGISTRY.collect()
        yield from REGISTRY.collect()


class _TmsProcesses(Collector):
    """With multiprocess mode: the metrics of every TMS process of this machine, summed from the
    shared folder, and only TMS's (``tms_*``): a process that is not TMS's but was given the same
    folder (Flower, which loads the Celery app) does not put its series here."""

    def __init__(self, folder: str) -> None:
        from prometheus_client import multiprocess

        self._files = multiprocess.MultiProcessCollector(None, path=folder)

    def collect(self) -> Iterator[Metric]:
        for family in self._files.collect():
            if family.name.startswith(process_metrics.PREFIX):
                yield family


def render_metrics() -> bytes:
    """The exposition text of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    folder = process_metrics.multiproc_dir()
    registry.register(_TmsProcesses(folder) if folder else _ProcessLocal())
    registry.register(DatabaseCollector())
    return generate_latest(registry)


def _client_network_allowed(address: str, networks: tuple[str, ...]) -> bool:
    try:
        client = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(client, ipaddress.IPv6Address) and client.ipv4_mapped:
        client = client.ipv4_mapped
    allowed = [ipaddress.ip_network(network, strict=False) for network in networks] if networks else list(LOOPBACK)
    return any(client.version == network.version and client in network for network in allowed)


def metrics_access(request: HttpRequest) -> HttpResponse | None:
    """None when ``request`` may read the metrics, else the refusal.

    The client address (:func:`~tms_core.client_address.client_address`: the peer, or behind
    ``TMS_TRUSTED_PROXIES`` the address they forwarded) must be in
    ``TMS_METRICS_ALLOWED_NETWORKS`` (403); with no networks configured, loopback when no token
    is set and any address when one is. With ``TMS_METRICS_TOKEN`` set, ``Authorization: Bearer
    <token>`` is required: missing, 401; wrong, 403.
    """
    conf = tms_settings()
    token, networks = conf.METRICS_TOKEN, conf.METRICS_ALLOWED_NETWORKS
    if (networks or not token) and not _client_network_allowed(client_address(request) or "", networks):
        return JsonResponse(
            {"type": "permission_denied", "detail": "Metrics are not served to this address."}, status=403
        )
    if not token:
        return None
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        response = JsonResponse(
            {"type": "not_authenticated", "detail": "Send Authorization: Bearer <TMS_METRICS_TOKEN>."}, status=401
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return JsonResponse({"type": "permission_denied", "detail": "Wrong metrics token."}, status=403)
    return None


class MetricsMiddleware:
    """Answers ``/metrics`` before the SSL redirect and the host check (see the module docstring)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path not in METRICS_PATHS:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            response: HttpResponse = JsonResponse({"type": "method_not_allowed", "detail": "Use GET."}, status=405)
            response["Allow"] = "GET, HEAD"
            return response
        refusal = metrics_access(request)
        if refusal is not None:
            return refusal
        response = HttpResponse(render_metrics(), content_type=CONTENT_TYPE_LATEST)
        response["Cache-Control"] = "no-store"
        return response
