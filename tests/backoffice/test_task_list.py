"""The task list pages by keyset on ``(created_at, id)``, newest first ("Older" continues after
the last row shown): every task once, ties on the time broken by id, the search and the status
filter carried to the next page, no COUNT of the tasks and the same number of queries on every
page (Django's paginator counted every matching task for "page N of M": 19-73 ms of PostgreSQL
per page at 100,000 tasks)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tasks_api.creation import task_create
from tasks_app.models import Task, TaskStatus
from tests.backoffice.helpers import walk_pages
from tms_core.api.keyset import Position, encode_cursor

pytestmark = pytest.mark.django_db


@pytest.fixture
def many_tasks(user, other_user):
    """Two pages and a bit of alice's tasks, half named "alpha", a third paused, several created
    at the same instant (ties on the key); one of another owner's, which she never sees."""
    now = timezone.now().replace(microsecond=0)
    tasks = []
    for n in range(2 * 50 + 7):
        task = task_create(
            owner=user, runner="noop", name=f"{'alpha' if n % 2 else 'beta'} {n}", interval=timedelta(hours=1)
        )
        created = now - timedelta(minutes=n // 4)
        status = TaskStatus.PAUSED if n % 3 == 0 else task.status
        Task.objects.filter(pk=task.pk).update(created_at=created, status=status)
        tasks.append(task)
    task_create(owner=other_user, runner="noop", name="alpha of bob", interval=timedelta(hours=1))
    return tasks


def _walk(client, path):
    return walk_pages(client, path, "task")


def _newest_first(queryset):
    return list(queryset.order_by("-created_at", "-id").values_list("pk", flat=True))


def test_pages_show_every_task_once_newest_first_without_counting(alice_client, user, many_tasks):
    pages, queries = _walk(alice_client, "/ui/tasks/")
    assert [len(page) for page in pages] == [50, 50, 7]
    assert [pk for page in pages for pk in page] == _newest_first(Task.objects.filter(owner=user))
    assert len({len(q) for q in queries}) == 1  # every page the same work, the last one too
    assert not [sql for q in queries for sql in q if "COUNT(" in sql.upper()]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("?q=alpha", lambda tasks: tasks.filter(name__icontains="alpha")),
        ("?status=PAUSED", lambda tasks: tasks.filter(status=TaskStatus.PAUSED)),
        ("?q=alpha&status=PAUSED", lambda tasks: tasks.filter(name__icontains="alpha", status=TaskStatus.PAUSED)),
    ],
)
def test_the_search_and_the_status_filter_page_by_keyset_too(alice_client, user, many_tasks, query, expected):
    pages, _ = _walk(alice_client, f"/ui/tasks/{query}")
    assert [pk for page in pages for pk in page] == _newest_first(expected(Task.objects.filter(owner=user)))
    assert len(pages) >= 1


def test_a_forged_cursor_is_a_message_and_the_first_page(alice_client, many_tasks):
    response = alice_client.get("/ui/tasks/", {"cursor": encode_cursor(Position(0, timezone.now(), "not-a-uuid"))})
    assert response.status_code == 200
    assert "Invalid cursor" in response.content.decode()
    assert len(response.context["rows"]) == 50


def test_the_search_can_read_the_names_trigram_index_and_the_runners(many_tasks):
    """``?q=`` is ``UPPER(name) LIKE '%Q%' OR runner = q``: both halves have an index (the
    trigram one on PostgreSQL, migration 0017), so a rare name is not a scan of every task. The
    planner scans a table this small: told not to, it shows what it can use."""
    from django.db.models import Q

    # The search's condition alone (the list adds "not deleted", which this small a table answers
    # from the partial index of live tasks instead).
    query = Task.objects.filter(Q(name__icontains="alpha 9") | Q(runner="alpha 9"))
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        plan = query.explain()
    assert "task_name_trgm_idx" in plan and "task_runner_idx" in plan


def test_the_delivery_log_pages_by_the_same_keyset(alice_client, user):
    """The notifications page's delivery log, newest first, in pages of the API's cursors with its
    filter kept (it had a ``?before=<id>`` of its own)."""
    from backoffice.notification_views import LOG_PAGE
    from notifications.models import Channel, Delivery, DeliveryStatus
    from tests.backoffice.helpers import walk_pages

    channel = Channel.objects.create(
        owner=user, team=user.personal_team, name="hook", kind="webhook", target="https://example.invalid/h"
    )
    for n in range(LOG_PAGE + 9):
        status = DeliveryStatus.FAILED if n % 2 else DeliveryStatus.DELIVERED
        Delivery.objects.create(channel=channel, event="failure", status=status, payload={}, idempotency_key=f"k{n}")
    newest_first = Delivery.objects.filter(channel=channel).order_by("-id")

    def walk(path):
        pages, _ = walk_pages(alice_client, path, None, rows="deliveries", base="/ui/notifications/")
        return [pk for page in pages for pk in page]

    assert walk("/ui/notifications/") == list(newest_first.values_list("pk", flat=True))
    failed = newest_first.filter(status=DeliveryStatus.FAILED).values_list("pk", flat=True)
    assert walk(f"/ui/notifications/?status=failed&channel={channel.pk}") == list(failed)


def test_a_small_teams_list_is_read_along_its_teams_index_among_many_tasks(alice_client, user, other_user):
    """At 100,000 tasks, the list of a team holding a tenth of them, its oldest, took 190 ms of
    PostgreSQL: the team ids were a subquery (an InitPlan), so the planner assumed every task was
    the team's and walked the newest-first index of all tasks, filtering 90,000 rows away for 51.
    The ids are values now: the planner sees the team is small and reads task_team_live_idx."""
    from django.test.utils import CaptureQueriesContext

    from tooling.harness.fill import insert_tasks

    mine = [task_create(owner=user, runner="noop", name=f"mine {n}", interval=timedelta(hours=1)) for n in range(3)]
    Task.objects.filter(pk__in=[task.pk for task in mine]).update(created_at=timezone.now() - timedelta(days=30))
    with connection.cursor() as cursor:
        columns = {"start_at": "now() + interval '1 day'", "interval": "interval '1 hour'", "next_run_at": "now()"}
        insert_tasks(cursor=cursor, owner_id=other_user.pk, count=5000, columns=columns)
        cursor.execute(f"ANALYZE {Task._meta.db_table}")
    with CaptureQueriesContext(connection) as queries:
        page = alice_client.get("/ui/tasks/")
    assert sorted(row["task"].name for row in page.context["rows"]) == ["mine 0", "mine 1", "mine 2"]
    newest_first = 'ORDER BY "tasks_app_task"."created_at" DESC'
    (listing,) = [q["sql"] for q in queries if 'FROM "tasks_app_task"' in q["sql"] and newest_first in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {listing}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "task_team_live_idx" in plan and "task_created_idx" not in plan, plan
