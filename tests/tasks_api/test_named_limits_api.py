"""Named limits through the API: CRUD scoped by owner, global limits by staff, tasks referencing
them by name, current use, audit entries, and every bad input a 400 naming its field."""

from __future__ import annotations

import pytest

from executions.models import Execution
from tasks_app.models import AuditEntry, Limit, Task

pytestmark = pytest.mark.django_db

URL = "/api/v1/limits"
RATE = {"name": "api", "scope": "host", "windows": [{"count": 10, "seconds": 1}, {"count": 1000, "seconds": 3600}]}


def test_an_owner_creates_lists_changes_and_deletes_a_limit(api_client, other_client):
    created = api_client.post(URL, RATE, format="json")
    assert created.status_code == 201, created.data
    body = created.data
    assert body["windows"] == [{"count": 10, "seconds": 1.0}, {"count": 1000, "seconds": 3600.0}]
    assert body["is_global"] is False and body["usage"] == []
    assert [row["name"] for row in api_client.get(URL).data["results"]] == ["api"]
    assert other_client.get(URL).data["results"] == []  # another owner does not see it
    assert other_client.get(f"{URL}/{body['id']}").status_code == 404
    changed = api_client.patch(f"{URL}/{body['id']}", {"max_concurrency": 3}, format="json")
    assert changed.status_code == 200 and changed.data["max_concurrency"] == 3
    assert api_client.delete(f"{URL}/{body['id']}").status_code == 204
    actions = list(AuditEntry.objects.filter(object_type="limit").order_by("id").values_list("action", flat=True))
    assert actions == ["limit.create", "limit.update", "limit.delete"]
    update = AuditEntry.objects.get(action="limit.update")
    assert update.changes == {"max_concurrency": {"from": None, "to": 3}}


def test_a_task_references_limits_by_name_and_its_runs_are_claimed_checked(api_client):
    api_client.post(URL, RATE, format="json")
    api_client.post(URL, {"name": "two-at-once", "max_concurrency": 2}, format="json")
    response = api_client.post(
        "/api/v1/tasks", {"runner": "noop", "interval": "1m", "limits": ["api", "two-at-once"]}, format="json"
    )
    assert response.status_code == 201, response.data
    assert response.data["limits"] == ["api", "two-at-once"]
    task = Task.objects.get(pk=response.data["id"])
    assert task.has_limits
    assert Execution.objects.filter(task=task).exists()
    assert not Execution.objects.filter(task=task, exclusive=False).exists()  # routed to the checked claim
    cleared = api_client.patch(f"/api/v1/tasks/{task.pk}", {"limits": []}, format="json")
    assert cleared.status_code == 200 and cleared.data["limits"] == []
    task.refresh_from_db()
    assert not task.has_limits
    assert not Execution.objects.filter(task=task, status="SCHEDULED", exclusive=True).exists()
    entry = AuditEntry.objects.filter(object_type="task", action="update").latest("id")
    assert entry.changes["limits"] == {"from": ["api", "two-at-once"], "to": []}


def test_a_referenced_limit_cannot_be_deleted(api_client):
    limit = api_client.post(URL, {"name": "cap", "max_concurrency": 1}, format="json").data
    api_client.post("/api/v1/tasks", {"runner": "noop", "interval": "1m", "limits": ["cap"]}, format="json")
    response = api_client.delete(f"{URL}/{limit['id']}")
    assert response.status_code == 400 and "name" in response.data["errors"], response.data
    assert Limit.objects.filter(pk=limit["id"]).exists()


def test_global_limits_are_defined_by_staff_and_usable_by_every_owner(api_client, django_user_model):
    assert api_client.post(URL, {**RATE, "is_global": True}, format="json").status_code == 403
    admin = django_user_model.objects.create_superuser("root", password="pw")
    from tests.conftest import client_for

    staff = client_for(admin)
    created = staff.post(URL, {"name": "shared", "max_concurrency": 5, "is_global": True}, format="json")
    assert created.status_code == 201 and created.data["is_global"] is True and created.data["owner"] is None
    assert [row["name"] for row in api_client.get(URL).data["results"]] == ["shared"]
    assert api_client.patch(f"{URL}/{created.data['id']}", {"max_concurrency": 1}, format="json").status_code == 403
    task = api_client.post("/api/v1/tasks", {"runner": "noop", "interval": "1m", "limits": ["shared"]}, format="json")
    assert task.status_code == 201 and task.data["limits"] == ["shared"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "windows": [{"count": 5, "seconds": 0}]}, "windows"),  # a window of 0 s
        ({"name": "x", "windows": [{"count": 0, "seconds": 1}]}, "windows"),  # count 0
        ({"name": "x", "windows": [{"count": -1, "seconds": 1}]}, "windows"),
        ({"name": "x", "windows": [{"count": 5, "seconds": 1}, {"count": 9, "seconds": 1}]}, "windows"),
        ({"name": "x", "windows": [{"count": 5}]}, "windows"),
        ({"name": "x", "max_concurrency": 0}, "max_concurrency"),  # a cap of 0
        ({"name": "x"}, "windows"),  # no window and no cap
        ({"name": "x", "windows": []}, "windows"),
        ({"name": "", "max_concurrency": 1}, "name"),
        ({"name": "x", "max_concurrency": 1, "scope": "planet"}, "scope"),
        ({"name": "x", "max_concurrency": 1, "scope": "host", "key": "k"}, "key"),
        ({"name": "x", "max_concurrency": 1, "colour": "red"}, "colour"),
    ],
)
def test_a_limit_that_cannot_be_met_is_a_400_naming_the_field(api_client, body, field):
    response = api_client.post(URL, body, format="json")
    assert response.status_code == 400, response.data
    assert field in response.data["errors"], response.data
    assert not Limit.objects.exists()


def test_a_duplicate_name_is_a_400_on_name(api_client):
    assert api_client.post(URL, {"name": "x", "max_concurrency": 1}, format="json").status_code == 201
    response = api_client.post(URL, {"name": "x", "max_concurrency": 2}, format="json")
    assert response.status_code == 400 and "name" in response.data["errors"], response.data
    other = api_client.post(URL, {"name": "y", "max_concurrency": 2}, format="json").data
    renamed = api_client.patch(f"{URL}/{other['id']}", {"name": "x"}, format="json")
    assert renamed.status_code == 400 and "name" in renamed.data["errors"]


def test_a_change_that_leaves_nothing_is_a_400(api_client):
    limit = api_client.post(URL, {"name": "x", "max_concurrency": 1}, format="json").data
    response = api_client.patch(f"{URL}/{limit['id']}", {"max_concurrency": None}, format="json")
    assert response.status_code == 400 and "windows" in response.data["errors"], response.data
    assert Limit.objects.get(pk=limit["id"]).max_concurrency == 1


@pytest.mark.parametrize("limits", [["nope"], ["x", "x"], "x", [1]])
def test_an_unknown_or_repeated_limit_on_a_task_is_a_400_on_limits(api_client, other_client, limits):
    api_client.post(URL, {"name": "x", "max_concurrency": 1}, format="json")
    other_client.post(URL, {"name": "nope", "max_concurrency": 1}, format="json")  # not the caller's
    response = api_client.post("/api/v1/tasks", {"runner": "noop", "interval": "1m", "limits": limits}, format="json")
    assert response.status_code == 400, response.data
    assert "limits" in response.data["errors"], response.data
    assert not Task.objects.exists()


def test_usage_lists_slots_and_starts_per_bucket(api_client, user):
    from executions.limits import limits_take
    from tests.factories import ExecutionFactory

    api_client.post(URL, {"name": "cap", "max_concurrency": 2, "windows": [{"count": 5, "seconds": 60}]}, format="json")
    task_id = api_client.post(
        "/api/v1/tasks", {"runner": "noop", "interval": "1h", "limits": ["cap"]}, format="json"
    ).data["id"]
    execution = ExecutionFactory(task_id=task_id, status="RUNNING")
    grant = limits_take(
        execution_id=execution.pk, task_id=task_id, runner="noop", config={}, waiting_on=None, lease_seconds=30
    )
    from executions.limits import limits_record_start

    limits_record_start(execution_id=execution.pk, buckets=grant.rate_buckets)  # type: ignore[union-attr]
    usage = api_client.get(URL).data["results"][0]["usage"]
    assert usage == [
        {"key": "cap", "slots_held": 1, "waiting": 0, "windows": [{"count": 5, "seconds": 60.0, "starts": 1}]}
    ]


def test_an_owner_sees_only_their_own_use_of_a_global_host_limit(user, other_user, api_client, staff_client):
    """Issue 27, finding 11: no other owner's target hosts, slots or waiting runs."""
    from datetime import timedelta

    from django.utils import timezone

    from executions.models import ExecutionStatus, LimitBucket, LimitSlot, LimitStart
    from tasks_api.limits import limit_create
    from tests.factories import ExecutionFactory, TaskFactory

    limit = limit_create(
        owner=None, name="hosts", scope="host", max_concurrency=5, windows=[{"count": 9, "seconds": 60}]
    )
    theirs = LimitBucket.objects.create(limit=limit, key="private-partner.other-owner.example")
    mine = LimitBucket.objects.create(limit=limit, key="api.mine.example")
    later = timezone.now() + timedelta(hours=1)
    for bucket, owner, waiting in ((theirs, other_user, 3), (mine, user, 1)):
        task = TaskFactory(owner=owner)
        for index in range(waiting):
            ExecutionFactory(task=task, scheduled_for=later + timedelta(minutes=index), waiting_on=bucket.pk)
        running = ExecutionFactory(task=task, status=ExecutionStatus.RUNNING, scheduled_for=later - timedelta(hours=2))
        LimitSlot.objects.create(bucket=bucket, execution=running, expires_at=later)
        LimitStart.objects.create(bucket=bucket, at=timezone.now())
    (row,) = [item for item in api_client.get(URL).data["results"] if item["name"] == "hosts"]
    assert row["usage"] == [
        {
            "key": "api.mine.example",
            "slots_held": 1,
            "waiting": 1,
            "windows": [{"count": 9, "seconds": 60.0, "starts": None}],
        }
    ]
    assert "other-owner" not in api_client.get(f"{URL}/{row['id']}").content.decode()
    # Staff, who run the platform, see every budget.
    usage = staff_client.get(f"{URL}/{row['id']}").data["usage"]
    assert [(u["key"], u["slots_held"], u["waiting"], u["windows"][0]["starts"]) for u in usage] == [
        ("api.mine.example", 1, 1, 1),
        ("private-partner.other-owner.example", 1, 3, 1),
    ]
