"""Data the browser tests look at: tasks with runs of every outcome, a skipped occurrence, a paused
task without a name, a notification channel with a rule and deliveries, a workflow run, a shared
team with members."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.contrib.auth import get_user_model

from executions.models import SkippedOccurrence
from notifications import services as notification_services
from notifications.models import Delivery
from tasks_api.creation import task_create
from tasks_api.lifecycle import task_pause
from tasks_app.teams.services import member_set, team_create
from tests.backoffice.helpers import run


def seed(owner) -> dict[str, object]:
    """A task with successes, a failure, a skipped occurrence and a rule; a paused task; a channel
    with a delivered and a failed delivery."""
    task = task_create(
        owner=owner, runner="noop", name="hourly report", cron="*/5 * * * *", timezone="Europe/Berlin",
        start_at=datetime.now(UTC) - timedelta(hours=1),
    )  # fmt: skip
    ok = run(task)
    failed = run(task, outcome="fail", error="upstream timed out")
    # Off the task's five-minute grid: the materialiser may have recorded the grid's past times itself.
    SkippedOccurrence.objects.update_or_create(
        task=task, scheduled_for=datetime.now(UTC).replace(second=30, microsecond=0) - timedelta(minutes=20),
        defaults={"reason": "overlap", "detail": "the previous run was still running"},
    )  # fmt: skip
    paused = task_create(owner=owner, runner="sleep", name="", config={"duration": "1s"}, interval=timedelta(hours=1))
    task_pause(task=paused, actor="test")
    channel = notification_services.channel_create(
        owner=owner, data={"name": "on-call", "kind": "email", "target": "oncall@example.com"}
    )
    notification_services.rule_create(owner=owner, data={"task": task, "channel": channel, "on_failure": True})
    for status, error in (("delivered", ""), ("failed", "SMTP server refused the connection")):
        Delivery.objects.create(
            channel=channel, task=task, event="failing", status=status, last_error=error, attempts=1,
            idempotency_key=f"key-{status}", payload={},
        )  # fmt: skip
    sleep = task_create(
        owner=owner, runner="sleep", name="sleep-3s", config={"duration": "3s"}, cron="*/5 * * * *",
        timezone="America/Argentina/Buenos_Aires",
    )  # fmt: skip
    run(sleep)
    # A workflow: extract, then load after it (its step waits); check runs on extract's failure.
    extract = task_create(
        owner=owner, runner="noop", name="extract rows", start_at=datetime.now(UTC) + timedelta(days=1)
    )
    for name, on in (("load rows", "success"), ("check rows", "failure")):
        task_create(owner=owner, runner="noop", name=name, after=[{"task": str(extract.pk), "on": on}])
    workflow_root = run(extract)
    # A shared team: the owner its admin, a member added by hand and one single sign-on granted.
    team = team_create(creator=owner, name="Platform", slug="platform")
    for username, role, sso in (("priya", "operator", True), ("ben", "viewer", False)):
        get_user_model().objects.create_user(username)
        member_set(team=team, username=username, role=role, sso=sso)
    return {
        "task": task, "ok": ok, "failed": failed, "paused": paused, "sleep": sleep, "channel": channel,
        "workflow_root": workflow_root, "team": team,
    }  # fmt: skip
