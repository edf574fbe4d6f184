"""When a due run may start, in-process on the real database: the concurrency cap's wait and
release, the maximum age, and the 400s of settings that cannot be met."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from executions import transitions
from executions.models import Execution, ExecutionEvent, SkippedOccurrence
from executions.models import ExecutionStatus as S
from tests.factories import ExecutionFactory, TaskFactory

pytestmark = pytest.mark.django_db


def _pending(task, *, ago: float) -> Execution:
    return ExecutionFactory(
        task=task,
        scheduled_for=timezone.now() - timedelta(seconds=ago),
        status=S.PENDING,
        exclusive=True,
        message_id="m",
    )


def _claim(execution: Execution, worker: str = "w1") -> transitions.ExclusiveClaim:
    return transitions.execution_claim_exclusive(
        execution_id=execution.pk, attempt=execution.attempt, worker_id=worker, lease_seconds=60
    )


def test_a_run_over_the_cap_waits_with_its_reason_and_the_end_of_a_run_releases_it():
    task = TaskFactory(max_concurrency=1)
    first, second = _pending(task, ago=0.5), _pending(task, ago=0.2)
    assert _claim(first).outcome == "claimed"
    held = _claim(second, "w2")
    assert held.outcome == "waiting" and held.detail == "waiting: max_concurrency 1"
    second.refresh_from_db()
    assert second.status == S.SCHEDULED and second.waiting == "max_concurrency 1"
    assert second.due_at > timezone.now() + timedelta(seconds=20)  # a backstop, not a 1 s poll
    event = ExecutionEvent.objects.filter(execution=second).latest("id")
    assert (event.from_status, event.to_status, event.detail) == (
        S.PENDING,
        S.SCHEDULED,
        "waiting: max_concurrency 1 (1 running)",
    )
    assert transitions.executions_release_waiting(task_id=task.pk) == 0  # the slot is still taken
    assert transitions.execution_succeed(execution_id=first.pk, attempt=1, worker_id="w1", output="", max_chars=100)
    assert transitions.executions_release_waiting(task_id=task.pk) == 1
    second.refresh_from_db()
    assert second.due_at <= timezone.now()
    assert [d.execution_id for d in transitions.executions_take_due(limit=10, actor="m")] == [second.pk]
    claimed = _claim(Execution.objects.get(pk=second.pk), "w2")
    assert claimed.outcome == "claimed" and claimed.execution is not None
    assert claimed.execution.waiting == ""  # it says it waits only while it does


def test_a_later_run_does_not_overtake_an_earlier_waiter():
    task = TaskFactory(max_concurrency=2)
    running, early, late = _pending(task, ago=3), _pending(task, ago=2), _pending(task, ago=1)
    blocker = _pending(task, ago=2.5)
    assert _claim(running).outcome == "claimed"
    assert _claim(blocker).outcome == "claimed"
    assert _claim(early).outcome == "waiting"
    # A slot frees; the later run arrives first: it waits behind the earlier waiter.
    assert transitions.execution_succeed(execution_id=blocker.pk, attempt=1, worker_id="w1", output="", max_chars=9)
    assert _claim(late).outcome == "waiting"
    assert transitions.executions_release_waiting(task_id=task.pk) == 1
    assert Execution.objects.get(pk=early.pk).due_at < Execution.objects.get(pk=late.pk).due_at


def test_a_waiting_run_past_its_max_age_is_skipped_as_expired():
    task = TaskFactory(max_concurrency=1, max_age=timedelta(seconds=5), misfire_grace=timedelta(hours=1))
    assert _claim(_pending(task, ago=1)).outcome == "claimed"
    old = _pending(task, ago=10)
    outcome = _claim(old, "w2")
    assert outcome.outcome == "skipped" and outcome.detail.startswith("expired: not started 10."), outcome.detail
    old.refresh_from_db()
    assert old.status == S.CANCELLED and old.started_at is None
    skipped = SkippedOccurrence.objects.get(task=task, scheduled_for=old.scheduled_for)
    assert skipped.reason == "expired" and skipped.execution_id == old.pk


def test_the_fast_claim_refuses_an_expired_run_so_the_checked_claim_records_it():
    task = TaskFactory(max_age=timedelta(seconds=5), misfire_grace=timedelta(hours=1))
    old = ExecutionFactory(task=task, scheduled_for=timezone.now() - timedelta(seconds=8), status=S.PENDING)
    fresh = ExecutionFactory(task=task, scheduled_for=timezone.now() - timedelta(seconds=2), status=S.PENDING)
    assert not transitions.execution_claim_loaded(execution_id=old.pk, attempt=1, worker_id="w", lease_seconds=60)
    assert transitions.execution_claim_loaded(execution_id=fresh.pk, attempt=1, worker_id="w", lease_seconds=60)
    assert _claim(old).outcome == "skipped"
    assert SkippedOccurrence.objects.get(task=task).reason == "expired"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"interval": "1m", "jitter": "2m"}, "jitter"),
        ({"interval": "1m", "jitter": "30s", "max_age": "20s"}, "max_age"),
        ({"interval": "1m", "max_age": "0s"}, "max_age"),
        ({"interval": "1m", "misfire_policy": "sometimes"}, "misfire_policy"),
        ({"interval": "1m", "max_concurrency": 0}, "max_concurrency"),
    ],
)
def test_settings_that_cannot_be_met_are_a_400_on_the_field(api_client, body, field):
    response = api_client.post("/api/v1/tasks", {"runner": "noop", **body}, format="json")
    assert response.status_code == 400, response.data
    assert list(response.data["errors"]) == [field], response.data


def test_an_update_that_breaks_a_cross_field_rule_is_a_400(api_client):
    created = api_client.post("/api/v1/tasks", {"runner": "noop", "interval": "1m", "jitter": "30s"}, format="json")
    assert created.status_code == 201, created.data
    response = api_client.patch(f"/api/v1/tasks/{created.data['id']}", {"interval": "10s"}, format="json")
    assert response.status_code == 400 and list(response.data["errors"]) == ["jitter"], response.data


def test_a_waiting_run_says_why_in_the_api_the_why_answer_the_timeline_and_the_admin(api_client, user, admin_client):
    base = timezone.now() - timedelta(seconds=3)
    task = TaskFactory(owner=user, max_concurrency=1, start_at=base, interval=timedelta(seconds=1))

    def on_the_grid(k: int) -> Execution:
        return ExecutionFactory(
            task=task, scheduled_for=base + timedelta(seconds=k), status=S.PENDING, exclusive=True, message_id="m"
        )

    assert _claim(on_the_grid(1)).outcome == "claimed"
    waiting = on_the_grid(2)
    assert _claim(waiting, "w2").outcome == "waiting"
    detail = api_client.get(f"/api/v1/executions/{waiting.pk}")
    assert detail.status_code == 200 and detail.data["waiting"] == "max_concurrency 1", detail.data
    at = waiting.scheduled_for.isoformat()
    why = api_client.get(f"/api/v1/tasks/{task.pk}/why", {"at": at})
    assert why.status_code == 200, why.data
    assert "waiting: max_concurrency 1" in str(why.data), why.data
    window = {"from": (waiting.scheduled_for - timedelta(seconds=5)).isoformat(), "to": timezone.now().isoformat()}
    timeline = api_client.get(f"/api/v1/tasks/{task.pk}/occurrences", window)
    assert timeline.status_code == 200, timeline.data
    assert "waiting: max_concurrency 1" in str(timeline.data), timeline.data
    page = admin_client.get(f"/admin/executions/execution/{waiting.pk}/change/")
    assert page.status_code == 200 and "max_concurrency 1" in page.content.decode()
