"""Issue 44, item 11: ``?workflow_run=`` on the execution list was silently ignored. It filters
(the root and the steps of that workflow run), in the API and in the back office list, and a
value that is not an execution id is a 400 there."""

from __future__ import annotations

import pytest

from executions.models import Execution, ExecutionOrigin
from tasks_api.creation import task_create
from tasks_api.triggers import task_trigger
from tests.workflows import after, end

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_runs(user):
    """Two workflow runs of a -> b, and a task that is no workflow's."""
    a = task_create(owner=user, runner="noop", name="a")
    b = task_create(owner=user, runner="noop", name="b", after=after((a, "success")))
    task_create(owner=user, runner="noop", name="alone")
    first = Execution.objects.get(task=a).pk
    end(first)
    second = task_trigger(task=a, actor="test").execution.pk
    end(second)
    steps = {run: Execution.objects.get(task=b, workflow_run=run, origin=ExecutionOrigin.WORKFLOW).pk
             for run in (first, second)}  # fmt: skip
    for step in steps.values():
        end(step)
    return first, second, steps


def test_the_api_lists_only_the_runs_of_the_workflow_run_asked(api_client, two_runs):
    first, _, steps = two_runs
    response = api_client.get("/api/v1/executions", {"workflow_run": first, "limit": 100})
    assert response.status_code == 200, response.json()
    assert sorted(row["id"] for row in response.json()["results"]) == sorted([first, steps[first]])
    everything = api_client.get("/api/v1/executions", {"limit": 100}).json()["results"]
    assert len(everything) == 5


@pytest.mark.parametrize("value", ["x", "1.5", "-3", "0", "", "99999999999999999999"])
def test_the_api_refuses_a_workflow_run_that_is_no_id(api_client, two_runs, value):
    response = api_client.get("/api/v1/executions", {"workflow_run": value})
    assert response.status_code == 400
    assert "workflow_run" in response.json()["errors"]


def test_the_back_office_list_filters_by_workflow_run(client, user, two_runs):
    _, second, steps = two_runs
    client.force_login(user)
    alice_client = client
    response = alice_client.get("/ui/executions/", {"workflow_run": second})
    assert response.status_code == 200
    shown = {row["execution"].pk for row in response.context["rows"]}
    assert shown == {second, steps[second]}
    response = alice_client.get("/ui/executions/", {"workflow_run": "abc"})
    assert response.status_code == 400
    assert "workflow_run" in response.content.decode()
