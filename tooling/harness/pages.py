"""The ``pages`` scenario of ``manage.py tms_bench``: every back-office page's server time.

Each page is requested through Django's test ``Client`` in this process (a logged-in session, the
real middleware, views and templates; no network, so the time is the server's), as a staff user
and as an owner, ``renders`` times after one warm-up request. Per page: p50 / p95 / p99 / max in
ms, the CPU this process spent per request (the web side; PostgreSQL's backend is another
process), the queries per request, and the response size. Beside them, the machine's own load
over the timed requests (its CPU busy share from ``/proc/stat`` and the load average): on a
shared machine a slow figure means little without it. The PostgreSQL backend's CPU per request
(``/proc`` of a local server) beside the web's gives what a page costs whatever the load.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection

#: The figures budget: every page's server time p95, in ms.
BUDGET_P95_MS = 100.0


def _backend_cpu_ms() -> float | None:
    """CPU ms (user + system) used so far by the PostgreSQL backend of this process's connection
    (a local server: read from /proc), or None when it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError, TypeError):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")
    return None


def _cpu_busy() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine so far, from /proc/stat (None if unreadable)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields) - idle, sum(fields)
    return None


def page_paths(user: Any) -> list[tuple[str, str]]:
    """``(name, path)`` of every back-office page, with the rows the user may see: the dashboard
    and its refresh, the task list (plain, searched, filtered), a task's page, its edit form and
    a "why" question, the execution list (first page, half-way down, FAILED, waiting runs), an
    execution's page, the notifications page, the named limits and business calendars (and a
    limit's and a calendar's page when the user sees one); a task's run-with-input form, versions, current
    version and workflow, and the newest execution's replay form (the users must be operators)."""
    from backoffice.calendar_views import visible_calendars
    from backoffice.keyset import row_cursor
    from backoffice.limit_views import visible_limits
    from backoffice.scope import visible_executions, visible_tasks
    from executions.models import ExecutionStatus
    from tasks_app.models import TaskVersion
    from tasks_app.versions import version_first_ensure

    ran = visible_executions(user).exclude(status=ExecutionStatus.SCHEDULED).order_by("-scheduled_for", "-id")
    newest = ran.first()
    if newest is None:
        raise RuntimeError(f"pages: {user} sees no executions (fill first)")
    middle = ran.only("scheduled_for")[ran.count() // 2]
    task = visible_tasks(user).get(pk=newest.task_id)
    at = newest.scheduled_for.isoformat()
    version_first_ensure(task.pk)  # a task made by the service has its version 1 written when first needed
    version = TaskVersion.objects.filter(task_id=task.pk).order_by("-number").values_list("number", flat=True).first()
    return [
        ("dashboard", "/"),
        ("dashboard_live", "/ui/dashboard/live"),
        ("tasks", "/ui/tasks/"),
        ("tasks_search", "/ui/tasks/?q=sleep"),
        ("tasks_paused", "/ui/tasks/?status=PAUSED"),
        ("task", f"/ui/tasks/{task.pk}/"),
        ("task_why", f"/ui/tasks/{task.pk}/?at={at.replace('+', '%2B')}"),
        ("task_edit", f"/ui/tasks/{task.pk}/edit/"),
        ("executions", "/ui/executions/"),
        ("executions_deep", f"/ui/executions/?cursor={row_cursor('scheduled_for', middle)}"),
        ("executions_failed", "/ui/executions/?status=FAILED"),
        ("executions_waiting", "/ui/executions/?status=SCHEDULED"),
        ("execution", f"/ui/executions/{newest.pk}/"),
        ("notifications", "/ui/notifications/"),
        ("limits", "/ui/limits/"),
        ("calendars", "/ui/calendars/"),
        *[("calendar", f"/ui/calendars/{pk}/") for pk in visible_calendars(user).values_list("pk", flat=True)[:1]],
        *[("limit", f"/ui/limits/{pk}/") for pk in visible_limits(user).values_list("pk", flat=True)[:1]],
        # Issue 46: run with input, replay, versions (and one's diff), the task's workflow.
        ("task_run", f"/ui/tasks/{task.pk}/run/"),
        ("execution_replay", f"/ui/executions/{newest.pk}/replay/"),
        ("task_versions", f"/ui/tasks/{task.pk}/versions/"),
        ("workflow", f"/ui/tasks/{task.pk}/workflow/"),
        # A version's page when the task has one recorded (a filler's tasks are inserted without).
        *([("task_version", f"/ui/tasks/{task.pk}/versions/{version}/")] if version else []),
    ]


def time_pages(
    users: list[tuple[str, Any]], renders: int, progress: Callable[[str], None] = lambda line: None
) -> dict[str, Any]:
    """Time every page of :func:`page_paths` for each ``(label, user)``; see the module's doc."""
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    figures: dict[str, Any] = {"budget_p95_ms": BUDGET_P95_MS, "renders": renders, "pages": {}}
    before, load_before = _cpu_busy(), os.getloadavg()
    for label, user in users:
        client = Client()
        client.force_login(user)
        for name, path in page_paths(user):
            progress(f"pages: {renders} requests of {path} as {label}")
            first = client.get(path)
            if first.status_code != 200:
                raise RuntimeError(f"{path} answered {first.status_code} to {label}")
            timings, cpu, queries = [], [], 0
            db_before = _backend_cpu_ms()
            for _ in range(renders):
                with CaptureQueriesContext(connection) as captured:
                    cpu_start, started = time.process_time(), time.perf_counter()
                    response = client.get(path)
                    timings.append((time.perf_counter() - started) * 1000)
                    cpu.append((time.process_time() - cpu_start) * 1000)
                queries = max(queries, len(captured))
                if response.status_code != 200:
                    raise RuntimeError(f"{path} answered {response.status_code} to {label}")
            db_after = _backend_cpu_ms()
            ordered, spent = sorted(timings), sorted(cpu)

            def q(values: list[float], p: float) -> float:
                return round(values[min(len(values) - 1, int(p * len(values)))], 1)

            figures["pages"][f"{label} {name}"] = {
                "path": path,
                "p50": q(ordered, 0.5),
                "p95": q(ordered, 0.95),
                "p99": q(ordered, 0.99),
                "max": round(ordered[-1], 1),
                "web_cpu_ms_p50": q(spent, 0.5),
                # The backend's CPU over the timed requests (its pid read once per request costs
                # it a little too), per request: with the web CPU, what a page costs on an idle machine.
                "db_cpu_ms": None
                if db_before is None or db_after is None
                else round((db_after - db_before) / renders, 1),
                "queries": queries,
                "kib": round(len(response.content) / 1024, 1),
            }
    after = _cpu_busy()
    if before and after and after[1] > before[1]:
        figures["machine_cpu_busy"] = round((after[0] - before[0]) / (after[1] - before[1]), 2)
    figures["load_average"] = [round(v, 2) for v in (*load_before, *os.getloadavg())]
    figures["over_budget"] = sorted(n for n, f in figures["pages"].items() if f["p95"] > BUDGET_P95_MS)
    return figures


def pages_table(figures: dict[str, Any]) -> list[str]:
    """The pages scenario as a Markdown table, the machine's load under it."""
    lines = [
        "",
        f"machine CPU busy over the timed requests: {figures.get('machine_cpu_busy', '?')} "
        f"(load average before 1/5/15 min, then after: {figures.get('load_average')})",
        "",
        "| user page | p50 / p95 / p99 / max (ms) | web CPU ms (p50) | db CPU ms (mean) | queries | KiB |",
        "|---|---|---|---|---|---|",
    ]
    for name, f in figures.get("pages", {}).items():
        flag = " **over**" if f["p95"] > figures.get("budget_p95_ms", BUDGET_P95_MS) else ""
        lines.append(
            f"| {name} | {f['p50']} / {f['p95']}{flag} / {f['p99']} / {f['max']} | {f['web_cpu_ms_p50']} | "
            f"{f.get('db_cpu_ms', '?')} | {f['queries']} | {f['kib']} |"
        )
    return lines
