"""A task's trigger_debounce: "run now" waits that long, and the triggers that come meanwhile join
the first trigger's run instead of starting runs of their own (issue 31, triggers)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from executions.models import Execution, ExecutionOrigin, ExecutionStatus
from tasks_app.models import AuditEntry
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def _task(client, **fields) -> str:
    response = client.post("/api/v1/tasks", {"runner": "noop", "interval": 3600, **fields}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _triggered(task_id: str):
    return Execution.objects.filter(task_id=task_id, origin=ExecutionOrigin.TRIGGER)


def test_triggers_within_the_window_join_the_first_run(api_client):
    task = _task(api_client, trigger_debounce="30s")
    before = timezone.now()

    first = api_client.post(f"/api/v1/tasks/{task}/trigger")
    second = api_client.post(f"/api/v1/tasks/{task}/trigger")
    third = api_client.post(f"/api/v1/tasks/{task}/trigger")

    assert first.status_code == 201 and second.status_code == third.status_code == 200
    assert first.json()["id"] == second.json()["id"] == third.json()["id"]
    run = _triggered(task).get()
    assert before + timedelta(seconds=29) < run.due_at < timezone.now() + timedelta(seconds=31)
    assert run.status == ExecutionStatus.SCHEDULED
    assert [entry.detail for entry in AuditEntry.objects.filter(action="trigger").order_by("id")] == [
        f"execution {run.pk}",
        f"joined {run.pk}",
        f"joined {run.pk}",
    ]
    assert api_client.get(f"/api/v1/tasks/{task}").json()["trigger_debounce"] == 30.0


def test_once_the_debounced_run_is_due_a_trigger_starts_another(api_client):
    task = _task(api_client, trigger_debounce="10s")
    first = api_client.post(f"/api/v1/tasks/{task}/trigger").json()["id"]
    # Its window has passed (the monitor may take it any moment): a trigger now is a new window.
    Execution.objects.filter(pk=first).update(due_at=timezone.now() - timedelta(seconds=1))

    second = api_client.post(f"/api/v1/tasks/{task}/trigger")

    assert second.status_code == 201 and second.json()["id"] != first
    assert _triggered(task).count() == 2


def test_without_a_debounce_every_trigger_runs_at_once(api_client):
    task = _task(api_client)

    ids = {api_client.post(f"/api/v1/tasks/{task}/trigger").json()["id"] for _ in range(3)}

    assert len(ids) == 3
    assert all(run.due_at <= timezone.now() for run in _triggered(task))


@pytest.mark.parametrize("value", ["0s", "500ms", "2d", "soon", -5])
def test_a_bad_debounce_is_a_400_on_the_field(api_client, value):
    response = api_client.post("/api/v1/tasks", {"runner": "noop", "trigger_debounce": value}, format="json")

    assert response.status_code == 400 and "trigger_debounce" in response.json()["errors"], response.content


def test_a_debounce_is_changed_and_cleared_by_patch_and_audited(api_client):
    task = _task(api_client, trigger_debounce="30s")

    assert api_client.patch(f"/api/v1/tasks/{task}", {"trigger_debounce": "2m"}, format="json").status_code == 200
    assert api_client.get(f"/api/v1/tasks/{task}").json()["trigger_debounce"] == 120.0
    assert api_client.patch(f"/api/v1/tasks/{task}", {"trigger_debounce": None}, format="json").status_code == 200
    assert api_client.get(f"/api/v1/tasks/{task}").json()["trigger_debounce"] is None
    changes = [entry.changes for entry in AuditEntry.objects.filter(action="update").order_by("id")]
    assert [change["trigger_debounce"] for change in changes] == [
        {"from": 30.0, "to": 120.0},
        {"from": 120.0, "to": None},
    ]


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_triggers_start_one_debounced_run(user):
    client = client_for(user)
    task = _task(client, trigger_debounce="1m")
    barrier = threading.Barrier(50)
    answers: list[tuple[int, int]] = []

    def trigger() -> None:
        try:
            mine = client_for(user)
            barrier.wait()
            response = mine.post(f"/api/v1/tasks/{task}/trigger")
            answers.append((response.status_code, response.json()["id"]))
        finally:
            connection.close()

    threads = [threading.Thread(target=trigger) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert len(answers) == 50
    assert sorted(code for code, _ in answers) == [200] * 49 + [201]
    assert len({run for _, run in answers}) == 1
    assert _triggered(task).count() == 1


def test_run_now_on_the_page_says_it_joined(client, user, api_client):
    task = _task(api_client, trigger_debounce="30s")
    client.force_login(user)

    first = client.post(f"/ui/tasks/{task}/run/", follow=True).content.decode()
    second = client.post(f"/ui/tasks/{task}/run/", follow=True).content.decode()

    run = _triggered(task).get()
    assert f"Execution {run.pk} created, due " in first and "(debounced)" in first
    assert f"Joined execution {run.pk}, the debounced run due " in second


def test_every_duration_of_a_task_reads_as_seconds(api_client):
    """max_age read "00:05:00" (the model field's own rendering) where every other duration of the
    API is seconds; a client sending back what it read would have sent a string it never wrote."""
    task = _task(api_client, max_age="5m", trigger_debounce="30s")

    shown = api_client.get(f"/api/v1/tasks/{task}").json()

    assert (shown["max_age"], shown["trigger_debounce"]) == (300.0, 30.0)
