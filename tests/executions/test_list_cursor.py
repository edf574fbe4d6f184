"""Cursor pages of the execution lists: every row exactly once, in order, while rows are added."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from executions.models import Execution
from executions.models import ExecutionStatus as S
from tests.factories import ExecutionFactory, TaskFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/executions"


def _walk(client, url: str) -> list[list[int]]:
    pages = []
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.content
        body = response.json()
        assert "count" not in body
        pages.append([e["id"] for e in body["results"]])
        url = body["next"]
    return pages


@pytest.fixture
def history(user, other_user):
    """40 executions over three tasks: past ones in every status, upcoming ones, and ties on
    scheduled_for across tasks (every-minute tasks in step)."""
    now = timezone.now()
    tasks = [TaskFactory(owner=user) for _ in range(3)]
    rows = []
    for k in range(-9, 5):
        for task in tasks[: 3 if k % 2 else 2]:
            status = S.SCHEDULED if k > 0 else [S.SUCCEEDED, S.FAILED, S.RUNNING, S.SCHEDULED][k % 4]
            rows.append(ExecutionFactory(task=task, scheduled_for=now + timedelta(minutes=k), status=status))
    ExecutionFactory(task=TaskFactory(owner=other_user), scheduled_for=now)
    return tasks, rows, now


def _history_first(rows, now) -> list[int]:
    past = sorted((r for r in rows if r.scheduled_for <= now), key=lambda r: (r.scheduled_for, r.pk), reverse=True)
    upcoming = sorted((r for r in rows if r.scheduled_for > now), key=lambda r: (r.scheduled_for, r.pk))
    return [r.pk for r in past + upcoming]


def test_pages_give_every_row_once_in_history_first_order(api_client, history):
    _, rows, now = history
    pages = _walk(api_client, f"{URL}?limit=7")
    seen = [pk for page in pages for pk in page]
    assert len(seen) == len(set(seen)) == len(rows)
    # The first page's instant (just after the fixture's) splits past from upcoming.
    assert seen == _history_first(rows, now)
    assert all(len(page) == 7 for page in pages[:-1])


def test_rows_inserted_while_paging_never_make_a_row_appear_twice_or_go_missing(api_client, history):
    tasks, rows, now = history
    original = {r.pk for r in rows}
    url, seen, added = f"{URL}?limit=5", [], 0
    while url:
        body = api_client.get(url).json()
        seen += [e["id"] for e in body["results"]]
        # New rows everywhere in the order: far past, recent past, upcoming, and ties of shown rows.
        for offset in (timedelta(hours=-5), timedelta(seconds=-added - 1), timedelta(minutes=30 + added)):
            ExecutionFactory(task=tasks[added % 3], scheduled_for=now + offset + timedelta(microseconds=added))
            added += 1
        url = body["next"]
    assert len(seen) == len(set(seen))  # no row twice
    assert original <= set(seen)  # none of the rows there at the start missed


def test_previous_links_walk_back_through_the_same_pages(api_client, history):
    pages, url = [], f"{URL}?limit=6&task={history[0][0].pk}"
    forward = _walk(api_client, url)
    # From the last page back to the first.
    body = api_client.get(url).json()
    while body["next"]:
        last = body
        body = api_client.get(body["next"]).json()
    pages.append([e["id"] for e in body["results"]])
    while body["previous"]:
        body = api_client.get(body["previous"]).json()
        pages.append([e["id"] for e in body["results"]])
    assert list(reversed(pages)) == forward and last is not None
    assert api_client.get(url).json()["previous"] is None


def test_ordering_by_a_column_puts_empty_values_last_and_pages_every_row_once(api_client, history):
    _, rows, _ = history
    pages = _walk(api_client, f"{URL}?ordering=-started_at&limit=4")
    seen = [pk for page in pages for pk in page]
    assert sorted(seen) == sorted(r.pk for r in rows)
    started = {r.pk: r.started_at for r in Execution.objects.filter(pk__in=seen)}
    with_start = [pk for pk in seen if started[pk] is not None]
    assert seen[: len(with_start)] == with_start  # the ones not started come after
    assert [started[pk] for pk in with_start] == sorted((started[pk] for pk in with_start), reverse=True)
    by_id = _walk(api_client, f"{URL}?ordering=id&limit=9")
    assert [pk for page in by_id for pk in page] == sorted(r.pk for r in rows)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("offset=10", "offset"),
        ("limit=10&offset=0", "offset"),
        ("cursor=garbage", "cursor"),
        ("cursor=eyJwIjpbMCwxLDJdfQ", "cursor"),  # well-formed JSON, not a cursor of this list
        ("ordering=name", "ordering"),
        ("ordering=id,scheduled_for", "ordering"),
        ("limit=0", "limit"),
    ],
)
def test_bad_paging_input_is_a_400_that_names_the_field(api_client, history, query, field):
    response = api_client.get(f"{URL}?{query}")
    assert response.status_code == 400, response.content
    assert field in str(response.json())
    if field == "offset":
        assert "next" in str(response.json()) and "cursor" in str(response.json())


def test_a_cursor_is_bound_to_its_ordering(api_client, history):
    body = api_client.get(f"{URL}?ordering=id&limit=3").json()
    cursor = body["next"].split("cursor=")[1]
    assert api_client.get(f"{URL}?ordering=-id&cursor={cursor}").status_code == 400
    task = history[0][0]
    assert api_client.get(f"/api/v1/tasks/{task.pk}/executions?offset=3").status_code == 400
