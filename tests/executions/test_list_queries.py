"""The API's lists issue a fixed number of queries, whatever the page size and the table size,
and none counts the executions (what made big histories slow: docs/benchmarks.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from executions.models import ArchiveIndex, Execution
from executions.models import ExecutionStatus as S
from tests.conftest import client_for
from tests.factories import ExecutionFactory, TaskFactory

pytestmark = pytest.mark.django_db

#: Queries of one authenticated request besides the list's own: token auth with the user, and
#: the user's team ids, read once for the scope (tasks_app.teams.scope_to_teams).
AUTH = 2


def _history(owner, *, tasks: int, per_task: int):
    now = timezone.now()
    made = [TaskFactory(owner=owner) for _ in range(tasks)]
    statuses = [S.SUCCEEDED, S.FAILED, S.CANCELLED, S.RUNNING, S.SCHEDULED]
    for number, task in enumerate(made):
        for k in range(per_task):
            ExecutionFactory(
                task=task,
                scheduled_for=now + timedelta(minutes=k - per_task + 2, seconds=number),
                status=statuses[k % len(statuses)],
            )
        ArchiveIndex.objects.create(
            task=task,
            owner_id=owner.pk,
            file_name=f"archive/{task.pk}.jsonl.gz",
            period_from=now - timedelta(days=40),
            period_to=now - timedelta(days=30),
            executions=1,
            events=1,
            skipped=0,
            file_sha256="0" * 64,
            ids_sha256="0" * 64,
        )
    return made


def _paths(task, execution_id: int) -> dict[str, str]:
    since = (timezone.now() - timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "executions": "/api/v1/executions",
        "failed": "/api/v1/executions?status=FAILED",
        "task filter": f"/api/v1/executions?task={task.pk}",
        "window": f"/api/v1/executions?scheduled_after={since}",
        "by finished": "/api/v1/executions?ordering=-finished_at",
        "task executions": f"/api/v1/tasks/{task.pk}/executions",
        "execution": f"/api/v1/executions/{execution_id}",
        "archive": f"/api/v1/tasks/{task.pk}/archive",
    }


#: The most queries each path issues after authentication, at any page size and table size: a
#: cursor page reads the clock once on the first page (the instant splitting past from upcoming)
#: and each index range at most once (two sources in each of the two parts of the history-first
#: order; the not-null and null parts of a column order); a task's list first looks the task up;
#: one execution reads its events (the task's executions read the team ids twice: for the task's
#: lookup and for its runs); the archive list (one entry per pruning batch of the task,
#: small) counts its entries by the task's index.
MOST = {
    "executions": 5,
    "failed": 5,
    "task filter": 5,
    "window": 5,
    "by finished": 2,
    "task executions": 7,
    "execution": 2,
    "archive": 3,
}


def _counts_executions(sql: str) -> bool:
    upper = sql.upper()
    return "COUNT(" in upper and '"EXECUTIONS_EXECUTION"' in upper


def _requests(client, paths: dict[str, str], limit: int, django_assert_max_num_queries) -> None:
    """Request every path (and its next page), each within :data:`MOST` queries and none counting executions."""
    counts = []
    for name, path in paths.items():
        sep = "&" if "?" in path else "?"
        url = path if name == "execution" else f"{path}{sep}limit={limit}"
        while url:
            with django_assert_max_num_queries(AUTH + MOST[name]) as captured:
                response = client.get(url)
            assert response.status_code == 200, (name, response.content)
            assert not [q["sql"] for q in captured.captured_queries if _counts_executions(q["sql"])], name
            counts.append(len(captured))
            body = response.json()
            assert "count" not in body or name == "archive"
            # Two pages deep at most: a deeper page costs the same.
            url = body.get("next") if len(counts) % 2 else None


@pytest.mark.parametrize("limit", [2, 50])
def test_list_queries_do_not_depend_on_page_or_table_size(user, django_assert_max_num_queries, limit):
    client = client_for(user)
    small = _history(user, tasks=2, per_task=5)
    execution = small[0].executions.first()
    _requests(client, _paths(small[0], execution.pk), limit, django_assert_max_num_queries)
    # Ten times the rows: still within the same bounds.
    _history(user, tasks=5, per_task=20)
    _requests(client, _paths(small[0], execution.pk), limit, django_assert_max_num_queries)


def test_task_list_queries_do_not_depend_on_page_or_table_size(user, django_assert_num_queries):
    client = client_for(user)
    _history(user, tasks=3, per_task=2)
    # The page itself, nothing else: a cursor page counts nothing (the offset pages had a COUNT).
    with django_assert_num_queries(AUTH + 1) as small:
        assert client.get("/api/v1/tasks?limit=2").status_code == 200
    _history(user, tasks=12, per_task=2)
    with django_assert_num_queries(len(small)):
        assert client.get("/api/v1/tasks?limit=50").status_code == 200


def test_lean_page_rows_are_what_the_serializer_renders(user):
    """List pages render rows through ExecutionRowsSerializer: the same output as the field-by-field one."""
    from executions.serializers import ExecutionRowsSerializer, ExecutionSerializer

    _history(user, tasks=2, per_task=5)
    rows = list(Execution.objects.filter(task__owner=user))
    retried = rows[1]
    Execution.objects.filter(pk=rows[0].pk).update(
        retry_of=retried, origin="retry", output="ok", error="boom", started_at=timezone.now(), waiting="concurrency"
    )
    rows = list(Execution.objects.filter(task__owner=user).order_by("id"))
    page = ExecutionSerializer(rows, many=True)
    assert isinstance(page, ExecutionRowsSerializer)
    assert page.data == [dict(ExecutionSerializer(row).data) for row in rows]
    assert any(row["retry_of"] for row in page.data) and any(row["started_at"] for row in page.data)
