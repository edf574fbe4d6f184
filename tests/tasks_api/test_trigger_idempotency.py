"""POST /api/v1/tasks/{id}/trigger with an Idempotency-Key: a trigger sent again (a client's retry,
an event delivered twice) answers the first run and starts no other."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from executions.models import Execution, ExecutionOrigin
from tests.conftest import client_for
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


def _url(task) -> str:
    return f"/api/v1/tasks/{task.pk}/trigger"


def test_a_repeated_trigger_with_one_key_answers_the_first_run(api_client, user):
    task = TaskFactory(owner=user)

    first = api_client.post(_url(task), HTTP_IDEMPOTENCY_KEY="deploy-4711")
    again = api_client.post(_url(task), HTTP_IDEMPOTENCY_KEY="deploy-4711")

    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Location"] == first.headers["Location"] == f"/api/v1/executions/{first.json()['id']}"
    assert "Idempotent-Replayed" not in first.headers and again.headers["Idempotent-Replayed"] == "true"
    assert Execution.objects.filter(task=task, origin=ExecutionOrigin.TRIGGER).count() == 1


def test_triggers_without_a_key_or_with_other_keys_each_run(api_client, user):
    task = TaskFactory(owner=user)

    for key in (None, None, "a", "b"):
        extra = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
        assert api_client.post(_url(task), **extra).status_code == 201

    assert Execution.objects.filter(task=task, origin=ExecutionOrigin.TRIGGER).count() == 4


def test_one_key_for_two_tasks_is_a_422_and_runs_nothing_more(api_client, user):
    first, second = TaskFactory(owner=user), TaskFactory(owner=user)
    api_client.post(_url(first), HTTP_IDEMPOTENCY_KEY="k")

    response = api_client.post(_url(second), HTTP_IDEMPOTENCY_KEY="k")

    assert response.status_code == 422 and response.json()["type"] == "idempotency_key_reused"
    assert Execution.objects.filter(task=second).count() == 0


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_triggers_with_one_key_start_one_run(user):
    """Fifty clients deliver the same event at once: the unique key index makes all but one wait for
    the first transaction, then replay its answer."""
    task = TaskFactory(owner=user)
    barrier = threading.Barrier(50)
    results: list[tuple[int, int, str | None]] = []

    def post() -> None:
        try:
            client = client_for(user)
            barrier.wait()
            response = client.post(_url(task), HTTP_IDEMPOTENCY_KEY="event-1")
            results.append((response.status_code, response.json()["id"], response.headers.get("Idempotent-Replayed")))
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert len(results) == 50
    assert {code for code, _, _ in results} == {201}
    assert len({run for _, run, _ in results}) == 1
    assert sorted(replayed or "" for _, _, replayed in results) == [""] + ["true"] * 49
    assert Execution.objects.filter(task=task, origin=ExecutionOrigin.TRIGGER).count() == 1
