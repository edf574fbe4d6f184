"""The execution list pages by keyset ("Older" continues after the last row shown): every row
once, newest scheduled time first with ties broken by id, no COUNT of the table, the same number
of queries on every page, and the index range scan the page needs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from backoffice.views import PAGE_SIZE
from executions.models import Execution
from executions.models import ExecutionStatus as S
from tasks_api.services import task_create
from tests.backoffice.helpers import walk_pages
from tests.factories import ExecutionFactory

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


@pytest.mark.parametrize("cursor", ["x", "1_2_3", "99999999999999999999999_1", "12_"])
def test_a_malformed_cursor_is_a_400_that_says_so(alice_client, history, cursor):
    response = alice_client.get("/ui/executions/", {"after": cursor})
    assert response.status_code == 400
    assert "&#x27;after&#x27; must be a cursor" in response.content.decode()


def test_the_page_query_is_an_index_range_scan(history):
    """With the planner steered away from sequential scans (the table here is small), the page's
    query reads execution_ran_idx from the cursor: no sort of the table."""
    last = Execution.objects.exclude(status=S.SCHEDULED).order_by("-scheduled_for", "-id")[PAGE_SIZE]
    page = (
        Execution.objects.exclude(status=S.SCHEDULED)
        .filter(scheduled_for__lte=last.scheduled_for)
        .order_by("-scheduled_for", "-id")[: PAGE_SIZE + 1]
    )
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        plan = page.explain()
    assert "execution_ran_idx" in plan and "Sort" not in plan
