"""The e-mail runner's limits (issue 15, finding 5): recipients outside the operator's allow-list
are refused when a task is saved and again at send time, and each owner's send rate holds on
real sends to an SMTP server on 127.0.0.1, counted in PostgreSQL by the worker-side services."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from executions import transitions, worker_services
from executions.models import Execution, ExecutionStatus
from runners.base import RunState
from tasks_api.creation import task_create
from tasks_api.triggers import task_trigger
from tasks_app.models import QuotaUse, Task
from tests.runners.test_email import REPORT, SMTP_BACKEND, mailbox, make_spec, smtp_runner  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def email_runner_at(settings):
    """Point the ``email`` alias at the test SMTP server, with an allow-list and a send rate."""

    def configure(port: int, **options: Any) -> None:
        settings.TMS_RUNNERS = {
            **settings.TMS_RUNNERS,
            "email": {
                "BACKEND": "runners.email.EmailRunner",
                "OPTIONS": {
                    "backend": SMTP_BACKEND,
                    "backend_options": {"host": "127.0.0.1", "port": port, "timeout": 5},
                    "default_from": "tms@example.com",
                    "allowed_recipients": ["@example.com", "boss@partner.example.org"],
                    **options,
                },
            },
        }

    return configure


def test_a_recipient_outside_the_allow_list_is_a_400_on_its_field(api_client, email_runner_at):
    email_runner_at(9)
    config = {**REPORT, "cc": ["boss@partner.example.org"], "bcc": ["someone@elsewhere.test"]}
    response = api_client.post("/api/v1/tasks", {"runner": "email", "config": config})
    assert response.status_code == 400, response.content
    [message] = response.json()["errors"]["config"]["bcc"]
    assert "'someone@elsewhere.test'" in message and "allowed_recipients" in message
    assert not Task.objects.exists()
    allowed = api_client.post("/api/v1/tasks", {"runner": "email", "config": {**config, "bcc": []}})
    assert allowed.status_code == 201, allowed.content


def test_the_default_allow_list_is_empty_and_subdomain_entries_match_subdomains():
    from runners.email import EmailRunner

    nobody = EmailRunner("email", {})
    assert not nobody.recipient_allowed("alice@example.com")
    some = EmailRunner("email", {"allowed_recipients": ["@*.example.com"]})
    assert some.recipient_allowed("a@example.com") and some.recipient_allowed("a@mail.example.com")
    assert not some.recipient_allowed("a@badexample.com") and not some.recipient_allowed("a@example.com.evil")


def test_a_recipient_no_longer_allowed_is_refused_at_send_time(mailbox):  # noqa: F811
    box, port = mailbox
    saved_under = smtp_runner(port, allowed_recipients=["@example.com"])
    spec = make_spec(saved_under, {**REPORT, "cc": ["ops@example.com"]})
    shrunk = smtp_runner(port, allowed_recipients=["alice@example.com"])  # the operator narrowed the list

    handle = shrunk.start(spec)

    assert handle.result is not None and handle.result.state is RunState.FAILED
    assert not handle.result.retryable and "ops@example.com" in handle.result.error
    assert box.messages == []


def test_the_send_rate_holds_on_real_sends_and_defers_the_rest(mailbox, email_runner_at, user):  # noqa: F811
    box, port = mailbox
    email_runner_at(port, max_per_minute=2)
    task = task_create(owner=user, runner="email", config=REPORT, start_at=timezone.now() + timedelta(days=1))
    for _ in range(4):
        task_trigger(task=task, actor="test")
    dispatches = transitions.executions_take_due(limit=10, actor="monitor")
    assert len(dispatches) == 4

    outcomes = [
        worker_services.execution_run(execution_id=d.execution_id, attempt=d.attempt, worker_id="worker-1")
        for d in dispatches
    ]

    assert sorted(outcomes) == ["deferred", "deferred", "finished", "finished"]
    assert len(box.messages) == 2
    assert QuotaUse.objects.filter(team=task.team_id, kind="send:email").count() == 2
    deferred = Execution.objects.filter(task=task, status=ExecutionStatus.RUNNING)
    assert deferred.count() == 2
    for execution in deferred:
        # Waiting without a lease, a run id or a used-up attempt, until a poll resumes it.
        assert execution.lease_owner == "" and execution.external_run_id == "" and execution.attempt == 1
        assert execution.next_poll_at > timezone.now() + timedelta(seconds=50)

    # A minute later the window has room again: the resumed launch sends.
    QuotaUse.objects.filter(team=task.team_id).update(at=timezone.now() - timedelta(seconds=61))
    first = deferred.first()
    assert worker_services.execution_resume(execution_id=first.pk, attempt=1, worker_id="worker-2") == "finished"
    assert len(box.messages) == 3
    assert Execution.objects.get(pk=first.pk).status == ExecutionStatus.SUCCEEDED
