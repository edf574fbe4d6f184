"""The execution list pages by keyset ("Older" continues after the last row shown): every row
once, newest scheduled time first with ties broken by id, no COUNT of the table, the same number
of queries on every page, and the index range scan the page needs."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from backoffice.views import PAGE_SIZE
from executions.models import Execution
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tests.backoffice.helpers import walk_pages
from tests.factories import ExecutionFactory
from tms_core.api.keyset import Position, encode_cursor

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(user):
    """Two pages and a bit of finished runs over three tasks, with equal times (ties on the key)
    and a few waiting runs that the default list leaves out."""
    now = timezone.now().replace(microsecond=0)
    tasks = [task_create(owner=user, runner="noop", name=f"t{n}", interval=timedelta(hours=1)) for n in range(3)]
    Execution.objects.all().delete()
    for n in range(2 * PAGE_SIZE + 7):
        status = (S.SUCCEEDED, S.FAILED, S.CANCELLED)[n % 3]
        ExecutionFactory(task=tasks[n % 3], scheduled_for=now - timedelta(minutes=n // 3), status=status)
    for n in range(4):
        ExecutionFactory(task=tasks[0], scheduled_for=now + timedelta(minutes=n + 1))
    return tasks


def _walk(client, path):
    return walk_pages(client, path, "execution")


def test_pages_show_every_ran_row_once_newest_first_without_counting(alice_client, history):
    pages, queries = _walk(alice_client, "/ui/executions/")
    expected = list(
        Execution.objects.exclude(status=S.SCHEDULED).order_by("-scheduled_for", "-id").values_list("pk", flat=True)
    )
    assert [len(page) for page in pages] == [PAGE_SIZE, PAGE_SIZE, 7]
    assert [pk for page in pages for pk in page] == expected
    assert len({len(q) for q in queries}) == 1  # every page the same work, the last one too
    assert not [sql for q in queries for sql in q if "COUNT(" in sql.upper()]


def test_a_status_filter_and_the_waiting_runs_page_by_keyset_too(alice_client, history):
    failed, _ = _walk(alice_client, "/ui/executions/?status=FAILED")
    expected = Execution.objects.filter(status=S.FAILED).order_by("-scheduled_for", "-id")
    assert [pk for page in failed for pk in page] == list(expected.values_list("pk", flat=True))
    waiting, _ = _walk(alice_client, "/ui/executions/?status=SCHEDULED")
    soonest = Execution.objects.filter(status=S.SCHEDULED).order_by("due_at", "id")
    assert [pk for page in waiting for pk in page] == list(soonest.values_list("pk", flat=True))


def test_another_users_list_is_empty_and_staff_see_all(client, history, other_user, staff_user):
    client.force_login(other_user)
    assert client.get("/ui/executions/").context["rows"] == []
    client.force_login(staff_user)
    pages, _ = _walk(client, "/ui/executions/")
    assert sum(len(page) for page in pages) == Execution.objects.exclude(status=S.SCHEDULED).count()


@pytest.mark.parametrize(
    "cursor",
    [
        "x",
        "1_2_3",
        "99999999999999999999999_1",
        # Well-formed cursors that cannot be a row of this list: a second segment, an id of text,
        # a time without a zone.
        encode_cursor(Position(1, None, 5)),
        encode_cursor(Position(0, datetime(2026, 1, 1, tzinfo=UTC), "x")),
        encode_cursor(Position(0, datetime(2026, 1, 1), 5)),
    ],
)
def test_a_malformed_cursor_is_a_400_that_says_so(alice_client, history, cursor):
    response = alice_client.get("/ui/executions/", {"cursor": cursor})
    assert response.status_code == 400
    assert "Invalid cursor" in response.content.decode()


def test_newer_links_walk_back_through_the_same_pages(alice_client, history):
    """The API's cursors both ways: from the last page, "Newer" (``rel="prev"``) gives back each
    page that "Older" gave, row for row."""
    forwards, _ = _walk(alice_client, "/ui/executions/")
    path, backwards = "/ui/executions/", []
    response = alice_client.get(path)
    while (found := re.search(r'<a rel="next" href="([^"]+)"', response.content.decode())) is not None:
        response = alice_client.get(path + found.group(1).replace("&amp;", "&"))
    while True:
        backwards.insert(0, [row["execution"].pk for row in response.context["rows"]])
        found = re.search(r'<a rel="prev" href="([^"]+)"', response.content.decode())
        if found is None:
            break
        response = alice_client.get(path + found.group(1).replace("&amp;", "&"))
    assert backwards == forwards


def test_the_page_query_is_an_index_range_scan(alice_client, history):
    """With the planner steered away from sequential scans (the table here is small), the second
    page's query, as the page runs it, reads execution_ran_idx from the cursor: no sort."""
    first = alice_client.get("/ui/executions/")
    cursor = first.context["page"].next_cursor
    with CaptureQueriesContext(connection) as captured:
        alice_client.get("/ui/executions/", {"cursor": cursor})
    (sql,) = [q["sql"] for q in captured if "executions_execution" in q["sql"]]
    with connection.cursor() as db:
        db.execute("SET LOCAL enable_seqscan = off")
        db.execute("SET LOCAL enable_bitmapscan = off")
        db.execute(f"EXPLAIN {sql}")
        plan = "\n".join(row[0] for row in db.fetchall())
    assert "execution_ran_idx" in plan and "Sort" not in plan
