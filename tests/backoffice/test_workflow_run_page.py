"""The workflow run page (issue 31): its graph drawn server-side as SVG, a node per step with its
state in words and a link, an arrow per link, steps not run shown waiting or skipped; 404 for
another owner's run; the execution page links to it."""

from __future__ import annotations

import re

import pytest

from executions.models import Execution, ExecutionOrigin
from executions.workflow_runs import SKIPPED, WAITING, RunState, workflow_run_read
from tasks_api.creation import task_create
from tests.workflows import after as _after
from tests.workflows import end as _end

pytestmark = pytest.mark.django_db


def _step(task) -> Execution:
    return Execution.objects.get(task=task, origin=ExecutionOrigin.WORKFLOW)


@pytest.fixture
def diamond(user):
    """extract -> (transform, check) -> load, and alert on extract's failure."""
    extract = task_create(owner=user, runner="noop", name="extract")
    transform = task_create(owner=user, runner="noop", name="transform", after=_after((extract, "success")))
    check = task_create(owner=user, runner="noop", name="check", after=_after((extract, "success")))
    load = task_create(owner=user, runner="noop", name="load", after=_after((transform, "success"), (check, "success")))
    alert = task_create(owner=user, runner="noop", name="alert", after=_after((extract, "failure")))
    root = Execution.objects.get(task=extract)
    return {"extract": extract, "transform": transform, "check": check, "load": load, "alert": alert, "root": root}


def test_the_page_draws_each_step_with_its_state_and_an_arrow_per_link(alice_client, diamond):
    root = diamond["root"]
    _end(root.pk)
    _end(_step(diamond["transform"]).pk)  # check still scheduled; load waits for it; alert will not run
    response = alice_client.get(f"/ui/workflow-runs/{root.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    svg = re.search(r"<svg.*?</svg>", html, re.S).group(0)
    # Accessible: a labelled group with a title and a description saying how the run stands.
    assert 'role="group"' in svg and 'aria-labelledby="wf-graph-title"' in svg
    assert f'<title id="wf-graph-title">Steps of workflow run {root.pk}</title>' in svg
    assert f"Workflow run {root.pk} is running: 5 steps" in svg
    nodes = dict(re.findall(r'<a href="[^"]+" class="wf-node" data-task="([^"]+)" data-state="([^"]+)"', svg))
    assert nodes == {
        str(diamond["extract"].pk): "SUCCEEDED",
        str(diamond["transform"].pk): "SUCCEEDED",
        str(diamond["check"].pk): "SCHEDULED",
        str(diamond["load"].pk): WAITING,
        str(diamond["alert"].pk): SKIPPED,
    }
    # States in words and signs, not colour alone; steps that ran link to their execution.
    assert f'href="/ui/executions/{root.pk}/" class="wf-node"' in svg
    assert "\u2713 succeeded (execution #" in svg and "waiting: after check, transform" in svg
    assert "will not run: extract succeeded; it runs on failure" in svg
    assert f'href="/ui/tasks/{diamond["load"].pk}/" class="wf-node"' in svg
    edges = re.findall(r'class="wf-edge" data-from="([^"]+)" data-to="([^"]+)"', svg)
    assert len(edges) == 5
    assert (str(diamond["transform"].pk), str(diamond["load"].pk)) in edges
    assert "load runs after transform on success (met; load waits for the others)" in svg
    assert "alert runs after extract on failure (not taken)" in svg
    assert 'id="workflow-state">running<' in html


def test_a_run_whose_step_failed_unhandled_is_failed_and_says_which(alice_client, diamond):
    root = diamond["root"]
    _end(root.pk)
    _end(_step(diamond["check"]).pk, ok=False)
    _end(_step(diamond["transform"]).pk)
    run = workflow_run_read(Execution.objects.get(pk=root.pk))
    assert run.state == RunState.FAILED and [e.task_id for e in run.unhandled] == [diamond["check"].pk]
    assert run.steps[diamond["load"].pk].state == SKIPPED
    html = alice_client.get(f"/ui/workflow-runs/{root.pk}/").content.decode()
    assert 'id="workflow-state">failed<' in html and 'id="workflow-failed"' in html


def test_a_handled_failure_does_not_fail_the_run(diamond):
    root = diamond["root"]
    _end(root.pk, ok=False)
    _end(_step(diamond["alert"]).pk)
    run = workflow_run_read(Execution.objects.get(pk=root.pk))
    assert run.state == RunState.SUCCEEDED and run.unhandled == []
    assert {run.steps[diamond[name].pk].state for name in ("transform", "check", "load")} == {SKIPPED}


def test_a_handled_failure_is_said_on_the_page_and_finished_links_are_not_not_yet(alice_client, diamond):
    """Issue 44, item 9: "succeeded" with no word of the handled failure, and "not yet" for the
    links of steps that never ran in a finished run."""
    root = diamond["root"]
    _end(root.pk, ok=False)
    _end(_step(diamond["alert"]).pk)
    run = workflow_run_read(Execution.objects.get(pk=root.pk))
    assert run.state_words == "succeeded; extract failed, handled by alert"
    html = alice_client.get(f"/ui/workflow-runs/{root.pk}/").content.decode()
    assert 'id="workflow-handled">Succeeded with a failure handled: extract failed, handled by alert.' in html
    assert f"Workflow run {root.pk} is succeeded; extract failed, handled by alert: 5 steps" in html
    links = re.search(r'id="workflow-links">(.*?)</ul>', html, re.S).group(1)
    assert "not yet" not in links and "not yet" not in re.search(r"<svg.*?</svg>", html, re.S).group(0)
    assert "load runs after check on success: not taken: check did not run" in links


def test_a_link_met_whose_step_will_not_run_is_not_called_taken(alice_client, diamond):
    root = diamond["root"]
    _end(root.pk)
    _end(_step(diamond["transform"]).pk)
    _end(_step(diamond["check"]).pk, ok=False)  # load needs both: it will not run
    html = alice_client.get(f"/ui/workflow-runs/{root.pk}/").content.decode()
    links = re.search(r'id="workflow-links">(.*?)</ul>', html, re.S).group(1)
    assert "load runs after transform on success: met, but load will not run" in links
    assert "load runs after transform on success (taken)" not in html
    assert "load runs after check on success: not taken" in links


def test_a_step_s_id_leads_to_its_workflow_run_and_the_execution_page_links_there(alice_client, diamond):
    root = diamond["root"]
    _end(root.pk)
    step = _step(diamond["check"])
    response = alice_client.get(f"/ui/workflow-runs/{step.pk}/")
    assert response.status_code == 302 and response["Location"] == f"/ui/workflow-runs/{root.pk}/"
    page = alice_client.get(f"/ui/executions/{step.pk}/").content.decode()
    assert f'<a href="/ui/workflow-runs/{root.pk}/" id="workflow-run-link">#{root.pk}</a>' in page
    assert f'<a href="/ui/executions/{root.pk}/">#{root.pk}</a>' in page  # its upstream
    alone = task_create(owner=diamond["root"].task.owner, runner="noop")
    lone = Execution.objects.get(task=alone)
    assert "workflow-run-link" not in alice_client.get(f"/ui/executions/{lone.pk}/").content.decode()


def test_another_owner_s_workflow_run_is_not_found(client, other_user, diamond):
    client.force_login(other_user)
    other_client = client
    root = diamond["root"]
    _end(root.pk)
    assert other_client.get(f"/ui/workflow-runs/{root.pk}/").status_code == 404
    assert other_client.get(f"/ui/workflow-runs/{_step(diamond['check']).pk}/").status_code == 404


def test_a_root_still_running_shows_what_will_follow(alice_client, diamond):
    html = alice_client.get(f"/ui/workflow-runs/{diamond['root'].pk}/").content.decode()
    assert html.count('class="wf-node"') == 5 and html.count(f'data-state="{WAITING}"') == 4


def test_the_task_page_links_upstream_and_downstream_tasks_and_says_why_no_next_run(alice_client, diamond):
    html = alice_client.get(f"/ui/tasks/{diamond['extract'].pk}/").content.decode()
    downstream = re.search(r'id="downstream-tasks">(.*?)</dd>', html, re.S).group(1)
    for name in ("alert", "check", "transform"):
        assert f'<a href="/ui/tasks/{diamond[name].pk}/">{name}</a>' in downstream
    assert "(on failure)" in downstream
    html = alice_client.get(f"/ui/tasks/{diamond['load'].pk}/").content.decode()
    upstream = re.search(r'id="upstream-tasks">(.*?)</dd>', html, re.S).group(1)
    assert f'<a href="/ui/tasks/{diamond["check"].pk}/">check</a>' in upstream
    assert "no task" in re.search(r'id="downstream-tasks">(.*?)</dd>', html, re.S).group(1)
    next_run = re.search(r'<p id="next-run">(.*?)</p>', html, re.S).group(1)
    assert next_run == (
        "No next run of its own: it has no schedule and runs only after other tasks, when check succeeds "
        "(on success) and transform succeeds (on success) within one workflow run (or when run on request)."
    )


def test_a_retried_step_shows_its_latest_run_and_the_run_recovers(diamond):
    from executions.services import execution_retry_by_user

    root = diamond["root"]
    _end(root.pk)
    failed = _step(diamond["check"])
    _end(failed.pk, ok=False)
    _end(_step(diamond["transform"]).pk)
    assert workflow_run_read(Execution.objects.get(pk=root.pk)).state == RunState.FAILED
    retry = execution_retry_by_user(execution=Execution.objects.get(pk=failed.pk), actor="test")
    run = workflow_run_read(Execution.objects.get(pk=root.pk))
    step = run.steps[diamond["check"].pk]
    assert step.execution.pk == retry.pk and step.runs == 2 and run.state == RunState.RUNNING
    assert run.unhandled == []


def test_the_page_pauses_resumes_and_cancels_the_run_through_the_services(alice_client, other_user, diamond):
    """Issue 48: the buttons call the API's services; the page says the run is paused, and a
    resume starts what its ends held back."""
    from django.test import Client

    bob_client = Client()
    bob_client.force_login(other_user)
    root = diamond["root"]
    _end(root.pk)
    page = alice_client.get(f"/ui/workflow-runs/{root.pk}/").content.decode()
    assert 'id="workflow-pause"' in page and 'id="workflow-resume"' not in page
    assert bob_client.post(f"/ui/workflow-runs/{root.pk}/pause/").status_code == 404
    assert alice_client.post(f"/ui/workflow-runs/{root.pk}/pause/").status_code == 302
    _end(_step(diamond["transform"]).pk)
    _end(_step(diamond["check"]).pk)
    page = alice_client.get(f"/ui/workflow-runs/{root.pk}/").content.decode()
    assert 'id="workflow-state">paused<' in page and "Paused by alice" in page and 'id="workflow-resume"' in page
    assert not Execution.objects.filter(task=diamond["load"]).exists()
    alice_client.post(f"/ui/workflow-runs/{root.pk}/resume/")
    assert Execution.objects.filter(task=diamond["load"], workflow_run=root.pk).count() == 1
    alice_client.post(f"/ui/workflow-runs/{root.pk}/cancel/")
    assert Execution.objects.get(task=diamond["load"]).status == "CANCELLED"
    assert 'id="workflow-state">cancelled<' in alice_client.get(f"/ui/workflow-runs/{root.pk}/").content.decode()
