"""The embedded SQLite default (``make run`` without DATABASE_URL) fills the outbox too."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.embedded import run_on_embedded_sqlite

SCRIPT = textwrap.dedent(
    """
    from datetime import timedelta
    from django.contrib.auth import get_user_model
    from django.utils import timezone
    from executions import transitions
    from executions.models import SkippedOccurrence
    from notifications import dispatch, services
    from notifications.models import Delivery, Outbox
    from tasks_app.models import Task

    user = get_user_model().objects.create_user("solo")
    task = Task.objects.create(owner=user, team=user.personal_team, name="t", runner="noop", start_at=timezone.now())
    quiet = Task.objects.create(owner=user, team=user.personal_team, name="q", runner="noop", start_at=timezone.now())
    channel = services.channel_create(owner=user, data={"name": "c", "kind": "webhook", "target": "https://x.example/h"})
    services.rule_create(owner=user, data={"task": task, "channel": channel, "on_failure": True,
                                           "on_recovery": True, "on_skip": True, "late_after": timedelta(seconds=5)})

    def run(task, ok, late=0):
        due = timezone.now() - timedelta(seconds=late)
        (pk,) = transitions.executions_create(rows=[transitions.NewExecution(task.pk, due, 5)], actor="t")
        transitions.executions_take_due(limit=10, actor="m")
        assert transitions.execution_claim_loaded(execution_id=pk, attempt=1, worker_id="w", lease_seconds=60)
        if ok:
            transitions.execution_succeed(execution_id=pk, attempt=1, worker_id="w", output="", max_chars=10)
        else:
            transitions.execution_fail(execution_id=pk, attempt=1, worker_id="w", error="e", output="",
                                       retry_in=None, max_chars=10)

    for t in (task, quiet):
        run(t, False)
        run(t, False, late=30)
        run(t, True)
        SkippedOccurrence.objects.create(task=t, scheduled_for=timezone.now(), reason="paused")
    print(sorted(Outbox.objects.values_list("kind", flat=True)))
    print(dispatch.dispatch_outbox())
    print(list(Delivery.objects.order_by("id").values_list("event", flat=True)))
    """
)


def test_the_embedded_sqlite_default_fills_the_outbox(tmp_path: Path):
    lines = run_on_embedded_sqlite(tmp_path, SCRIPT, timeout=120).strip().splitlines()
    # Only the watched task: two failures, one late start, one success, one skip.
    assert lines[0] == "['failed', 'failed', 'late', 'skipped', 'succeeded']"
    assert lines[1] == "5"
    assert lines[2] == "['failing', 'late', 'recovered', 'skipped']"
