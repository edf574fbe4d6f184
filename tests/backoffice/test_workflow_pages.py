"""A workflow's page (issue 46), per root task: its tasks and links as a graph (server-side SVG)
and a list, its recent workflow runs with their steps, "Start workflow with input" for an
operator; linked from each of its tasks' pages; another team's root is a 404."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from executions.models import Execution
from tasks_api.creation import task_create
from tests.workflows import after as _after
from tests.workflows import end as _end

pytestmark = pytest.mark.django_db


@pytest.fixture
def flow(crew):
    admin, team = crew["people"]["admin"], crew["team"]
    extract = task_create(owner=admin, team=team, runner="noop", name="extract")
    transform = task_create(owner=admin, team=team, runner="noop", name="transform", after=_after((extract, "success")))
    alert = task_create(owner=admin, team=team, runner="noop", name="alert", after=_after((extract, "failure")))
    load = task_create(owner=admin, team=team, runner="noop", name="load", after=_after((transform, "completion")))
    return {"extract": extract, "transform": transform, "alert": alert, "load": load}


def test_the_page_draws_the_tasks_and_links_and_lists_the_runs(client, crew, flow):
    root = Execution.objects.get(task=flow["extract"])
    _end(root.pk)
    client.force_login(crew["people"]["operator"])
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/ui/tasks/{flow['extract'].pk}/workflow/")
    assert page.status_code == 200
    # 14 with the user's team ids, read for the task and for the workflow's tasks and runs
    # (tasks_app.teams.scope_to_teams).
    assert len(queries) <= 14, [q["sql"] for q in queries]
    html = page.content.decode()
    svg = re.search(r"<svg.*?</svg>", html, re.S).group(0)
    nodes = re.findall(r'class="wf-node" data-task="([^"]+)"', svg)
    assert sorted(nodes) == sorted(str(task.pk) for task in flow.values())
    edges = re.findall(r'class="wf-edge" data-from="([^"]+)" data-to="([^"]+)"', svg)
    assert (str(flow["transform"].pk), str(flow["load"].pk)) in edges and len(edges) == 3
    assert "load runs after transform on completion" in svg and 'aria-labelledby="wf-graph-title"' in svg
    assert "4 tasks, 3 links." in html
    assert re.search(r"alert</a> runs after <a[^>]*>extract</a> on failure", html)
    # Its run: the root ended, transform's step was made.
    assert f'href="/ui/workflow-runs/{root.pk}/">#{root.pk}<' in html
    assert "1 scheduled, 1 succeeded" in html
    assert f'href="/ui/tasks/{flow["extract"].pk}/run/" id="start-workflow"' in html


def test_each_task_links_to_its_workflows_page(client, crew, flow):
    client.force_login(crew["people"]["viewer"])
    for task in flow.values():
        html = client.get(f"/ui/tasks/{task.pk}/").content.decode()
        assert f'href="/ui/tasks/{flow["extract"].pk}/workflow/" id="workflow-link"' in html


def test_a_viewer_sees_no_start_button_and_an_outsider_a_404(client, crew, flow, other_user):
    client.force_login(crew["people"]["viewer"])
    html = client.get(f"/ui/tasks/{flow['extract'].pk}/workflow/").content.decode()
    assert 'id="start-workflow"' not in html
    assert client.post(f"/ui/tasks/{flow['extract'].pk}/run/", {}).status_code == 403
    client.force_login(other_user)
    assert client.get(f"/ui/tasks/{flow['extract'].pk}/workflow/").status_code == 404


def test_a_step_s_page_shows_it_and_what_follows_it(client, crew, flow):
    client.force_login(crew["people"]["operator"])
    html = client.get(f"/ui/tasks/{flow['transform'].pk}/workflow/").content.decode()
    assert "2 tasks, 1 link." in html and "transform follows other tasks itself" in html
    assert 'id="start-workflow"' not in html  # a run of a step alone starts no workflow run
