"""Version 1 of a new task is written lazily, from its create audit entry (issue 50): a create
writes the task and its audit entry only, and the first read of its versions (or its first
change) writes version 1 with exactly the snapshot, author, source and time a create wrote
before."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from tasks_api.creation import _created_values, task_bulk_create
from tasks_api.limits import limit_create
from tasks_app.audit import audit_context, audit_diff, audit_values
from tasks_app.models import AuditAction, AuditEntry, TaskVersion
from tasks_app.versions import version_first_ensure, version_snapshot

pytestmark = pytest.mark.django_db

SECRET = "Bearer sk-live-lazy-0123456789"
LATER = timezone.now() + timedelta(days=1)


def _eager(task, limits, after) -> dict:
    """What a create wrote as version 1 before versions were lazy (as it reads back)."""
    snapshot = version_snapshot(_created_values(task, limits, after))
    return json.loads(json.dumps(snapshot, cls=DjangoJSONEncoder))


def _diff(task, limits, after) -> dict:
    """The create entry's changes: every audited value from nothing (audit_diff, the reference)."""
    changes = audit_diff({}, audit_values(_created_values(task, limits, after)))
    return json.loads(json.dumps(changes, cls=DjangoJSONEncoder))


def test_every_task_of_a_bulk_create_reads_its_version_1_as_a_create_wrote_it(api_client, user):
    limit_create(owner=user, name="api", max_concurrency=2)
    (upstream,) = task_bulk_create(owner=user, specs=[{"runner": "noop", "start_at": LATER}])
    specs = [
        {"runner": "noop", "name": "plain", "start_at": LATER},
        {"runner": "noop", "name": "every minute", "interval": timedelta(minutes=1), "priority": 7},
        {"runner": "noop", "name": "cron", "cron": "*/5 * * * *", "timezone": "Europe/Paris", "limits": ["api"]},
        {"runner": "noop", "name": "follows", "after": [{"task": str(upstream.pk)}]},
        {
            "runner": "http",
            "name": "secret",
            "start_at": LATER,
            "end_at": LATER + timedelta(days=3),
            "config": {"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": SECRET}},
        },
    ]
    with audit_context(source="command:test", actor_name="ops"):
        tasks = task_bulk_create(owner=user, specs=specs)
    assert TaskVersion.objects.filter(task__in=tasks).count() == 0  # nothing written per task but the entry
    links = {tasks[2].pk: (["api"], []), tasks[3].pk: ([], [{"task": str(upstream.pk), "on": "success"}])}
    expected = {task.pk: _eager(task, *links.get(task.pk, ([], []))) for task in tasks}
    assert expected[tasks[3].pk]["after"] and expected[tasks[2].pk]["limits"] == ["api"]
    for task in tasks:
        entry = AuditEntry.objects.get(task_id=task.pk, action=AuditAction.CREATE)
        assert entry.changes == _diff(task, *links.get(task.pk, ([], []))), task.name
        listed = api_client.get(f"/api/v1/tasks/{task.pk}/versions").json()["results"]
        assert len(listed) == 1, listed
        (version,) = listed
        assert version["number"] == 1 and version["changed"] == []
        assert version["actor"] == "ops" and version["source"] == "command:test"
        assert version["settings"] == expected[task.pk], task.name
        assert TaskVersion.objects.get(task=task).created_at == entry.at
        assert SECRET not in json.dumps(version)
    version_first_ensure(tasks[0].pk)  # again: nothing more
    assert TaskVersion.objects.filter(task__in=tasks).count() == len(tasks)


def test_a_first_change_writes_version_1_before_its_own_and_diffs_against_it(api_client, user):
    (task,) = task_bulk_create(owner=user, specs=[{"runner": "noop", "name": "before", "start_at": LATER}])
    assert api_client.patch(f"/api/v1/tasks/{task.pk}", {"name": "after"}, format="json").status_code == 200
    listed = api_client.get(f"/api/v1/tasks/{task.pk}/versions").json()["results"]
    assert [(v["number"], v["settings"]["name"], v["changed"]) for v in listed] == [
        (2, "after", ["name"]),
        (1, "before", []),
    ]
    assert listed[1]["settings"] == _eager(task, [], [])


def test_a_task_without_a_create_entry_gets_no_version_from_nothing(user):
    (task,) = task_bulk_create(owner=user, specs=[{"runner": "noop", "start_at": LATER}])
    AuditEntry.objects.filter(task_id=task.pk).delete()  # as a task inserted by SQL has none
    version_first_ensure(task.pk)
    assert not TaskVersion.objects.filter(task=task).exists()


def test_the_admins_versions_list_searched_by_a_task_shows_its_unread_version_1(django_user_model, user):
    """The admin's list of every task's versions, searched by a task's id or name, shows version 1
    of a task that nothing has read yet (it lists stored rows: version 1 is written when needed)."""
    from django.test import Client

    admin = django_user_model.objects.create_superuser(username="boss", password="boss-password")
    client = Client()
    client.force_login(admin)
    first, second = task_bulk_create(
        owner=user,
        specs=[{"runner": "noop", "name": "nightly export", "start_at": LATER}, {"runner": "noop", "start_at": LATER}],
    )
    assert not TaskVersion.objects.exists()
    for term, task in ((str(first.pk), first), ("nightly export", first), (str(second.pk), second)):
        response = client.get("/admin/tasks_app/taskversion/", {"q": term})
        assert response.status_code == 200
        assert [(v.task_id, v.number) for v in response.context["cl"].result_list] == [(task.pk, 1)], term
    # An unsearched list writes nothing for the tasks it does not name.
    TaskVersion.objects.all().delete()
    assert client.get("/admin/tasks_app/taskversion/").status_code == 200
    assert not TaskVersion.objects.exists()
