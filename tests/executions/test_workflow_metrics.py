"""The workflow steps counter (issue 31): ``tms_workflow_steps_created_total{on}`` grows by the
steps an upstream's end created, by the ``on`` the end met, once the end commits."""

from __future__ import annotations

import pytest

from executions.models import Execution
from tasks_api.creation import task_create
from tests.workflows import after, end
from tms_core.metrics import REGISTRY

pytestmark = pytest.mark.django_db


def _created(on: str) -> float:
    return REGISTRY.get_sample_value("tms_workflow_steps_created_total", {"on": on}) or 0.0


def test_each_step_created_is_counted_by_the_on_it_met(user, django_capture_on_commit_callbacks):
    a = task_create(owner=user, runner="noop")
    task_create(owner=user, runner="noop", after=after((a, "failure")))
    task_create(owner=user, runner="noop", after=after((a, "completion")))
    task_create(owner=user, runner="noop", after=after((a, "success")))
    before = {on: _created(on) for on in ("success", "failure", "completion")}
    root = Execution.objects.get(task=a).pk
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        end(root, ok=False)
    assert {on: _created(on) - before[on] for on in before} == dict.fromkeys(before, 0.0)  # not before the commit
    for callback in callbacks:
        callback()
    assert {on: _created(on) - before[on] for on in before} == {"success": 0.0, "failure": 1.0, "completion": 1.0}
