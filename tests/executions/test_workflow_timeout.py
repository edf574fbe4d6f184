"""A workflow-level timeout (issue 48, item 1): ``workflow_timeout`` on the root task; beat's job
cancels a workflow run that has gone on longer, with the reason on the run and its steps."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from executions import transitions
from executions.models import Execution, ExecutionEvent, WorkflowRunControl
from executions.models import ExecutionStatus as S
from executions.periodic import periodic_jobs
from executions.workflow_control import workflow_runs_retry_failed, workflow_runs_time_out
from tasks_api.creation import task_create
from tasks_app.models import AuditEntry
from tests.workflows import after, end

pytestmark = pytest.mark.django_db

LATER = timezone.now() + timedelta(days=365)


def test_the_api_takes_shows_and_checks_workflow_timeout(api_client):
    made = api_client.post("/api/v1/tasks", {"runner": "noop", "workflow_timeout": "1h"}, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["workflow_timeout"] == 3600
    task = made.json()["id"]
    assert api_client.get(f"/api/v1/tasks/{task}").json()["workflow_timeout"] == 3600
    for bad in (0, "soon", "31d"):
        refused = api_client.patch(f"/api/v1/tasks/{task}", {"workflow_timeout": bad}, format="json")
        assert refused.status_code == 400 and set(refused.json()["errors"]) == {"workflow_timeout"}, bad
    cleared = api_client.patch(f"/api/v1/tasks/{task}", {"workflow_timeout": None}, format="json")
    assert cleared.status_code == 200 and cleared.json()["workflow_timeout"] is None


def test_a_workflow_run_past_its_timeout_is_cancelled_with_the_reason_once(user, api_client):
    a = task_create(owner=user, runner="noop", name="extract", start_at=LATER, workflow_timeout=timedelta(minutes=1))
    b = task_create(owner=user, runner="noop", name="load", after=after((a, "success")))

    late = transitions.execution_trigger(task_id=a.pk, actor="t")
    recent = transitions.execution_trigger(task_id=a.pk, actor="t")
    finished = transitions.execution_trigger(task_id=a.pk, actor="t")
    for root in (late, recent, finished):
        end(root)  # each started its step, load, SCHEDULED
    end(Execution.objects.get(task=b, workflow_run=finished).pk)
    Execution.objects.filter(pk__in=[late, finished]).update(started_at=timezone.now() - timedelta(minutes=2))

    assert workflow_runs_time_out() == [late]

    step = Execution.objects.get(task=b, workflow_run=late)
    assert step.status == S.CANCELLED
    event = ExecutionEvent.objects.filter(execution=step).latest("id")
    assert (event.actor, event.detail) == ("system", "workflow run timed out after 1m (workflow_timeout of extract)")
    control = WorkflowRunControl.objects.get(workflow_run=late)
    assert control.changed_by == "system" and control.reason.startswith("timed out after 1m")
    shown = api_client.get(f"/api/v1/workflow-runs/{late}").json()
    assert shown["state"] == "cancelled" and shown["hold_reason"].startswith("timed out")
    assert Execution.objects.get(task=b, workflow_run=recent).status == S.SCHEDULED
    assert AuditEntry.objects.filter(object_type="workflow_run", action="cancel").count() == 1
    assert workflow_runs_time_out() == []
    assert ("tms.workflow_timeouts", 60.0) in periodic_jobs().values()


def test_a_root_still_running_past_its_timeout_is_cancelled_before_any_step(user):
    a = task_create(owner=user, runner="noop", name="extract", start_at=LATER, workflow_timeout=timedelta(minutes=1))
    task_create(owner=user, runner="noop", name="load", after=after((a, "success")))
    root = transitions.execution_trigger(task_id=a.pk, actor="t")
    Execution.objects.filter(pk=root).update(status=S.PENDING)
    assert transitions.execution_claim_loaded(
        execution_id=root, attempt=1, worker_id="w", lease_seconds=60, checked=True
    )
    Execution.objects.filter(pk=root).update(started_at=timezone.now() - timedelta(minutes=2))

    assert workflow_runs_time_out() == [root]
    assert Execution.objects.get(pk=root).status == S.CANCELLED


def test_with_no_task_timed_the_job_reads_no_execution(user):
    """The job runs every minute on every install; most have no workflow timeout at all. It reads
    the timed tasks (a partial index) and stops there: not a row of the executions, however many."""
    a = task_create(owner=user, runner="noop", name="extract", start_at=LATER)
    task_create(owner=user, runner="noop", name="load", after=after((a, "success")))
    end(transitions.execution_trigger(task_id=a.pk, actor="t"))
    with CaptureQueriesContext(connection) as queries:
        assert workflow_runs_time_out() == []
    assert len(queries) == 1
    assert Execution._meta.db_table not in queries[0]["sql"]


def test_a_failed_workflow_run_is_retried_from_its_failed_step_up_to_workflow_retries(user, api_client):
    a = task_create(owner=user, runner="noop", name="extract", start_at=LATER, workflow_retries=2)
    b = task_create(owner=user, runner="noop", name="load", after=after((a, "success")))
    root = transitions.execution_trigger(task_id=a.pk, actor="t")
    end(root)
    assert workflow_runs_time_out() == [] and workflow_runs_retry_failed() == []  # running: nothing to do
    for attempt in (1, 2):
        step = Execution.objects.filter(task=b, workflow_run=root).latest("id")
        Execution.objects.filter(pk=step.pk).update(attempt=1)  # tests/workflows.end ends attempt 1
        end(step.pk, ok=False)
        assert workflow_runs_retry_failed() == [root], attempt
        assert workflow_runs_retry_failed() == []  # running again: once a failure
        again = Execution.objects.filter(task=b, workflow_run=root).latest("id")
        assert again.retry_of_id == step.pk and again.status == S.SCHEDULED
    last = Execution.objects.filter(task=b, workflow_run=root).latest("id")
    Execution.objects.filter(pk=last.pk).update(attempt=1)
    end(last.pk, ok=False)
    assert workflow_runs_retry_failed() == [], "two retries, then it stays failed"
    assert api_client.get(f"/api/v1/workflow-runs/{root}").json()["state"] == "failed"
    assert WorkflowRunControl.objects.get(workflow_run=root).retries == 2
    details = AuditEntry.objects.filter(object_type="workflow_run", action="retry").order_by("id")
    assert [entry.detail for entry in details] == [
        "workflow run retried automatically (1 of 2)",
        "workflow run retried automatically (2 of 2)",
    ]
    assert ("tms.workflow_retries", 60.0) in periodic_jobs().values()
    assert api_client.patch(f"/api/v1/tasks/{a.pk}", {"workflow_retries": 11}, format="json").status_code == 400
