"""A task's versions in the back office (issue 46): the list (who, when, from where, what
changed), one version's settings and its diff to the current one, and "Restore this version"
through the API's restore service (an editor's change, audited); a viewer and an operator see
no restore button and are refused."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tasks_api.creation import task_create
from tasks_api.editing import task_update
from tasks_app.models import AuditEntry, Task, TaskVersion

pytestmark = pytest.mark.django_db


@pytest.fixture
def versioned(crew):
    admin = crew["people"]["admin"]
    task = task_create(
        owner=admin,
        team=crew["team"],
        runner="noop",
        name="versioned",
        start_at=timezone.now() + timedelta(days=1),
        max_attempts=3,
    )
    task = task_update(task=task, actor="crew-admin", changes={"max_attempts": 5})
    task = task_update(task=task, actor="crew-admin", changes={"priority": 8})
    return task


def test_the_list_names_each_version_with_who_when_and_what(client, crew, versioned):
    client.force_login(crew["people"]["viewer"])
    assert (
        f'href="/ui/tasks/{versioned.pk}/versions/" id="versions"'
        in client.get(f"/ui/tasks/{versioned.pk}/").content.decode()
    )
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/ui/tasks/{versioned.pk}/versions/")
    # 7 with the user's team ids, read before the task (tasks_app.teams.scope_to_teams).
    assert page.status_code == 200 and len(queries) <= 7, [q["sql"] for q in queries]
    assert [v.number for v in page.context["versions"]] == [3, 2, 1]
    html = page.content.decode()
    assert "priority" in html and "max_attempts" in html and "created" in html and ">current<" in html


def test_a_version_shows_its_diff_and_an_editor_restores_it(client, crew, versioned):
    client.force_login(crew["people"]["editor"])
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/ui/tasks/{versioned.pk}/versions/1/")
    # 7 with the user's team ids, read before the task (tasks_app.teams.scope_to_teams).
    assert page.status_code == 200 and len(queries) <= 7, [q["sql"] for q in queries]
    html = page.content.decode()
    assert 'id="version-diff"' in html and 'class="diff-del">-  &quot;max_attempts&quot;: 3,' in html
    assert 'id="restore"' in html
    done = client.post(f"/ui/tasks/{versioned.pk}/versions/1/restore/")
    assert done["Location"] == f"/ui/tasks/{versioned.pk}/"
    task = Task.objects.get(pk=versioned.pk)
    first = TaskVersion.objects.get(task=versioned, number=1).snapshot
    assert (task.max_attempts, task.priority, task.version) == (3, first["priority"], 4) and task.priority != 8
    text = client.get(done["Location"]).content.decode()
    assert "Restored version 1: changed max_attempts, priority; the task is at version 4." in text
    entry = AuditEntry.objects.filter(task_id=task.pk, action="update").latest("id")
    assert entry.detail == "restored version 1" and entry.actor_name == "crew-editor"
    # The current version has no diff and no button.
    current = client.get(f"/ui/tasks/{versioned.pk}/versions/4/").content.decode()
    assert 'id="version-same"' in current and 'id="restore"' not in current
    assert client.get(f"/ui/tasks/{versioned.pk}/versions/99/").status_code == 404


def test_a_viewer_and_an_operator_see_no_restore_and_are_refused(client, crew, versioned):
    for role in ("viewer", "operator"):
        client.force_login(crew["people"][role])
        assert 'id="restore"' not in client.get(f"/ui/tasks/{versioned.pk}/versions/1/").content.decode()
        assert client.post(f"/ui/tasks/{versioned.pk}/versions/1/restore/").status_code == 403
    assert TaskVersion.objects.filter(task=versioned).count() == 3
    assert Task.objects.get(pk=versioned.pk).max_attempts == 5


def test_a_restore_the_service_refuses_says_why(client, crew, versioned, other_user):
    client.force_login(crew["people"]["editor"])
    gone = client.post(f"/ui/tasks/{versioned.pk}/versions/99/restore/")
    assert gone["Location"] == f"/ui/tasks/{versioned.pk}/versions/"
    assert "The task has no version 99." in client.get(gone["Location"]).content.decode()
    client.force_login(other_user)
    assert client.get(f"/ui/tasks/{versioned.pk}/versions/").status_code == 404
    assert client.post(f"/ui/tasks/{versioned.pk}/versions/1/restore/").status_code == 404
