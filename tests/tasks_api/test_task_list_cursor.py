"""The task list pages by cursor (tms_core.api.keyset), as every list that grows: walked page by page
in each order it offers, forwards and back, it shows every task once, in order, ties by id."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks_app.models import TaskStatus
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/tasks"


@pytest.fixture
def tasks(user):
    """Eleven tasks with ties in every ordering: names and priorities repeat, and three tasks will
    not run again (paused: no next run)."""
    start = timezone.now() + timedelta(hours=1)
    made = []
    for index in range(11):
        made.append(
            TaskFactory(
                owner=user,
                name=f"report {index % 4}",
                priority=index % 3,
                start_at=start + timedelta(minutes=index % 5),
                status=TaskStatus.PAUSED if index in (2, 5, 8) else TaskStatus.ACTIVE,
            )
        )
    TaskFactory()  # someone else's
    return made


def _walk(client, url: str) -> tuple[list[str], list[dict]]:
    ids, pages = [], []
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.content
        page = response.json()
        assert set(page) == {"next", "previous", "results"}
        pages.append(page)
        ids += [task["id"] for task in page["results"]]
        url = page["next"]
    return ids, pages


def _expected(tasks, ordering: str) -> list[str]:
    name = ordering.lstrip("-")
    reverse = ordering.startswith("-")

    def value(task):
        if name == "next_run_at":
            return None if task.status == TaskStatus.PAUSED else task.next_run_at
        return getattr(task, name)

    present = [task for task in tasks if value(task) is not None]
    absent = [task for task in tasks if value(task) is None]
    ordered = sorted(present, key=lambda task: (value(task), task.pk), reverse=reverse)
    # Tasks with no next run come after the others, by id in the list's direction.
    ordered += sorted(absent, key=lambda task: task.pk, reverse=reverse)
    return [str(task.pk) for task in ordered]


@pytest.mark.parametrize(
    "ordering",
    ["-created_at", "created_at", "name", "-name", "priority", "-priority", "next_run_at", "-next_run_at"],
)
def test_every_order_walks_every_task_once_in_order(api_client, tasks, ordering):
    ids, pages = _walk(api_client, f"{URL}?limit=3&ordering={ordering}")

    assert ids == _expected(tasks, ordering)
    assert [len(page["results"]) for page in pages] == [3, 3, 3, 2]
    # Backwards from the last page gives the same pages, reversed.
    back, url = [], pages[-1]["previous"]
    while url:
        page = api_client.get(url).json()
        back = [task["id"] for task in page["results"]] + back
        url = page["previous"]
    assert back == ids[:9]


def test_the_default_is_newest_first(api_client, tasks):
    ids, _ = _walk(api_client, f"{URL}?limit=4")

    assert ids == _expected(tasks, "-created_at")


def test_a_task_created_while_paging_never_repeats_or_hides_one_that_was_there(api_client, user, tasks):
    first = api_client.get(f"{URL}?limit=5").json()
    TaskFactory(owner=user, name="newer")  # newest: before the first page, not in the walk

    rest, _ = _walk(api_client, first["next"])

    assert [task["id"] for task in first["results"]] + rest == _expected(tasks, "-created_at")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("ordering=name,priority", "ordering"),
        ("ordering=owner", "ordering"),
        ("offset=5", "offset"),
        ("cursor=not-a-cursor", "cursor"),
    ],
)
def test_what_cannot_be_a_page_is_a_400_on_its_parameter(api_client, tasks, query, field):
    response = api_client.get(f"{URL}?{query}")

    assert response.status_code == 400 and list(response.json()["errors"]) == [field], response.content


def test_a_cursor_of_another_order_is_refused(api_client, tasks):
    cursor = api_client.get(f"{URL}?limit=2&ordering=name").json()["next"].split("cursor=")[1].split("&")[0]

    response = api_client.get(f"{URL}?ordering=priority&cursor={cursor}")

    assert response.status_code == 400 and list(response.json()["errors"]) == ["cursor"]
