"""Sleep and approval steps (issue 48, item 4): a ``sleep`` step with ``for``/``until`` holds no
worker and is polled once, at its wake-up time; an ``approval`` step waits for an operator's
decision (API), exactly one of two concurrent decisions wins, and the task's timeout ends an
undecided wait as ``on_timeout`` says.

Runs are started and polled through the worker's services (``execution_run``, ``execution_resume``)
as a worker would, without a worker process."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from executions import transitions, worker_services
from executions.approvals import approval_decide
from executions.models import Approval, Execution
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_app.models import AuditEntry
from tasks_app.teams.services import member_set, team_create
from tms_core.errors import ConflictError

pytestmark = pytest.mark.django_db

W = "w:waits:1"
LATER = datetime(2099, 1, 1, tzinfo=UTC)


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _started(task: Any, run_input: dict | None = None, *, expect: str = "polling") -> Execution:
    """Trigger ``task``, take it due and start it as a worker does."""
    execution_id = transitions.execution_trigger(task_id=task.pk, actor="test", run_input=run_input)
    assert execution_id is not None
    transitions.executions_take_due(limit=100, actor="monitor")
    assert worker_services.execution_run(execution_id=execution_id, attempt=1, worker_id=W) == expect
    return Execution.objects.get(pk=execution_id)


def _poll_now(execution: Execution, **handle: Any) -> str:
    """Make the run's poll due now (with ``handle`` laid over its run handle) and poll it."""
    Execution.objects.filter(pk=execution.pk).update(
        next_poll_at=timezone.now(), run_handle={**execution.run_handle, **handle}
    )
    return worker_services.execution_resume(execution_id=execution.pk, attempt=execution.attempt, worker_id=W)


def _seconds_to_poll(execution_id: int) -> float:
    return (Execution.objects.get(pk=execution_id).next_poll_at - timezone.now()).total_seconds()


# -- sleep ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({}, "for"),
        ({"for": "10m", "until": "2030-01-01T00:00:00Z"}, "until"),
        ({"for": "ten minutes"}, "for"),
        ({"until": "tomorrow"}, "until"),
        ({"until": "2030-01-01T00:00:00"}, "until"),  # no offset
        ({"until": "$.send at"}, "until"),
        ({"for": "1m", "fail": True}, "fail"),
    ],
)
def test_sleep_bad_config_is_a_400_on_its_field(api_client, config, field):
    response = api_client.post(
        "/api/v1/tasks", {"runner": "sleep", "config": config, "start_at": LATER.isoformat()}, format="json"
    )
    assert response.status_code == 400, response.content
    assert set(response.json()["errors"]["config"]) == {field}, response.json()


def test_a_pause_not_shorter_than_the_timeout_is_a_400_on_for(api_client):
    body = {"runner": "sleep", "config": {"for": "2h"}, "timeout": "1h", "start_at": LATER.isoformat()}
    response = api_client.post("/api/v1/tasks", body, format="json")
    assert response.status_code == 400, response.content
    assert "timeout" in response.json()["errors"]["config"]["for"][0]
    created = api_client.post("/api/v1/tasks", body | {"timeout": "3h"}, format="json")
    assert created.status_code == 201, created.content
    shortened = api_client.patch(f"/api/v1/tasks/{created.json()['id']}", {"timeout": "1h"}, format="json")
    assert shortened.status_code == 400 and set(shortened.json()["errors"]["config"]) == {"for"}


def test_sleep_for_holds_no_worker_and_is_polled_at_its_wake_up_time(user):
    task = task_create(owner=user, runner="sleep", config={"for": "1h"}, timeout=timedelta(hours=2), start_at=LATER)
    execution = _started(task, {"order": 7})
    assert (execution.status, execution.lease_owner) == (S.RUNNING, "")
    assert 3590 < _seconds_to_poll(execution.pk) <= 3600, "due at the wake-up time, not by the backoff"
    # A poll before then (a redelivered message) asks again for the wake-up time, not the backoff's.
    assert _poll_now(execution) == "polling"
    assert 3590 < _seconds_to_poll(execution.pk) <= 3600
    execution.refresh_from_db()
    # The wake-up time has come: the run ends and passes its input on.
    assert _poll_now(execution, wake_at=time.time() - 1) == "finished"
    execution.refresh_from_db()
    assert execution.status == S.SUCCEEDED
    output = json.loads(execution.output)
    assert output["order"] == 7 and set(output["slept"]) == {"from", "until"}


def test_a_sleep_past_the_timeout_is_polled_at_the_timeout(user):
    task = task_create(owner=user, runner="sleep", config={"for": "1d"}, timeout=timedelta(minutes=10), start_at=LATER)
    execution = _started(task)
    assert 590 < _seconds_to_poll(execution.pk) <= 601


def test_sleep_until_a_time_from_the_input(user):
    task = task_create(
        owner=user, runner="sleep", config={"until": "$.send_at"}, timeout=timedelta(days=2), start_at=LATER
    )
    send_at = timezone.now() + timedelta(days=1)
    execution = _started(task, {"send_at": send_at.isoformat()})
    assert 86390 < _seconds_to_poll(execution.pk) <= 86400
    # A time already past: the run ends at its start.
    done = _started(task, {"send_at": "2020-01-01T00:00:00+00:00"}, expect="finished")
    assert Execution.objects.get(pk=done.pk).status == S.SUCCEEDED
    # No time in the input: failed, not retried.
    bad = _started(task, {"other": 1}, expect="finished")
    bad.refresh_from_db()
    assert (bad.status, bad.attempt) == (S.FAILED, 1)
    assert "$.send_at" in bad.error


# -- approval ------------------------------------------------------------------------------------


@pytest.fixture
def gate(user, other_user, django_user_model):
    """A team where alice is admin, bob an operator, carol a viewer; an approval task in it."""
    team = team_create(creator=user, name="Deploys")
    member_set(team=team, username=other_user.username, role="operator")
    carol = django_user_model.objects.create_user(username="carol", password="carol-password")
    member_set(team=team, username="carol", role="viewer")
    task = task_create(
        owner=user,
        team=team,
        runner="approval",
        config={"message": "Deploy to production?"},
        timeout=timedelta(hours=1),
        max_attempts=3,
        start_at=LATER,
    )
    return {"team": team, "task": task, "carol": carol}


def test_an_operator_approves_once_and_the_run_ends_with_who_and_when(gate, other_user):
    execution = _started(gate["task"], {"version": "1.2"})
    assert 3590 - 2 < _seconds_to_poll(execution.pk) <= 3600, "polled once, at the deadline"
    bob = _client(other_user)
    answer = bob.post(f"/api/v1/executions/{execution.pk}/approve", {"comment": "ship it"}, format="json")
    assert answer.status_code == 200, answer.content
    assert (answer.json()["decision"], answer.json()["decided_by"]) == ("approved", "bob")
    execution.refresh_from_db()
    assert execution.status == S.SUCCEEDED
    output = json.loads(execution.output)
    assert output | {"at": None} == {
        "approved": True,
        "by": "bob",
        "at": None,
        "comment": "ship it",
        "input": {"version": "1.2"},
    }
    assert Approval.objects.get(execution_id=execution.pk).decided_by == other_user
    assert execution.events.get(to_status=S.SUCCEEDED).actor == "user:bob", "the timeline names the approver"
    (entry,) = AuditEntry.objects.filter(object_type="execution", object_id=str(execution.pk), action="approve")
    assert entry.actor_name == "bob"
    # Decided already: 409, nothing more recorded.
    again = bob.post(f"/api/v1/executions/{execution.pk}/reject", {}, format="json")
    assert again.status_code == 409
    assert Approval.objects.filter(execution_id=execution.pk).count() == 1


def test_a_rejection_fails_the_run_for_good(gate, user):
    execution = _started(gate["task"])
    answer = _client(user).post(f"/api/v1/executions/{execution.pk}/reject", {"comment": "not today"}, format="json")
    assert answer.status_code == 200, answer.content
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (S.FAILED, 1), "not retried"
    assert execution.error == "approval rejected by alice: not today"
    assert json.loads(execution.output)["approved"] is False


def test_who_may_decide(gate, django_user_model, user):
    execution = _started(gate["task"])
    url = f"/api/v1/executions/{execution.pk}/approve"
    assert _client(gate["carol"]).post(url, {}, format="json").status_code == 403  # a viewer
    stranger = django_user_model.objects.create_user(username="dave", password="dave-password")
    assert _client(stranger).post(url, {}, format="json").status_code == 404  # another team's
    assert _client(user).post(url, {"comment": 5}, format="json").status_code == 400
    # Approvers named by username: an operator not among them is refused.
    task = task_create(
        owner=user, team=gate["team"], runner="approval", config={"approvers": ["alice"]}, start_at=LATER
    )
    named = _started(task)
    refused = _client(django_user_model.objects.get(username="bob")).post(
        f"/api/v1/executions/{named.pk}/approve", {}, format="json"
    )
    assert refused.status_code == 403 and "alice" in refused.json()["detail"]
    assert Execution.objects.get(pk=named.pk).status == S.RUNNING
    # Not an approval step: 409.
    other = task_create(owner=user, team=gate["team"], runner="noop", start_at=LATER)
    ended = _started(other, expect="finished")
    assert _client(user).post(f"/api/v1/executions/{ended.pk}/approve", {}, format="json").status_code == 409


def test_approval_bad_config_is_a_400_on_its_field(api_client):
    for config, field in [({"approvers": "viewer"}, "approvers"), ({"on_timeout": "maybe"}, "on_timeout")]:
        response = api_client.post(
            "/api/v1/tasks", {"runner": "approval", "config": config, "start_at": LATER.isoformat()}, format="json"
        )
        assert response.status_code == 400, response.content
        assert set(response.json()["errors"]["config"]) == {field}


@pytest.mark.parametrize(("on_timeout", "status"), [("reject", S.FAILED), ("approve", S.SUCCEEDED)])
def test_an_undecided_wait_ends_at_the_timeout_as_on_timeout_says(user, on_timeout, status):
    task = task_create(
        owner=user,
        runner="approval",
        config={"on_timeout": on_timeout},
        timeout=timedelta(hours=1),
        max_attempts=3,
        start_at=LATER,
    )
    execution = _started(task)
    assert _poll_now(execution) == "polling", "before its deadline, the poll waits on"
    execution.refresh_from_db()
    assert _poll_now(execution, deadline=time.time() - 1) == "finished"
    execution.refresh_from_db()
    assert (execution.status, execution.attempt) == (status, 1)
    assert json.loads(execution.output)["timed_out"] is True


def test_pending_approvals_are_listed_per_team_in_constant_queries(gate, user, django_user_model):
    client = _client(user)
    first = _started(gate["task"])
    with CaptureQueriesContext(connection) as one:
        listed = client.get("/api/v1/approvals?state=pending")
    assert listed.status_code == 200
    assert [item["execution"] for item in listed.json()["results"]] == [first.pk]
    assert listed.json()["results"][0]["message"] == "Deploy to production?"
    _started(gate["task"])
    _started(gate["task"])
    with CaptureQueriesContext(connection) as three:
        listed = client.get("/api/v1/approvals")
    assert len(listed.json()["results"]) == 3
    assert len(three) == len(one)
    approval_decide(user=user, execution_id=first.pk, approve=True)
    assert len(client.get("/api/v1/approvals").json()["results"]) == 2
    stranger = django_user_model.objects.create_user(username="dave", password="dave-password")
    assert _client(stranger).get("/api/v1/approvals").json()["results"] == []
    assert client.get("/api/v1/approvals?state=decided").status_code == 400


@pytest.mark.django_db(transaction=True)
def test_two_approvers_at_once_exactly_one_wins(gate, user, other_user):
    execution = _started(gate["task"])
    barrier = threading.Barrier(2)
    won: list[str] = []
    conflicts: list[str] = []
    errors: list[BaseException] = []

    def decide(who: Any, approve: bool) -> None:
        try:
            barrier.wait(5)
            approval_decide(user=who, execution_id=execution.pk, approve=approve)
            won.append(who.username)
        except ConflictError:
            conflicts.append(who.username)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=decide, args=(user, True)),
        threading.Thread(target=decide, args=(other_user, False)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert len(won) == len(conflicts) == 1
    (approval,) = Approval.objects.filter(execution_id=execution.pk)
    assert approval.decided_by_name == won[0]
    execution.refresh_from_db()
    assert execution.status == (S.SUCCEEDED if won[0] == "alice" else S.FAILED)
    assert AuditEntry.objects.filter(object_id=str(execution.pk), action__in=["approve", "reject"]).count() == 1
