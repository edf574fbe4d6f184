""" "Why" for workflows (issue 31): a step's run is explained by the runs it followed and how they
ended; a task that runs only after others says so instead of reading a schedule it has not got."""

from __future__ import annotations

from datetime import timedelta

import pytest

from executions.models import Execution, ExecutionOrigin
from tasks_api.creation import task_create
from tasks_api.selectors import task_why
from tests.workflows import after as _after
from tests.workflows import end as _end

pytestmark = pytest.mark.django_db


def test_a_step_s_why_names_its_upstream_run_and_how_it_ended(user, api_client):
    extract = task_create(owner=user, runner="noop", name="extract")
    alert = task_create(owner=user, runner="noop", name="alert", after=_after((extract, "failure")))
    root = Execution.objects.get(task=extract)
    _end(root.pk, ok=False)
    step = Execution.objects.get(task=alert, origin=ExecutionOrigin.WORKFLOW)
    answer = task_why(task=alert, at=step.scheduled_for)
    assert answer.verdict == "upcoming" and answer.execution == step
    assert answer.reason == (
        f"Execution {step.pk} (attempt 1) is SCHEDULED, created because extract run #{root.pk} failed for good "
        f"(after: on failure), in workflow run #{root.pk}."
    )
    # The API gives the same (the answer's verdict is in the schema's choices).
    response = api_client.get(f"/api/v1/tasks/{alert.pk}/why", {"at": step.scheduled_for.isoformat()})
    assert response.status_code == 200 and response.json()["verdict"] == "upcoming"
    assert f"extract run #{root.pk} failed for good" in response.json()["reason"]


def test_a_fan_in_step_names_every_upstream(user):
    a = task_create(owner=user, runner="noop", name="a")
    b = task_create(owner=user, runner="noop", name="b", after=_after((a, "success")))
    c = task_create(owner=user, runner="noop", name="c", after=_after((a, "completion")))
    d = task_create(owner=user, runner="noop", name="d", after=_after((b, "success"), (c, "success")))
    root = Execution.objects.get(task=a)
    _end(root.pk)
    step_b, step_c = (Execution.objects.get(task=t, origin=ExecutionOrigin.WORKFLOW) for t in (b, c))
    _end(step_b.pk)
    _end(step_c.pk)
    step_d = Execution.objects.get(task=d)
    reason = task_why(task=d, at=step_d.scheduled_for).reason
    (first, one), (second, two) = sorted([(step_b.pk, "b"), (step_c.pk, "c")])  # in id order
    assert reason.endswith(
        f"created because {one} run #{first} succeeded (after: on success) and {two} run #{second} succeeded "
        f"(after: on success), in workflow run #{root.pk}."
    )


def test_a_follower_without_a_schedule_says_why_it_has_no_fire_times(user, api_client):
    extract = task_create(owner=user, runner="noop", name="extract")
    load = task_create(owner=user, runner="noop", name="load", after=_after((extract, "success")))
    answer = task_why(task=load, at=load.created_at + timedelta(hours=1))
    assert answer.verdict == "follows" and answer.next_fire_times == [] and answer.execution is None
    assert answer.reason == (
        "No next run of its own: it has no schedule and runs only after other tasks, when extract succeeds "
        "(on success) (or when run on request). It had not run before then."
    )
    root = Execution.objects.get(task=extract)
    _end(root.pk)
    step = Execution.objects.get(task=load)
    later = task_why(task=load, at=step.scheduled_for + timedelta(minutes=5))
    assert later.verdict == "follows" and later.execution == step
    assert later.reason.endswith(
        f"Its latest run before then: Execution {step.pk} (attempt 1) is SCHEDULED, created because extract run "
        f"#{root.pk} succeeded (after: on success), in workflow run #{root.pk}."
    )
    response = api_client.get(
        f"/api/v1/tasks/{load.pk}/why", {"at": (step.scheduled_for + timedelta(minutes=5)).isoformat()}
    )
    assert response.status_code == 200 and response.json()["verdict"] == "follows"


def test_a_task_that_follows_nothing_answers_as_before(user):
    task = task_create(owner=user, runner="noop", name="plain")
    assert task_why(task=task, at=task.created_at + timedelta(hours=1)).verdict != "follows"
