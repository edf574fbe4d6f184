"""A link's condition and a task's join rule in the API (issue 48, item 2): accepted on create and
update, shown, audited, and refused with a 400 naming the field (never a 500)."""

from __future__ import annotations

import pytest

from tasks_api.editing import task_update
from tasks_app.models import AuditEntry, Task, TaskDependency
from tms_core.errors import InvalidInput

pytestmark = pytest.mark.django_db

IS_OK = {"path": "$.status", "op": "==", "value": "ok"}


def _task(client, **fields) -> str:
    response = client.post("/api/v1/tasks", {"runner": "noop", **fields}, format="json")
    assert response.status_code == 201, response.json()
    return str(response.json()["id"])


def test_a_condition_and_a_join_are_created_shown_changed_and_audited(api_client):
    a, b = _task(api_client, name="a"), _task(api_client, name="b")
    cond = {"any": [IS_OK, {"path": "$.items.length", "op": ">", "value": 0}]}
    c = _task(api_client, join="one_success", after=[{"task": a, "condition": cond}, {"task": b}])
    shown = api_client.get(f"/api/v1/tasks/{c}").json()
    assert shown["join"] == "one_success"
    assert sorted(shown["after"], key=lambda entry: entry["task"] != a) == [
        {"task": a, "on": "success", "condition": cond},
        {"task": b, "on": "success"},
    ]
    assert TaskDependency.objects.get(task_id=c, upstream_id=a).condition == cond
    assert api_client.get(f"/api/v1/tasks/{a}").json()["join"] == "all_success", "the default"
    response = api_client.patch(f"/api/v1/tasks/{c}", {"join": "all_done", "after": [{"task": a}]}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["join"] == "all_done" and response.json()["after"] == [{"task": a, "on": "success"}]
    (entry,) = AuditEntry.objects.filter(task_id=c, action="update")
    assert entry.changes["join"] == {"from": "one_success", "to": "all_done"}
    (before,) = [link for link in entry.changes["after"]["from"] if link["task"] == a]
    assert before == {"task": a, "on": "success", "condition": cond}


@pytest.mark.parametrize(
    ("condition", "words"),
    [
        ({"path": "$.status", "op": "like", "value": "ok"}, "unknown op 'like'"),
        ({"path": "status", "op": "==", "value": 1}, "path must be a text starting with $"),
        ({"path": "$.a..b", "op": "==", "value": 1}, "cannot read"),
        ({"path": "$.a", "op": "in", "value": 1}, "needs a list value"),
        ({"path": "$.a", "op": "<", "value": [1]}, "needs a number or a text value"),
        ({"path": "$.a", "op": "=="}, "needs a value"),
        ({"any": []}, "non-empty list"),
        ({"all": [IS_OK], "any": [IS_OK]}, "stands alone"),
        ({"path": "$.a", "op": "==", "value": 1, "extra": 2}, "unknown key 'extra'"),
        ("$.a == 1", "expected an object"),
    ],
)
def test_a_bad_condition_is_a_400_naming_the_field(api_client, condition, words):
    a = _task(api_client)
    response = api_client.post(
        "/api/v1/tasks", {"runner": "noop", "after": [{"task": a, "condition": condition}]}, format="json"
    )
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]["after"]
    assert "condition" in str(errors) and words in str(errors), errors
    # The service says the same to its other callers (the admin, commands), on ``after``.
    task = Task.objects.get(pk=a)
    with pytest.raises(InvalidInput) as refused:
        task_update(task=task, actor="test", changes={"after": [{"task": _task(api_client), "condition": condition}]})
    assert words in refused.value.errors["after"][0] and "Entry 0: condition:" in refused.value.errors["after"][0]


def test_a_bad_join_and_links_it_would_ignore_are_400s(api_client):
    a = _task(api_client, name="a")
    response = api_client.post("/api/v1/tasks", {"runner": "noop", "join": "some_success"}, format="json")
    assert response.status_code == 400 and "join" in response.json()["errors"]
    response = api_client.post(
        "/api/v1/tasks", {"runner": "noop", "join": "all_done", "after": [{"task": a, "on": "failure"}]}, format="json"
    )
    assert response.status_code == 400 and "does not read a link's on" in response.json()["errors"]["after"][0]
    response = api_client.post(
        "/api/v1/tasks",
        {"runner": "noop", "join": "none_failed", "after": [{"task": a, "condition": IS_OK}]},
        format="json",
    )
    assert response.status_code == 400 and "does not read conditions" in response.json()["errors"]["after"][0]
    # A join changed alone is checked against the links the task has: the error is on join.
    b = _task(api_client, after=[{"task": a, "condition": IS_OK}])
    response = api_client.patch(f"/api/v1/tasks/{b}", {"join": "all_done"}, format="json")
    assert response.status_code == 400 and "does not read conditions" in response.json()["errors"]["join"][0]
    assert Task.objects.get(pk=b).join == "all_success"
    response = api_client.patch(f"/api/v1/tasks/{b}", {"join": "one_failed"}, format="json")
    assert response.status_code == 200 and response.json()["join"] == "one_failed"


def test_the_schema_documents_join_and_condition(api_client):
    schema = api_client.get("/api/schema/?format=json").json()["components"]["schemas"]
    assert set(schema["AfterEntry"]["properties"]) >= {"task", "on", "condition"}
    assert "one_success" in str(schema["TaskCreateNoopRequest"]["properties"]["join"])
