"""notification_target values become a channel and a rule (notifications 0002, tasks_app 0010);
channels' targets and secrets written before 0004 are encrypted by it."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from notifications.models import Channel, Rule

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("notifications", "0001_initial"), ("tasks_app", "0009_task_retention")]
AFTER = [("notifications", "0002_rules_from_notification_target"), ("tasks_app", "0010_remove_notification_target")]


def test_old_targets_become_channels_and_rules_on_final_failure(django_user_model):
    try:
        owner = django_user_model.objects.create_user("carol")
        executor = MigrationExecutor(connection)
        executor.migrate(BEFORE)
        old = executor.loader.project_state(BEFORE).apps.get_model("tasks_app", "Task")
        common = {"owner_id": owner.pk, "runner": "noop", "start_at": timezone.now()}
        hook = [
            old.objects.create(name=f"h{i}", notification_target="https://hooks.example.com/x", **common)
            for i in range(2)
        ]
        mail = old.objects.create(name="m", notification_target="ops@example.com", **common)
        old.objects.create(name="junk", notification_target="call me", **common)
        old.objects.create(name="none", notification_target="", **common)
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        with connection.cursor() as cursor:
            cursor.execute("SELECT target, secret FROM notifications_channel WHERE secret <> ''")
            ((plain_target, plain_secret),) = cursor.fetchall()
        assert plain_target == "https://hooks.example.com/x" and len(plain_secret) == 64
        # Then to the latest schema: 0004 encrypts the channels 0002 wrote in plain text.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        with connection.cursor() as cursor:
            cursor.execute("SELECT target, secret FROM notifications_channel")
            raw = cursor.fetchall()
        assert len(raw) == 2 and all(target.startswith("$enc:") for target, _ in raw), raw
        assert "hooks.example.com" not in str(raw) and plain_secret not in str(raw) and "ops@" not in str(raw)
        channels = {c.target: c for c in Channel.objects.all()}
        assert channels["https://hooks.example.com/x"].secret == plain_secret
        assert set(channels) == {"https://hooks.example.com/x", "ops@example.com"}
        assert (
            channels["https://hooks.example.com/x"].kind == "webhook" and channels["https://hooks.example.com/x"].secret
        )
        assert channels["ops@example.com"].kind == "email"
        rules = {
            (r.task_id, r.channel.target, r.on_failure, r.on_recovery) for r in Rule.objects.select_related("channel")
        }
        assert rules == {
            (hook[0].pk, "https://hooks.example.com/x", True, False),
            (hook[1].pk, "https://hooks.example.com/x", True, False),
            (mail.pk, "ops@example.com", True, False),
        }
    finally:
        # Back to the latest schema whatever happened: later tests need every migration applied.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
