"""Per-owner isolation: another user's ids answer 404 on every route and method, change nothing,
and never show up in lists; staff see everyone's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from executions.models import Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from tasks_app.models import Task
from tests.factories import ExecutionFactory, TaskFactory

pytestmark = pytest.mark.django_db

SOON = (timezone.now() + timedelta(hours=1)).isoformat()

#: (method, path template, body) for every route that names a task.
TASK_ROUTES = [
    ("get", "/api/v1/tasks/{id}", None),
    ("head", "/api/v1/tasks/{id}", None),
    ("options", "/api/v1/tasks/{id}", None),
    ("patch", "/api/v1/tasks/{id}", {"name": "hijacked"}),
    ("delete", "/api/v1/tasks/{id}", None),
    ("post", "/api/v1/tasks/{id}/pause", None),
    ("post", "/api/v1/tasks/{id}/resume", None),
    ("post", "/api/v1/tasks/{id}/trigger", None),
    ("post", "/api/v1/tasks/{id}/materialise", {"until": SOON}),
    ("get", "/api/v1/tasks/{id}/executions", None),
    ("get", "/api/v1/tasks/{id}/occurrences", None),
    ("options", "/api/v1/tasks/{id}/occurrences", None),
    ("options", "/api/v1/tasks/{id}/executions", None),
    ("options", "/api/v1/tasks/{id}/trigger", None),
    ("get", "/tasks/{id}", None),
    ("options", "/tasks/{id}", None),
]
#: The same for every route that names an execution.
EXECUTION_ROUTES = [
    ("get", "/api/v1/executions/{id}", None),
    ("head", "/api/v1/executions/{id}", None),
    ("options", "/api/v1/executions/{id}", None),
    ("options", "/api/v1/executions/{id}/retry", None),
    ("post", "/api/v1/executions/{id}/cancel", None),
    ("post", "/api/v1/executions/{id}/retry", None),
]


#: The same for every route that names an uploaded artifact.
ARTIFACT_ROUTES = [
    ("get", "/api/v1/artifacts/{id}", None),
    ("head", "/api/v1/artifacts/{id}", None),
    ("options", "/api/v1/artifacts/{id}", None),
    ("delete", "/api/v1/artifacts/{id}", None),
]


@pytest.fixture
def alices(user):
    """Alice's task with executions in every kind of state."""
    task = TaskFactory(owner=user, interval=timedelta(minutes=1))
    executions = {
        "scheduled": ExecutionFactory(task=task),
        "running": ExecutionFactory(task=task, status=S.RUNNING, lease_owner="w:1:1"),
        "failed": ExecutionFactory(task=task, status=S.FAILED),
    }
    return task, executions


def _snapshot() -> tuple:
    return (
        list(Task.objects.order_by("pk").values()),
        list(Execution.objects.order_by("pk").values()),
        ExecutionEvent.objects.count(),
    )


@pytest.mark.parametrize(("method", "path", "body"), TASK_ROUTES)
def test_another_users_task_answers_404_and_nothing_changes(alices, other_client, method, path, body):
    task, _ = alices
    before = _snapshot()
    response = getattr(other_client, method)(path.format(id=task.pk), body, format="json")
    assert response.status_code == 404, (method, path, response.content)
    if method != "head":
        assert response.json() == {"type": "not_found", "detail": "Not found."}
    assert _snapshot() == before


@pytest.mark.parametrize(("method", "path", "body"), EXECUTION_ROUTES)
@pytest.mark.parametrize("which", ["scheduled", "running", "failed"])
def test_another_users_execution_answers_404_and_nothing_changes(alices, other_client, method, path, body, which):
    _, executions = alices
    before = _snapshot()
    response = getattr(other_client, method)(path.format(id=executions[which].pk), body, format="json")
    assert response.status_code == 404, (method, path, response.content)
    if method != "head":
        assert response.json() == {"type": "not_found", "detail": "Not found."}
    assert _snapshot() == before


def test_another_users_rows_never_appear_in_lists_or_filters(alices, other_client):
    task, _ = alices
    assert other_client.get("/api/v1/tasks").json()["results"] == []
    assert other_client.get("/api/v1/executions").json()["results"] == []
    assert other_client.get(f"/api/v1/executions?task={task.pk}").json()["results"] == []
    assert other_client.get("/tasks").json() == []


def test_the_owner_reaches_every_route(alices, api_client):
    """The same routes work for the owner, so the 404s above are isolation, not broken routes."""
    task, executions = alices
    for method, path, body in EXECUTION_ROUTES:
        which = {"cancel": "scheduled", "retry": "failed"}.get(path.rsplit("/", 1)[-1], "running")
        response = getattr(api_client, method)(path.format(id=executions[which].pk), body, format="json")
        assert response.status_code in (200, 201, 202), (method, path, response.content)
    for method, path, body in TASK_ROUTES:
        if method == "delete":
            continue
        response = getattr(api_client, method)(path.format(id=task.pk), body, format="json")
        assert response.status_code in (200, 201), (method, path, response.content)
    assert api_client.options("/api/v1/tasks").status_code == 200
    assert api_client.delete(f"/api/v1/tasks/{task.pk}").status_code in (200, 202)


def test_staff_see_everyones_tasks_and_executions_but_change_none(alices, other_user, other_client, staff_client):
    alice_task, alice_executions = alices
    bob_task = TaskFactory(owner=other_user)
    bob_execution = ExecutionFactory(task=bob_task)

    tasks = {t["id"] for t in staff_client.get("/api/v1/tasks").json()["results"]}
    assert tasks == {str(alice_task.pk), str(bob_task.pk)}
    executions = {e["id"] for e in staff_client.get("/api/v1/executions").json()["results"]}
    assert executions == {bob_execution.pk, *(e.pk for e in alice_executions.values())}
    assert {t["id"] for t in staff_client.get("/tasks").json()} == tasks
    for task in (alice_task, bob_task):
        assert staff_client.get(f"/api/v1/tasks/{task.pk}").status_code == 200
        assert staff_client.get(f"/tasks/{task.pk}").status_code == 200
        assert staff_client.get(f"/api/v1/tasks/{task.pk}/executions").status_code == 200
    for execution in (bob_execution, *alice_executions.values()):
        assert staff_client.get(f"/api/v1/executions/{execution.pk}").status_code == 200
    # Read-only support: acting on another owner's execution is refused (a superuser may: test_staff_rule).
    assert staff_client.post(f"/api/v1/executions/{bob_execution.pk}/cancel").status_code == 403
    bob_execution.refresh_from_db()
    assert bob_execution.status == "SCHEDULED"
    # Bob still sees only his own.
    assert [t["id"] for t in other_client.get("/api/v1/tasks").json()["results"]] == [str(bob_task.pk)]


@pytest.mark.parametrize(("method", "path", "body"), ARTIFACT_ROUTES)
def test_another_users_artifact_answers_404_and_nothing_changes(
    user, api_client, other_client, settings, tmp_path, method, path, body
):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from tasks_app.models import Artifact

    settings.MEDIA_ROOT = str(tmp_path)
    upload = api_client.post("/api/v1/artifacts", {"file": SimpleUploadedFile("a.sh", b"echo")}, format="multipart")
    assert upload.status_code == 201, upload.content
    response = getattr(other_client, method)(path.format(id=upload.json()["id"]))
    assert response.status_code == 404, (method, path, response.content)
    assert Artifact.objects.filter(pk=upload.json()["id"]).exists()
    assert other_client.get("/api/v1/artifacts").json()["count"] == 0
