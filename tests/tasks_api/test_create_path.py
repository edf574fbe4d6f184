"""Creating tasks, one or many (issue 33): what the write path does per task and per batch, counted.

The bulk path writes the tasks, their audit entries and their executions as one INSERT each
whatever the batch size, checks the owner's task quota once per batch under the owner's lock,
and hands back tasks that the API renders without reading them again.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import DataError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from executions.models import Execution
from tasks_api import creation
from tasks_api.creation import task_bulk_create
from tasks_app.models import AuditAction, AuditEntry, Task
from tasks_app.quotas import owner_quota_set
from tasks_app.secrets import ENCRYPTED, MASK
from tms_core import bulk
from tms_core.errors import InvalidInput
from tms_core.together import execute_soon

URL = "/api/v1/tasks"
SECRET = "Bearer sk-live-bulk-0123456789"


def _specs(count: int, **fields):
    return [{"runner": "noop", "name": f"bulk {index}", **fields} for index in range(count)]


def test_a_bulk_create_writes_one_audit_entry_per_task_with_secrets_masked(user):
    specs = [
        {
            "runner": "http",
            "name": f"call {index}",
            "config": {"url": "https://example.com", "headers": {"Authorization": SECRET}},
        }
        for index in range(3)
    ]
    tasks = task_bulk_create(owner=user, specs=specs)
    entries = AuditEntry.objects.filter(action=AuditAction.CREATE, object_type="task")
    assert sorted(entry.task_id for entry in entries) == sorted(task.pk for task in tasks)
    for entry in entries:
        assert entry.owner_id == user.pk and entry.source == "system" and entry.at is not None
        assert entry.changes["config"] == {
            "from": None,
            "to": {"url": "https://example.com", "headers": {"Authorization": MASK}},
        }
        assert (
            entry.changes["name"]["to"].startswith("call ") and entry.changes["status"]["to"] == "COMPLETED"
        )  # one-shot, its run created
        assert entry.changes["timeout"]["to"] == Task._meta.get_field("timeout").get_default().total_seconds()
        assert "end_at" not in entry.changes  # a field left empty is not listed
        assert SECRET not in str(entry.changes)
    stored = Task.objects.filter(pk__in=[task.pk for task in tasks]).values_list("config", flat=True)
    assert all(set(config["headers"]["Authorization"]) == {ENCRYPTED} for config in stored)


def test_a_bulk_create_stores_what_a_single_create_stores(user):
    """The column-array insert keeps every value as the model would save it."""
    start = timezone.now() + timedelta(hours=3)
    fields = {
        "start_at": start,
        "interval": timedelta(minutes=5, microseconds=250),
        "jitter": timedelta(seconds=3),
        "max_runs": 7,
        "tracing_id": 'quote " and back\\slash',
        "keep_for": timedelta(days=2),
        "secret_fields": [],
        "expose_metrics": True,
    }
    (task,) = task_bulk_create(owner=user, specs=_specs(1, **fields))
    stored = Task.objects.get(pk=task.pk)
    for name, value in fields.items():
        assert getattr(stored, name) == value, name
    assert stored.created_at == task.created_at and stored.updated_at == task.updated_at
    assert stored.next_run_at == task.next_run_at == start


@pytest.mark.parametrize("copy_from", [1, 10**9], ids=["copy", "insert"])
def test_a_bulk_create_by_copy_stores_what_the_insert_stores(user, monkeypatch, copy_from):
    """From bulk.COPY_FROM_ROWS rows on, tasks and audit entries go in by COPY: every value (text
    with tabs, newlines, backslashes and quotes, JSON, durations, NULLs) reads back as given."""
    monkeypatch.setattr(bulk, "COPY_FROM_ROWS", copy_from)
    odd = 'tab\there, line\nbreak\r, back\\slash \\N, "quoted", ünïcödé'
    fields = {
        "start_at": timezone.now() + timedelta(hours=3),
        "interval": timedelta(days=1, minutes=5, microseconds=250),
        "keep_for": timedelta(days=2),
        "tracing_id": odd[:60],
        "expose_metrics": True,
    }
    config = {"url": "https://example.com/a", "headers": {"Authorization": SECRET}, "json": {"odd": odd}}
    specs = [{"runner": "http", "name": f"{odd} {index}", "config": config, **fields} for index in range(3)]
    with CaptureQueriesContext(connection) as queries:
        tasks = task_bulk_create(owner=user, specs=specs)
    inserted = any('INTO "tasks_app_task"' in query["sql"] for query in queries.captured_queries)
    assert inserted == (copy_from > len(specs))  # a COPY is not among the statements Django logs
    stored = {task.pk: task for task in Task.objects.filter(pk__in=[task.pk for task in tasks])}
    for task in tasks:
        row = stored[task.pk]
        for field in Task._meta.concrete_fields:
            if field.attname != "config":  # sealed: each secret's ciphertext differs
                assert getattr(row, field.attname) == getattr(task, field.attname), field.attname
        assert row.name.startswith(odd) and row.end_at is None and row.calendar_id is None
    entries = AuditEntry.objects.filter(task_id__in=stored, action=AuditAction.CREATE)
    assert len(entries) == 3
    for entry in entries:
        assert entry.changes["name"]["to"].startswith(odd) and entry.remote_addr is None and entry.detail == ""
        assert entry.changes["config"]["to"] == {**config, "headers": {"Authorization": MASK}}
        assert entry.changes["interval"]["to"] == fields["interval"].total_seconds()


def test_a_value_checked_once_per_batch_still_fails_every_spec_that_gives_it(user):
    """A batch checks each distinct value of a field once: a bad one is refused at every position
    that gives it, the good ones pass, and the batch writes nothing."""
    long_name = "n" * 300
    specs = [*_specs(1, name=long_name), *_specs(2, start_at=None), *_specs(1, name=long_name)]
    with pytest.raises(InvalidInput) as refused:
        task_bulk_create(owner=user, specs=specs)
    assert sorted(refused.value.errors) == ["0", "3"]
    assert all("name" in refused.value.errors[index] for index in ("0", "3"))
    assert not Task.objects.exists() and not AuditEntry.objects.exists()
    assert len(task_bulk_create(owner=user, specs=specs[1:3])) == 2


def test_a_bulk_create_is_a_fixed_number_of_statements_whatever_its_size(user):
    owner_quota_set(owner=user, max_tasks=1000)  # a quota to check (its row exists from here on)

    def statements(count: int) -> int:
        with CaptureQueriesContext(connection) as queries:
            task_bulk_create(owner=user, specs=_specs(count, start_at=None))  # run now: executions too
        return len(queries.captured_queries)

    assert statements(1) == statements(50)
    assert Execution.objects.count() == 51


def test_the_task_quota_holds_across_a_bulk_batch(user):
    owner_quota_set(owner=user, max_tasks=5)
    task_bulk_create(owner=user, specs=_specs(3))
    with pytest.raises(InvalidInput) as refused:
        task_bulk_create(owner=user, specs=_specs(3))
    assert "quota: at most 5 tasks" in str(refused.value.errors)
    assert Task.objects.filter(owner=user).count() == 3, "a refused batch writes nothing"
    assert AuditEntry.objects.filter(owner=user).count() == 3
    task_bulk_create(owner=user, specs=_specs(2))
    assert Task.objects.filter(owner=user).count() == 5


@pytest.mark.django_db(transaction=True)
def test_concurrent_bulk_creates_never_pass_the_task_quota_together(user):
    """Four batches of 3 at once against a quota of 7: the owner's quota lock makes them take
    turns, so two pass and two are refused, and never 8 tasks or more."""
    owner_quota_set(owner=user, max_tasks=7)
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def create() -> None:
        try:
            barrier.wait()
            task_bulk_create(owner=user, specs=_specs(3))
            outcomes.append("created")
        except InvalidInput:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["created", "created", "refused", "refused"]
    assert Task.objects.filter(owner=user).count() == 6


@pytest.mark.parametrize(
    "body",
    [
        {"runner": "noop"},  # run now: its execution exists when the answer comes
        {"runner": "noop", "start_at": "2099-01-01T00:00:00Z"},  # beyond the horizon: none yet
        {"runner": "noop", "interval": 60},
        {"runner": "noop", "start_at": "2000-01-01T00:00:00Z", "interval": 3600, "misfire_policy": "run_once"},
    ],
)
def test_a_created_task_answers_as_it_reads_back_without_reading_it(api_client, user, body):
    owner_quota_set(owner=user, max_tasks=10)  # a task quota to check, its row there already
    with CaptureQueriesContext(connection) as queries:
        created = api_client.post(URL, body, format="json")
    assert created.status_code == 201, created.content
    # The test client is authenticated already, and the test's transaction adds savepoints.
    # What is left is the create itself: the clock; the team (the owner's personal one); the quota
    # read, lock and count; the task, audit, version 1 and (for a missed fire time)
    # skipped-occurrence inserts; the executions and the wake-up. No read after the write.
    statements = [query["sql"] for query in queries.captured_queries if "SAVEPOINT" not in query["sql"]]
    assert len(statements) <= 11, "\n".join(sql[:70] for sql in statements)
    assert not [query for query in queries.captured_queries if query["sql"].startswith("SELECT (SELECT")]
    read = api_client.get(f"{URL}/{created.json()['id']}").json()
    for name in ("state", "next_occurrence_at", "status", "runs_materialised", "limits"):
        assert created.json()[name] == read[name], name
    # A run due already (and not started) is due now: each answer gives its own read time then
    # (issue 44: "Next run" is never a time already past), so the read's is the later one.
    if created.json()["next_run_at"] != read["next_run_at"]:
        assert parse_datetime(created.json()["next_run_at"]) < parse_datetime(read["next_run_at"]) <= timezone.now()
    first = Execution.objects.filter(task_id=read["id"]).order_by("scheduled_for", "id").first()
    assert created.json()["first_execution"] == (first.pk if first else None)


def test_a_create_sends_its_writes_in_one_round_trip(api_client, user):
    """The task, its audit entry, the monitors' wake-up and its execution with its event go to
    PostgreSQL in one statement text (a round trip each cost about a millisecond on a loaded
    machine). Its version 1 is not written yet: it is written from the audit entry when first
    read (tasks_app.versions), and reads the same."""
    owner_quota_set(owner=user, max_tasks=10)  # its row there already, as for any owner after a first create
    with CaptureQueriesContext(connection) as queries:
        created = api_client.post(URL, {"runner": "noop", "name": "one trip"}, format="json")
    assert created.status_code == 201, created.content
    writes = [query["sql"] for query in queries.captured_queries if "INSERT" in query["sql"]]
    assert len(writes) == 1, "\n".join(sql[:70] for sql in writes)
    for part in ('INTO "tasks_app_task"', 'INTO "tasks_app_auditentry"', "NOTIFY"):
        assert part in writes[0], part
    assert "INSERT INTO executions_execution" in writes[0]
    assert 'INTO "tasks_app_taskversion"' not in writes[0]
    task = Task.objects.get(pk=created.json()["id"])
    assert AuditEntry.objects.filter(task_id=task.pk, action=AuditAction.CREATE).count() == 1
    assert task.versions.count() == 0
    listed = api_client.get(f"/api/v1/tasks/{task.pk}/versions").json()["results"]
    assert [version["number"] for version in listed] == [1]
    assert task.versions.count() == 1
    assert Execution.objects.filter(task=task).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_single_create_outside_a_transaction_is_two_statements_all_or_nothing(api_client, user, monkeypatch):
    """With no quota to lock (an unlimited team), a create outside any transaction reads the time,
    team and quota in one statement and sends its writes in one more, which PostgreSQL runs as one
    transaction of their own: no BEGIN, no COMMIT, and a failure of any part writes nothing."""
    owner_quota_set(owner=user, max_tasks=0)
    with CaptureQueriesContext(connection) as queries:
        created = api_client.post(URL, {"runner": "noop", "name": "two trips"}, format="json")
    assert created.status_code == 201, created.content
    assert len(queries.captured_queries) == 2, [query["sql"][:60] for query in queries.captured_queries]
    task = Task.objects.get(pk=created.json()["id"])
    assert AuditEntry.objects.filter(task_id=task.pk, action=AuditAction.CREATE).count() == 1
    assert Execution.objects.filter(task=task).count() == 1

    # The wake-up goes with the writes: one that fails takes the task, its entry and its run with it.
    monkeypatch.setattr(creation, "notify_due", lambda: execute_soon("SELECT 1 / 0"))
    with pytest.raises(DataError):
        task_bulk_create(owner=user, specs=_specs(1, start_at=None))
    assert Task.objects.count() == 1 and AuditEntry.objects.filter(action=AuditAction.CREATE).count() == 1
    assert Execution.objects.count() == 1
