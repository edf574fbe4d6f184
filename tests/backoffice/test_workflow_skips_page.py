"""The workflow run page shows the steps a workflow run skipped, with their reason (issue 48, item
2): a condition that was false, a join rule, a skipped upstream; the links say their condition."""

from __future__ import annotations

import re

import pytest

from executions.models import Execution, ExecutionOrigin
from tasks_api.creation import task_create
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
