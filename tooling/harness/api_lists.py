"""The API's lists over a big history, timed over real HTTP (``tms_bench --scenario lists``).

One gunicorn worker with one thread serves the project's WSGI application (every middleware,
token authentication, throttling, DRF, the JSON renderer): a request is served alone, so the CPU
its worker process and its PostgreSQL backend use between two readings of ``/proc/<pid>/stat``
is that request's. Each path is requested ``requests`` times in turn with the client's own
keep-alive connection; a trivial authenticated path is timed the same way in the same run (the
owner's notification channels: none, so authentication, middleware
and an empty page), so the ratio of a list to it says what the list costs beyond the request
itself, however loaded the machine is.

Then each path is requested once more in process through Django's test client with its queries
captured: how many, and how much of the time was spent waiting on them (the rest is Python:
middleware, authentication, filters, pagination, serialisation). ``EXPLAIN (ANALYZE, BUFFERS)``
of each path's slowest query goes into the figures too.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.db import connection

from executions.models import ArchiveIndex, Execution
from tms_core.clock import db_now
from tooling.harness.processes import ManagedProcess, process_env

_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
SLOW_SECONDS = 2.0
_APP_NAME = "tms-bench-lists-web"
SLOW_REQUESTS = 5


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def q(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 1)

    return {"p50": q(0.50), "p95": q(0.95), "p99": q(0.99), "max": round(ordered[-1], 1)}


def _cpu_ms(pids: list[int]) -> float:
    """User plus system CPU of these processes so far, in ms (``/proc/<pid>/stat``)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total * _TICK_MS


def list_paths(owner: Any) -> list[tuple[str, str]]:
    """``(name, path)`` of every list and lookup timed, over ``owner``'s history."""
    from tms_core.api.keyset import Position, keyset_cursor

    now = db_now()
    mine = Execution.objects.filter(task__owner=owner)
    busiest = mine.values_list("task_id", flat=True).first()
    # The 90 % row of the history-first order (its past part): a page that deep by cursor.
    ran = mine.filter(scheduled_for__lte=now).exclude(status="SCHEDULED").order_by("-scheduled_for", "-id")
    total = ran.count()
    deep = ran.values_list("scheduled_for", "id")[int(total * 0.9)]
    deep_cursor = keyset_cursor(Position(0, deep[0], deep[1]), state={"t": now.isoformat()})
    one = mine.filter(status="SUCCEEDED").values_list("id", flat=True).first()
    archived = ArchiveIndex.objects.filter(owner_id=owner.pk).values_list("task_id", flat=True).first() or busiest
    day_before = (now - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    two_days = (now - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return [
        ("trivial", "/api/v1/notification-channels"),
        ("first", "/api/v1/executions"),
        ("deep_90pct", f"/api/v1/executions?cursor={deep_cursor}"),
        ("status_failed", "/api/v1/executions?status=FAILED"),
        ("status_scheduled", "/api/v1/executions?status=SCHEDULED"),
        ("origin_retry", "/api/v1/executions?origin=retry"),
        ("task_filter", f"/api/v1/executions?task={busiest}"),
        ("window", f"/api/v1/executions?scheduled_after={two_days}&scheduled_before={day_before}"),
        ("by_finished", "/api/v1/executions?ordering=-finished_at"),
        ("task_executions", f"/api/v1/tasks/{busiest}/executions"),
        ("task_failed", f"/api/v1/tasks/{busiest}/executions?status=FAILED"),
        ("task_list", "/api/v1/tasks"),
        ("task_why", f"/api/v1/tasks/{busiest}/why?at={day_before}"),
        ("execution", f"/api/v1/executions/{one}"),
        ("archive", f"/api/v1/tasks/{archived}/archive"),
    ]


@contextlib.contextmanager
def _server(settings_module: str, log_dir: Path) -> Iterator[tuple[int, ManagedProcess]]:
    with contextlib.closing(__import__("socket").socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # PGAPPNAME names the server's PostgreSQL backend, whose CPU is read beside the worker's.
    env = {"TMS_API_THROTTLE_USER": "1000000/minute", "PGAPPNAME": _APP_NAME}
    if settings_module:
        env["DJANGO_SETTINGS_MODULE"] = settings_module
    web = ManagedProcess(
        "bench-lists-web",
        [sys.executable, "-m", "gunicorn", "tms_project.wsgi", "-b", f"127.0.0.1:{port}", "-w", "1",
         "--threads", "1", "--timeout", "120"],
        process_env(**env),
        log_dir,
    )  # fmt: skip
    try:
        yield port, web
    finally:
        web.stop()


def _worker_pids(web: ManagedProcess) -> list[int]:
    children = Path(f"/proc/{web.pid}/task/{web.pid}/children")
    return [int(pid) for pid in children.read_text().split()] if children.exists() else []


def _backend_pids() -> list[int]:
    """The PostgreSQL backend of the benchmark's server."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [_APP_NAME],
        )
        return [row[0] for row in cursor.fetchall()]


def time_over_http(
    *,
    users: dict[str, Any],
    paths: list[tuple[str, str]],
    requests: int,
    settings_module: str,
    log_dir: Path,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """``{label: {path name: {wall ms quantiles, cpu ms per request (web, db)}}}`` for each user."""
    import requests as http

    from accounts.account_keys import account_key_create

    figures: dict[str, Any] = {}
    with _server(settings_module, log_dir) as (port, web):
        base = f"http://127.0.0.1:{port}"
        for label, user in users.items():
            session = http.Session()
            session.headers["Authorization"] = f"Token {account_key_create(user=user)}"
            ready_by = time.monotonic() + 120
            while True:
                with contextlib.suppress(http.ConnectionError, http.Timeout):
                    session.get(base + paths[0][1], timeout=30)
                    break
                if time.monotonic() > ready_by:
                    raise RuntimeError(f"gunicorn did not answer: {web.log()[-2000:]}")
                time.sleep(0.2)
            workers = _worker_pids(web)
            figures[label] = {}
            for name, path in paths:
                started = time.perf_counter()
                response = session.get(base + path, timeout=60)  # warm: plans, caches
                if response.status_code != 200:
                    raise RuntimeError(f"{path} answered {response.status_code}: {response.text[:300]}")
                # A path slower than SLOW_SECONDS is timed a few times only (the run must end).
                times = requests if time.perf_counter() - started < SLOW_SECONDS else SLOW_REQUESTS
                backends = _backend_pids()
                progress(f"lists: {times} requests of {name} as {label} over HTTP")
                timings = []
                web_before, db_before = _cpu_ms(workers), _cpu_ms(backends)
                for _ in range(times):
                    started = time.perf_counter()
                    response = session.get(base + path, timeout=60)
                    timings.append((time.perf_counter() - started) * 1000)
                    if response.status_code != 200:
                        raise RuntimeError(f"{path} answered {response.status_code}: {response.text[:300]}")
                figures[label][name] = {
                    **_quantiles(timings),
                    "requests": times,
                    "web_cpu_ms": round((_cpu_ms(workers) - web_before) / times, 2),
                    "db_cpu_ms": round((_cpu_ms(backends) - db_before) / times, 2),
                    "rows": len(response.json().get("results", [])) if name != "task_why" else None,
                }
            trivial = figures[label]["trivial"]["p95"] or 1.0
            for entry in figures[label].values():
                entry["p95_over_trivial"] = round(entry["p95"] / trivial, 2)
    return figures


def profile_in_process(*, user: Any, paths: list[tuple[str, str]], explain: bool = True) -> dict[str, Any]:
    """Per path, one request through the test client: queries, SQL ms against the whole, and the
    ``EXPLAIN (ANALYZE, BUFFERS)`` of the slowest query."""
    from django.test.utils import CaptureQueriesContext
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(user)
    found: dict[str, Any] = {}
    for name, path in paths:
        client.get(path)
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            client.get(path)
            total = (time.perf_counter() - started) * 1000
        sql_ms = sum(float(q["time"]) for q in captured.captured_queries) * 1000
        entry: dict[str, Any] = {
            "queries": len(captured),
            "total_ms": round(total, 1),
            "sql_ms": round(sql_ms, 1),
            "python_ms": round(total - sql_ms, 1),
            "counts": sum(1 for q in captured.captured_queries if "COUNT(" in q["sql"].upper()),
        }
        if explain and captured.captured_queries:
            slowest = max(captured.captured_queries, key=lambda q: float(q["time"]))
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + slowest["sql"])
                entry["slowest_sql"] = slowest["sql"]
                entry["slowest_plan"] = [row[0] for row in cursor.fetchall()]
        found[name] = entry
    return found
