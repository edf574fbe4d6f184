"""A task's ``after`` in the API (issue 31, dependencies): accepted on create and update, shown,
audited, and refused with a 400 on ``after`` (never a 500) when it names an unknown task, another
owner's, the task itself, or closes a cycle."""

from __future__ import annotations

import uuid

import pytest

from executions.models import Execution
from tasks_app.models import AuditEntry, TaskDependency

pytestmark = pytest.mark.django_db


def _task(client, **fields) -> str:
    response = client.post("/api/v1/tasks", {"runner": "noop", **fields}, format="json")
    assert response.status_code == 201, response.json()
    return str(response.json()["id"])


def test_after_is_created_shown_and_audited(api_client):
    a = _task(api_client, name="extract")
    b = _task(api_client, name="load", after=[{"task": a}])
    shown = api_client.get(f"/api/v1/tasks/{b}").json()
    assert shown["after"] == [{"task": a, "on": "success"}]
    assert shown["status"] == "ACTIVE"
    assert not Execution.objects.filter(task_id=b).exists(), "no schedule given: it runs only after its upstream"
    assert api_client.get(f"/api/v1/tasks/{a}").json()["after"] == []
    created = AuditEntry.objects.get(task_id=b, action="create")
    assert created.changes["after"] == {"from": None, "to": [{"task": a, "on": "success"}]}


def test_a_task_with_after_and_a_schedule_also_runs_on_its_schedule(api_client):
    a = _task(api_client)
    b = _task(api_client, after=[{"task": a, "on": "completion"}], interval="1h")
    assert Execution.objects.filter(task_id=b).exists()


def test_patch_changes_after_and_the_audit_records_it(api_client):
    a, c = _task(api_client), _task(api_client)
    b = _task(api_client, after=[{"task": a}])
    response = api_client.patch(f"/api/v1/tasks/{b}", {"after": [{"task": c, "on": "failure"}]}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["after"] == [{"task": c, "on": "failure"}]
    assert list(TaskDependency.objects.filter(task_id=b).values_list("upstream_id", "on")) == [
        (uuid.UUID(c), "failure")
    ]
    (entry,) = AuditEntry.objects.filter(task_id=b, action="update")
    assert entry.changes["after"] == {
        "from": [{"task": a, "on": "success"}],
        "to": [{"task": c, "on": "failure"}],
    }
    response = api_client.patch(f"/api/v1/tasks/{b}", {"after": []}, format="json")
    assert response.status_code == 200 and response.json()["after"] == []
    assert not TaskDependency.objects.filter(task_id=b).exists()


def test_a_cycle_is_refused_with_400_on_after(api_client):
    a = _task(api_client)
    b = _task(api_client, after=[{"task": a}])
    c = _task(api_client, after=[{"task": b}])
    response = api_client.patch(f"/api/v1/tasks/{a}", {"after": [{"task": c}]}, format="json")
    assert response.status_code == 400
    message = " ".join(response.json()["errors"]["after"])
    assert "cycle" in message and a in message and c in message
    assert not TaskDependency.objects.filter(task_id=a).exists()


def test_a_task_cannot_follow_itself(api_client):
    a = _task(api_client)
    response = api_client.patch(f"/api/v1/tasks/{a}", {"after": [{"task": a}]}, format="json")
    assert response.status_code == 400
    assert "itself" in " ".join(response.json()["errors"]["after"])


@pytest.mark.parametrize(
    ("after", "word"),
    [
        ([{"task": "not-a-uuid"}], "UUID"),
        ([{"task": str(uuid.uuid4())}], "No task"),
        ([{"task": "{a}", "on": "sometimes"}], "valid choice"),
        ([{"task": "{a}"}, {"task": "{a}", "on": "failure"}], "twice"),
        ([{"task": "{a}", "when": "now"}], "Unknown field"),
        ("{a}", "list"),
    ],
)
def test_bad_after_is_a_400_on_after(api_client, after, word):
    a = _task(api_client)

    def filled(value):
        if isinstance(value, str):
            return value.replace("{a}", a)
        if isinstance(value, list):
            return [filled(item) for item in value]
        return {key: filled(item) for key, item in value.items()}

    response = api_client.post("/api/v1/tasks", {"runner": "noop", "after": filled(after)}, format="json")
    assert response.status_code == 400, response.json()
    assert "after" in response.json()["errors"]
    assert word in str(response.json()["errors"]["after"])


def test_another_owner_s_task_cannot_be_followed(api_client, other_client):
    theirs = _task(other_client)
    response = api_client.post("/api/v1/tasks", {"runner": "noop", "after": [{"task": theirs}]}, format="json")
    assert response.status_code == 400
    assert "No task" in " ".join(response.json()["errors"]["after"])
    mine = _task(api_client)
    response = api_client.patch(f"/api/v1/tasks/{mine}", {"after": [{"task": theirs}]}, format="json")
    assert response.status_code == 400 and "after" in response.json()["errors"]


def test_the_schema_documents_after_and_the_execution_s_workflow_fields(api_client):
    schema = api_client.get("/api/schema/?format=json").json()
    components = schema["components"]["schemas"]
    assert "after" in components["TaskCreateNoopRequest"]["properties"]
    assert "after" in components["PatchedTaskUpdateNoopRequest"]["properties"]
    assert "after" in components["Task"]["properties"]
    execution = components["Execution"]["properties"]
    assert {"workflow_run", "upstream", "input"} <= set(execution)


def test_the_cycle_error_names_the_tasks_with_ids_only_where_names_repeat(api_client):
    """Issue 44, item 12: the cycle error named task UUIDs only."""
    a = _task(api_client, name="extract")
    b = _task(api_client, name="step", after=[{"task": a}])
    c = _task(api_client, name="step", after=[{"task": b}])
    response = api_client.patch(f"/api/v1/tasks/{a}", {"after": [{"task": c}]}, format="json")
    assert response.status_code == 400
    (message,) = response.json()["errors"]["after"]
    assert message == f"A cycle: 'extract' -> 'step' ({c}) -> 'step' ({b}) -> 'extract'."
