"""The workflow run page shows the steps a workflow run skipped, with their reason (issue 48, item
2): a condition that was false, a join rule, a skipped upstream; the links say their condition."""

from __future__ import annotations

import json
import re

import pytest

from executions.models import Execution, ExecutionOrigin
from tasks_api.creation import task_create
from tasks_app.models import TaskDependency
from tests.workflows import end

pytestmark = pytest.mark.django_db


def test_skipped_steps_show_their_reason_and_links_their_condition(alice_client, user):
    extract = task_create(owner=user, runner="noop", name="extract")
    cond = {"path": "$.rows", "op": ">", "value": 0}
    load = task_create(owner=user, runner="noop", name="load", after=[{"task": str(extract.pk), "condition": cond}])
    report = task_create(owner=user, runner="noop", name="report", after=[{"task": str(load.pk)}])
    tidy = task_create(owner=user, runner="noop", name="tidy", join="all_done", after=[{"task": str(load.pk)}])
    root = Execution.objects.get(task=extract)
    end(root.pk, output='{"rows": 0}')
    html = alice_client.get(f"/ui/workflow-runs/{root.pk}/").content.decode()
    svg = re.search(r"<svg.*?</svg>", html, re.S).group(0)
    nodes = dict(re.findall(r'class="wf-node" data-task="([^"]+)" data-state="([^"]+)"', svg))
    assert nodes[str(load.pk)] == "SKIPPED" and nodes[str(report.pk)] == "SKIPPED"
    assert nodes[str(tidy.pk)] == "SCHEDULED"
    assert "will not run: the condition on extract&#x27;s output is false ($.rows &gt; 0)" in svg
    steps = re.search(r'<table class="compact" id="workflow-steps">.*?</table>', html, re.S).group(0)
    assert "load did not run" in steps and "(join all_done)" in steps
    links = re.search(r'<ul id="workflow-links">.*?</ul>', html, re.S).group(0)
    assert "load runs after extract on success if $.rows &gt; 0: not taken: the condition" in links
    assert Execution.objects.filter(workflow_run=root.pk, origin=ExecutionOrigin.WORKFLOW).count() == 1


def test_the_edit_form_keeps_a_link_s_condition_and_sets_the_join(alice_client, user):
    """The task form's "runs after" rows carry each link's condition (kept when the person changes
    something else, changed when they edit it, a 400-like error when it is no JSON) and the join."""
    a = task_create(owner=user, runner="noop", name="a")
    b = task_create(owner=user, runner="noop", name="b")
    cond = {"path": "$.rows", "op": ">", "value": 0}
    c = task_create(owner=user, runner="noop", name="c", after=[{"task": str(a.pk), "condition": cond}])
    form = alice_client.get(f"/ui/tasks/{c.pk}/edit/").context["form"]
    data = {}
    for name, field in form.fields.items():
        value = form.initial.get(name, field.initial)
        if value is not None:
            data[name] = value if isinstance(value, list) else str(value)
    assert json.loads(data["after_condition_0"]) == cond and data["join"] == "all_success"
    # Another field changed, the rows as shown: the condition stays.
    data.update(priority="7", after_task_1="b", after_on_1="success")
    response = alice_client.post(f"/ui/tasks/{c.pk}/edit/", data)
    assert response.status_code == 302, response.context["form"].errors
    assert TaskDependency.objects.get(task=c, upstream=a).condition == cond
    assert TaskDependency.objects.get(task=c, upstream=b).condition is None
    data.update(after_condition_0="{not json", join="one_success")
    page = alice_client.post(f"/ui/tasks/{c.pk}/edit/", data)
    assert page.status_code == 400 and "The condition of task 1 is not JSON" in page.content.decode()
    data.update(after_condition_0='{"path": "$.rows", "op": "like", "value": 0}')
    page = alice_client.post(f"/ui/tasks/{c.pk}/edit/", data)
    assert page.status_code == 400 and "unknown op" in page.content.decode()
    data.update(after_condition_0="")
    assert alice_client.post(f"/ui/tasks/{c.pk}/edit/", data).status_code == 302
    c.refresh_from_db()
    assert c.join == "one_success" and TaskDependency.objects.get(task=c, upstream=a).condition is None
