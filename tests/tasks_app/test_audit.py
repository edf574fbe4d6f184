"""The audit log (issue 14): every user action from the API, the admin, the back office and
commands, with who, when, from where and what changed (secrets masked); ``GET /api/v1/audit``."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from executions.models import Execution
from tasks_api.creation import task_create
from tasks_api.lifecycle import task_pause
from tasks_app.audit import audit_context, audit_record
from tasks_app.masking import MASK
from tasks_app.models import AuditEntry, Task, TaskStatus
from tests.conftest import client_for
from tests.factories import ExecutionFactory

pytestmark = pytest.mark.django_db

SECRET = "Bearer audit-secret-77"


def _actions(**filters) -> list[tuple[str, str, str]]:
    return list(AuditEntry.objects.filter(**filters).order_by("id").values_list("action", "source", "actor_name"))


def test_every_api_action_is_recorded_with_who_where_and_what(user, api_client):
    body = {
        "name": "nightly",
        "runner": "http",
        "config": {"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": SECRET}},
        "cron": "0 3 * * *",
        "start_at": "2025-12-01T00:00:00Z",
        "misfire_policy": "skip",
    }
    created = api_client.post("/api/v1/tasks", body, format="json", REMOTE_ADDR="203.0.113.7")
    assert created.status_code == 201, created.data
    url = f"/api/v1/tasks/{created.data['id']}"
    assert api_client.patch(url, {"priority": 8, "name": "nightly-2"}, format="json").status_code == 200
    assert api_client.post(f"{url}/pause").status_code == 200
    assert api_client.post(f"{url}/pause").status_code == 200  # already paused: changes nothing, no entry
    assert api_client.post(f"{url}/resume").status_code == 200
    triggered = api_client.post(f"{url}/trigger")
    assert triggered.status_code == 201
    backfill = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-03T12:00:00Z"}
    assert api_client.post(f"{url}/backfill", backfill, format="json").status_code == 201
    execution = triggered.data["id"]
    assert api_client.post(f"/api/v1/executions/{execution}/cancel").status_code == 200
    assert api_client.post(f"/api/v1/executions/{execution}/retry").status_code == 201
    assert api_client.delete(url).status_code in (200, 202)

    task_id = created.data["id"]
    assert _actions(task_id=task_id) == [
        (action, "api", "alice")
        for action in ("create", "update", "pause", "resume", "trigger", "backfill", "cancel", "retry", "delete")
    ]
    entries = {entry.action: entry for entry in AuditEntry.objects.filter(task_id=task_id)}
    assert entries["create"].remote_addr == "203.0.113.7"
    assert entries["create"].owner_id == user.pk and entries["create"].actor_id == user.pk
    assert entries["create"].changes["config"]["to"]["headers"] == {"Authorization": MASK}
    assert entries["update"].changes == {
        "name": {"from": "nightly", "to": "nightly-2"},
        "priority": {"from": 5, "to": 8},
    }
    assert entries["backfill"].changes["created"] == 3
    assert (entries["cancel"].object_type, entries["cancel"].object_id) == ("execution", str(execution))
    assert entries["delete"].changes == {"status": {"from": "ACTIVE", "to": "DELETED"}}
    assert SECRET not in json.dumps(list(AuditEntry.objects.values_list("changes", flat=True)))


def test_the_audit_api_is_owner_scoped_filtered_and_cursor_paged(user, other_user, api_client, staff_client):
    later = timezone.now() + timedelta(days=1)
    mine = [task_create(owner=user, runner="noop", start_at=later, name=f"t{i}") for i in range(3)]
    theirs = task_create(owner=other_user, runner="noop", start_at=later)
    task_pause(task=mine[0], actor="test")

    def ids(client, query=""):
        response = client.get(f"/api/v1/audit{query}")
        assert response.status_code == 200, response.content
        return [(item["action"], item["task_id"]) for item in response.json()["results"]]

    assert ids(api_client) == [("pause", str(mine[0].pk))] + [("create", str(t.pk)) for t in reversed(mine)]
    assert ("create", str(theirs.pk)) in ids(staff_client)  # staff see everyone's
    assert ids(client_for(other_user)) == [("create", str(theirs.pk))]
    assert ids(api_client, f"?task={mine[0].pk}") == [("pause", str(mine[0].pk)), ("create", str(mine[0].pk))]
    assert ids(api_client, "?action=pause") == [("pause", str(mine[0].pk))]
    assert ids(staff_client, "?user=system") == ids(staff_client)  # services called without a context
    assert ids(api_client, "?user=alice") == []
    future = (timezone.now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert ids(api_client, f"?since={future}") == [] and len(ids(api_client, f"?until={future}")) == 4
    # Cursor pages: no count, a next link, and every entry exactly once.
    first = api_client.get("/api/v1/audit?limit=3").json()
    assert "count" not in first and len(first["results"]) == 3 and first["next"]
    second = api_client.get(first["next"]).json()
    assert len(second["results"]) == 1 and second["next"] is None
    # The one keyset paging of lists that grow (as the executions and deliveries): a previous link
    # back to the first page, and offsets refused.
    assert api_client.get(second["previous"]).json()["results"] == first["results"]
    assert api_client.get("/api/v1/audit?offset=3").status_code == 400
    # Another owner's entry is a 404, as their task is.
    entry = AuditEntry.objects.get(task_id=theirs.pk)
    assert api_client.get(f"/api/v1/audit/{entry.pk}").status_code == 404
    assert staff_client.get(f"/api/v1/audit/{entry.pk}").status_code == 200
    for bad in ("?task=nope", "?since=yesterday", "?task=", "?cursor=nope", "?limit=0", "?limit=x"):
        assert api_client.get(f"/api/v1/audit{bad}").status_code == 400, bad


def test_admin_actions_are_recorded_as_admin(admin_client, admin_user, user):
    task = task_create(owner=user, runner="noop", cron="0 * * * *")
    response = admin_client.post(
        "/admin/tasks_app/task/", {"action": "pause_selected", "_selected_action": [str(task.pk)]}
    )
    assert response.status_code == 302
    entry = AuditEntry.objects.get(task_id=task.pk, action="pause")
    who = (entry.source, entry.actor_id, entry.owner_id, entry.remote_addr)
    assert who == ("admin", admin_user.pk, user.pk, "127.0.0.1")
    assert admin_client.get(f"/admin/tasks_app/auditentry/{entry.pk}/change/").status_code == 200


def test_back_office_actions_are_recorded_and_listed_on_the_task_page(user):
    task = task_create(owner=user, runner="noop", cron="0 * * * *", name="bo")
    client = Client()
    client.force_login(user)
    assert client.post(f"/ui/tasks/{task.pk}/pause/").status_code == 302
    assert _actions(task_id=task.pk) == [("create", "system", "system"), ("pause", "backoffice", "alice")]
    page = client.get(f"/ui/tasks/{task.pk}/").content.decode()
    assert 'id="recent-changes"' in page and "backoffice" in page and "ACTIVE" in page and "PAUSED" in page


def test_command_actions_are_recorded_as_the_command(user):
    task = task_create(owner=user, runner="noop", cron="0 * * * *")
    out = io.StringIO()
    call_command("tms_task", "pause", str(task.pk), stdout=out)
    call_command("tms_task", "run", str(task.pk), stdout=out)
    assert "status PAUSED" in out.getvalue() and "created, due now" in out.getvalue()
    entries = list(AuditEntry.objects.filter(task_id=task.pk).exclude(action="create").order_by("id"))
    assert [(e.action, e.source, e.actor_id) for e in entries] == [
        ("pause", "command:tms_task", None),
        ("trigger", "command:tms_task", None),
    ]
    assert entries[0].actor_name  # the operating-system user who ran it
    with pytest.raises(CommandError, match="No such task"):
        call_command("tms_task", "delete", "00000000-0000-0000-0000-000000000000", stdout=io.StringIO())
    with pytest.raises(CommandError, match="not a task id"):
        call_command("tms_task", "delete", "nope", stdout=io.StringIO())
    assert Task.objects.get(pk=task.pk).status == TaskStatus.PAUSED


def test_other_apps_record_their_own_objects(user):
    """What a notifications app calls for its channels and rules."""
    with audit_context(source="api", actor=user, remote_addr="198.51.100.1"):
        entry = audit_record(
            action="channel.update",
            object_type="channel",
            object_id=7,
            owner=user,
            changes={"url": {"from": "https://a", "to": "https://b"}},
        )
    entry.refresh_from_db()
    assert (entry.actor_name, entry.source, entry.remote_addr, entry.object_id) == ("alice", "api", "198.51.100.1", "7")


def test_a_refused_action_records_nothing(user, other_client):
    task = task_create(owner=user, runner="noop", cron="0 * * * *")
    execution = ExecutionFactory(task=task)
    assert other_client.post(f"/api/v1/tasks/{task.pk}/pause").status_code == 404
    assert other_client.post(f"/api/v1/executions/{execution.pk}/cancel").status_code == 404
    assert AuditEntry.objects.exclude(action="create").count() == 0
    assert Execution.objects.get(pk=execution.pk).status == "SCHEDULED"
