"""The main flows of the API, driven by the client openapi-python-client generates from the live
schema, with every request and response validated against that schema by openapi-core (the
``client_session`` fixture's transport): what an outside client meets, not what the project's own
tests send. The generated client authenticates with ``Authorization: Bearer <key>``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from tests.client.conftest import models


@pytest.fixture
def open_runners(settings):
    """The operator's allow-lists, which start empty for these runners, opened to this test's targets."""
    options = {
        "lambda": {"region_name": "us-east-1", "account_id": "123456789012", "allowed_functions": ["report"]},
        "function": {"allowed_urls": [FN_URL]},
        "kubernetes": {"allowed_namespaces": ["default"]},
        "email": {"allowed_recipients": ["ops@example.com"]},
    }
    runners = settings.TMS_RUNNERS
    settings.TMS_RUNNERS = runners | {
        alias: {**runners[alias], "OPTIONS": {**runners[alias].get("OPTIONS", {}), **extra}}
        for alias, extra in options.items()
    }


FN_URL = "http://127.0.0.1:9/async-function/"


def _minimal_tasks(start: datetime) -> dict[str, Any]:
    """Each runner's smallest task (the config fields its schema requires), one-shot at ``start``."""
    m = models()
    return {
        "http": m.TaskCreateHttpRequest(
            runner=m.HttpRunnerEnum.HTTP, config=m.HttpConfigRequest(url="http://127.0.0.1:9/hook"), start_at=start
        ),
        "subprocess": m.TaskCreateSubprocessRequest(
            runner=m.SubprocessRunnerEnum.SUBPROCESS,
            config=m.SubprocessConfigRequest(command=["echo", "hello"]),
            start_at=start,
        ),
        "kubernetes": m.TaskCreateKubernetesRequest(
            runner=m.KubernetesRunnerEnum.KUBERNETES,
            config=m.KubernetesConfigRequest(image="busybox:1.36"),
            start_at=start,
        ),
        "lambda": m.TaskCreateLambdaRequest(
            runner=m.LambdaRunnerEnum.LAMBDA, config=m.LambdaConfigRequest(function_name="report"), start_at=start
        ),
        "function": m.TaskCreateFunctionRequest(
            runner=m.FunctionRunnerEnum.FUNCTION,
            config=m.AsyncHttpFunctionConfigRequest(url=f"{FN_URL}report"),
            start_at=start,
        ),
        "email": m.TaskCreateEmailRequest(
            runner=m.EmailRunnerEnum.EMAIL,
            config=m.EmailConfigRequest(to=["ops@example.com"], subject="Nightly"),
            start_at=start,
        ),
        "sleep": m.TaskCreateSleepRequest(
            runner=m.SleepRunnerEnum.SLEEP, config=m.SleepConfigRequest(duration="1s"), start_at=start
        ),
        "noop": m.TaskCreateNoopRequest(runner=m.NoopRunnerEnum.NOOP, start_at=start),
    }


def _cursor(link: str | None) -> str | None:
    return parse_qs(urlparse(link).query)["cursor"][0] if link else None


def test_main_flows_through_the_generated_client(client_session, open_runners):
    s, m = client_session, models()
    now = datetime.now(UTC).replace(microsecond=0)
    tomorrow = now + timedelta(days=1)

    # Each runner's minimal task.
    for runner, body in _minimal_tasks(tomorrow).items():
        created = s.call("tasks.tasks_create", body=body, expect=201)
        assert (created.runner, created.status) == (runner, "ACTIVE"), runner

    # Each schedule kind: once (above), every N seconds, cron in a zone; a wall-clock start.
    interval = s.call(
        "tasks.tasks_create",
        body=m.TaskCreateNoopRequest(runner=m.NoopRunnerEnum.NOOP, name="every minute", interval="1m"),
        expect=201,
    )
    cron = s.call(
        "tasks.tasks_create",
        body=m.TaskCreateNoopRequest(
            runner=m.NoopRunnerEnum.NOOP,
            name="weekdays",
            cron="30 3 * * 1-5",
            timezone="Europe/Paris",
            start_at="2030-01-15T09:00:00",
        ),
        expect=201,
    )
    assert (interval.interval, cron.cron, cron.timezone) == (60.0, "30 3 * * 1-5", "Europe/Paris")
    assert cron.start_at == datetime(2030, 1, 15, 8, 0, tzinfo=UTC)  # 09:00 in Paris

    # PATCH one field; pause and resume.
    renamed = s.call(
        "tasks.tasks_partial_update", cron.id, body=m.PatchedTaskUpdateKeepRunnerRequest(name="weekday mornings")
    )
    assert (renamed.name, renamed.cron, renamed.timezone, renamed.status) == (
        "weekday mornings",
        "30 3 * * 1-5",
        "Europe/Paris",
        "ACTIVE",
    )
    assert s.call("tasks.tasks_pause_create", interval.id).status == "PAUSED"
    assert s.call("tasks.tasks_resume_create", interval.id).status == "ACTIVE"

    # Run now, three times; page through the executions by cursor, two at a time.
    triggered = [s.call("tasks.tasks_trigger_create", cron.id, expect=201) for _ in range(3)]
    seen, cursor, pages = [], None, 0
    while True:
        page = s.call("executions.executions_list", task=cron.id, limit=2, **({"cursor": cursor} if cursor else {}))
        seen += [execution.id for execution in page.results]
        pages += 1
        cursor = _cursor(page.next_)
        if cursor is None:
            break
    assert sorted(seen) == sorted(execution.id for execution in triggered) and pages == 2
    listed = s.call("tasks.tasks_executions_list", cron.id)
    assert {execution.id for execution in listed.results} == set(seen)

    # Cancel one, retry it; read it back with its timeline.
    first = triggered[0].id
    s.call("executions.executions_cancel_create", first)
    assert s.call("executions.executions_retrieve", first).status == "CANCELLED"
    retried = s.call("executions.executions_retry_create", first, expect=201)
    assert retried.id != first and retried.status == "SCHEDULED"

    # Preview, why, occurrences.
    preview = s.call("tasks.tasks_preview_retrieve", cron.id, count=3)
    assert len(preview.fire_times) == 3
    schedule = s.call(
        "schedules.schedules_preview_create",
        body=m.SchedulePreviewRequest(cron="0 9 * * *", timezone="Asia/Tokyo", count=2),
    )
    assert len(schedule.fire_times) == 2
    why = s.call("tasks.tasks_why_retrieve", interval.id, at=now + timedelta(hours=1))
    assert why.skipped is None  # a real null, which the schema must admit
    occurrences = s.call(
        "tasks.tasks_occurrences_retrieve", interval.id, from_=now - timedelta(minutes=5), to=now + timedelta(minutes=5)
    )
    assert occurrences.items and all(occurrence.skip is None for occurrence in occurrences.items)

    # Notification channels and rules.
    channel = s.call(
        "notification_channels.notification_channels_create",
        body=m.ChannelRequest(
            name="ops",
            kind=m.KindEnum.WEBHOOK,
            target="http://127.0.0.1:9/hook",
            quiet_from="22:00",
            quiet_to="06:30",
            timezone="Europe/Paris",
        ),
        expect=201,
    )
    assert channel.quiet_from == "22:00"
    rotated = s.call("notification_channels.notification_channels_rotate_secret_create", channel.id)
    assert rotated.secret and rotated.secret != channel.secret
    rule = s.call(
        "notification_rules.notification_rules_create",
        body=m.RuleRequest(channel=channel.id, task=cron.id, on_retry=True, late_after="5m"),
        expect=201,
    )
    assert s.call("notification_rules.notification_rules_list").results[0].id == rule.id
    s.call("notification_rules.notification_rules_partial_update", rule.id, body=m.PatchedRuleRequest(enabled=False))
    s.call("notification_rules.notification_rules_destroy", rule.id, expect=204)
    s.call("notification_channels.notification_channels_destroy", channel.id, expect=204)

    # The audit log holds what this user did, newest first, by cursor pages too.
    audit = s.call("audit.audit_list", limit=5)
    assert len(audit.results) == 5 and _cursor(audit.next_)
    entry = s.call("audit.audit_retrieve", audit.results[0].id)
    assert entry.id == audit.results[0].id

    # Delete a task: gone from reads and from the list.
    deleted = s.call("tasks.tasks_destroy", interval.id)
    assert deleted.status == "DELETED"
    s.call("tasks.tasks_retrieve", interval.id, expect=404)
    tasks = s.call("tasks.tasks_list", limit=100)
    assert interval.id not in {task.id for task in tasks.results}

    assert s.call("notification_deliveries.notification_deliveries_list").results == []
    assert len(s.transport.exchanges) == 39  # each of them validated both ways
