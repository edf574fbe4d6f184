"""Channel and rule changes are in the audit log, with the Slack URL and signing secret kept out."""

from __future__ import annotations

import pytest

from tasks_app.models import AuditEntry
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

CHANNELS, RULES = "/api/v1/notification-channels", "/api/v1/notification-rules"


def test_channel_and_rule_changes_are_audited_from_the_api(api_client, user):
    hook = api_client.post(
        CHANNELS, {"name": "ops", "kind": "webhook", "target": "https://hooks.example.com/tms"}, format="json"
    ).data
    slack = api_client.post(
        CHANNELS,
        {"name": "chat", "kind": "slack", "target": "https://hooks.slack.com/services/T0/B0/sekrit"},
        format="json",
    ).data
    assert api_client.patch(f"{CHANNELS}/{hook['id']}", {"name": "oncall"}, format="json").status_code == 200
    task = TaskFactory(owner=user)
    rule = api_client.post(RULES, {"channel": hook["id"], "task": str(task.pk), "on_failure": True}, format="json")
    assert rule.status_code == 201, rule.data
    assert api_client.patch(f"{RULES}/{rule.data['id']}", {"on_retry": True}, format="json").status_code == 200
    assert api_client.delete(f"{RULES}/{rule.data['id']}").status_code == 204
    assert api_client.delete(f"{CHANNELS}/{slack['id']}").status_code == 204

    entries = list(AuditEntry.objects.order_by("id"))
    assert [(e.action, e.object_type) for e in entries] == [
        ("channel.create", "channel"),
        ("channel.create", "channel"),
        ("channel.update", "channel"),
        ("rule.create", "rule"),
        ("rule.update", "rule"),
        ("rule.delete", "rule"),
        ("channel.delete", "channel"),
    ]
    assert all(e.owner_id == user.pk and e.source == "api" and e.actor_id == user.pk for e in entries)
    assert entries[2].changes == {"name": {"from": "ops", "to": "oncall"}}
    assert entries[4].changes == {"on_retry": {"from": False, "to": True}}
    assert entries[3].task_id == task.pk
    text = str([e.changes for e in entries])
    assert "sekrit" not in text and hook["secret"] not in text
    listed = api_client.get("/api/v1/audit", {"action": "rule.update"}).data["results"]
    assert [item["object_id"] for item in listed] == [str(rule.data["id"])]
