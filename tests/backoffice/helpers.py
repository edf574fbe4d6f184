"""Shared helpers of the back-office tests: drive executions through the real transitions."""

from __future__ import annotations

import re
from datetime import timedelta

from django.test import Client
from django.utils import timezone

from executions import transitions
from executions.models import Execution
from tasks_app.models import Task

WORKER = "host:1:1"


def run(task: Task, *, outcome: str = "succeed", late: float = 0.5, error: str = "boom") -> Execution:
    """A new execution of ``task`` taken, claimed and ended through the real transitions."""
    due = timezone.now() - timedelta(seconds=late)
    (pk,) = transitions.executions_create(rows=[transitions.NewExecution(task.pk, due, 5)], actor="test")
    transitions.executions_take_due(limit=1000, actor="monitor:test")
    assert transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id=WORKER, lease_seconds=60)
    if outcome == "succeed":
        assert transitions.execution_succeed(execution_id=pk, attempt=1, worker_id=WORKER, output="ok", max_chars=1000)
    elif outcome == "fail":
        transitions.execution_fail(
            execution_id=pk, attempt=1, worker_id=WORKER, error=error, output="", retry_in=None, max_chars=1000
        )
    return Execution.objects.get(pk=pk)


def csrf_client(user) -> Client:
    """A logged-in client that enforces CSRF, as a browser session is checked."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def csrf_token(client: Client, path: str) -> str:
    """The CSRF token from the page at ``path`` (as a browser gets it)."""
    page = client.get(path)
    assert page.status_code == 200, page.content[:500]
    match = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content)
    assert match, "no CSRF token on the page"
    return match.group(1).decode()


def walk_pages(
    client: Client, path: str, row: str | None, *, rows: str = "rows", base: str | None = None
) -> tuple[list[list], list[list[str]]]:
    """Follow a keyset list's "Older"/"Later" links (``rel="next"``) from ``path``: the pk of each
    page's rows (``context[rows][i][row].pk``, or ``context[rows][i].pk`` when ``row`` is None)
    and the SQL of each page's queries."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    base = base or path.split("?")[0]
    pages: list[list] = []
    queries: list[list[str]] = []
    next_path: str | None = path
    while next_path:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(next_path)
        assert response.status_code == 200
        pages.append([(entry[row] if row else entry).pk for entry in response.context[rows]])
        queries.append([q["sql"] for q in captured])
        found = re.search(r'<a rel="next" href="([^"]+)"', response.content.decode())
        next_path = base + found.group(1).replace("&amp;", "&") if found else None
    return pages, queries
