"""Workflow run notifications (issue 31): a step's end writes a "workflow" outbox row for the rules
of the run's root task (the status trigger, in the end's transaction); the dispatcher reads the run
as it stands and tells "workflow_failed" once when runs start failing, "workflow_recovered" once
when a later one succeeds."""

from __future__ import annotations

import pytest
from django.utils import timezone

from executions import transitions
from executions.models import Execution, ExecutionOrigin
from notifications import dispatch, services
from notifications.models import Delivery, Outbox, RuleState
from notifications.senders import render_text
from tasks_api.creation import task_create
from tests.workflows import after, end

pytestmark = pytest.mark.django_db


@pytest.fixture
def flow(user):
    """extract -> (transform, check) -> load; a rule on extract (the root) for failures and recoveries."""
    extract = task_create(owner=user, runner="noop", name="extract")
    transform = task_create(owner=user, runner="noop", name="transform", after=after((extract, "success")))
    check = task_create(owner=user, runner="noop", name="check", after=after((extract, "success")))
    load = task_create(owner=user, runner="noop", name="load", after=after((transform, "success"), (check, "success")))
    channel = services.channel_create(
        owner=user, data={"name": "ops", "kind": "webhook", "target": "http://127.0.0.1:9/h"}
    )
    rule = services.rule_create(
        owner=user, data={"task": extract, "channel": channel, "on_failure": True, "on_recovery": True}
    )
    return {"extract": extract, "transform": transform, "check": check, "load": load, "rule": rule}


def _step(task, root: int) -> int:
    return Execution.objects.get(task=task, workflow_run=root, origin=ExecutionOrigin.WORKFLOW).pk


def _new_root(task) -> int:
    (pk,) = transitions.executions_create(rows=[transitions.NewExecution(task.pk, timezone.now(), 5)], actor="t")
    return pk


def _events() -> list[str]:
    return list(Delivery.objects.order_by("id").values_list("event", flat=True))


def test_a_run_with_two_failed_steps_is_told_failed_once_then_recovered_once(flow):
    root = Execution.objects.get(task=flow["extract"]).pk
    end(root)
    end(_step(flow["transform"], root), ok=False)
    # The step's end wrote a workflow row for the root task's rule (the step's task has no rule).
    assert list(Outbox.objects.filter(kind="workflow").values_list("task_id", "detail")) == [
        (flow["extract"].pk, "FAILED")
    ]
    dispatch.dispatch_outbox()
    end(_step(flow["check"], root), ok=False)  # the same run fails again: not told again
    dispatch.dispatch_outbox()
    assert _events() == ["workflow_failed"]
    delivery = Delivery.objects.get()
    assert delivery.payload["workflow_run"] == root and delivery.payload["task"]["name"] == "extract"
    assert delivery.payload["detail"].startswith(f"Step {_step(flow['transform'], root)} (transform) failed: boom")
    subject, _ = render_text(delivery.payload)
    assert subject == f'[TMS] A workflow run of task "extract" failed (workflow run {root})'
    # A second failed run is counted, not told.
    second = _new_root(flow["extract"])
    end(second)
    end(_step(flow["check"], second), ok=False)
    dispatch.dispatch_outbox()
    assert _events() == ["workflow_failed"]
    assert RuleState.objects.get(rule=flow["rule"]).workflow_failures == 2
    # A run that succeeds throughout: recovered, once, with the count.
    third = _new_root(flow["extract"])
    end(third)
    end(_step(flow["transform"], third))
    dispatch.dispatch_outbox()  # still running: nothing yet
    assert _events() == ["workflow_failed"]
    end(_step(flow["check"], third))
    end(_step(flow["load"], third))
    dispatch.dispatch_outbox()
    dispatch.dispatch_outbox()
    assert _events() == ["workflow_failed", "workflow_recovered"]
    recovered = Delivery.objects.get(event="workflow_recovered")
    assert recovered.payload["failures"] == 2 and recovered.payload["workflow_run"] == third
    assert not Outbox.objects.exists()


def test_a_failure_something_follows_does_not_fail_the_run(flow, user):
    alert = task_create(owner=user, runner="noop", name="alert", after=after((flow["check"], "failure")))
    root = Execution.objects.get(task=flow["extract"]).pk
    end(root)
    end(_step(flow["check"], root), ok=False)
    end(_step(flow["transform"], root))
    end(_step(alert, root))
    dispatch.dispatch_outbox()
    assert _events() == []


def test_steps_of_a_root_task_without_rules_write_no_workflow_row(user):
    extract = task_create(owner=user, runner="noop", name="extract")
    step_task = task_create(owner=user, runner="noop", name="next", after=after((extract, "success")))
    root = Execution.objects.get(task=extract).pk
    end(root)
    end(_step(step_task, root), ok=False)
    assert not Outbox.objects.exists()
