"""A PATCH of one field through the generated client changes that field and nothing else.

Every writable resource, with every other field away from its creation default: a request schema
that declares defaults makes the generated client send them, and the PATCH resets the object
(issue 26: a task PATCHed to ``priority: 7`` lost its name and cron, went to UTC and completed).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.client.conftest import models

#: Read-only fields a change may move: derived from the schedule or stamped on save (and the
#: task's version, which every change moves on: tests/tasks_api/test_task_versions.py).
DERIVED = {"updated_at", "next_run_at", "next_occurrence_at", "runs_materialised", "state", "version"}


def _fields(obj: Any) -> dict[str, Any]:
    return {key: value for key, value in obj.to_dict().items() if key not in DERIVED}


def _task_request(kind: str, limit_name: str) -> Any:
    m = models()
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)
    schedule: dict[str, Any] = {
        "once": {"start_at": start},
        "interval": {"start_at": start, "interval": 300, "end_at": start + timedelta(days=30), "max_runs": 100},
        "cron": {"cron": "30 3 * * 1-5", "end_at": start + timedelta(days=30)},
    }[kind]
    return m.TaskCreateHttpRequest(
        runner=m.HttpRunnerEnum.HTTP,
        name=f"nightly {kind}",
        config=m.HttpConfigRequest(url="http://127.0.0.1:9/hook", method=m.HttpConfigMethodEnum.POST),
        timezone="Europe/Paris",
        jitter=7,
        misfire_policy=m.MisfirePolicyEnum.SKIP,
        misfire_grace=120,
        catch_up_limit=7,
        overlap_policy=m.OverlapPolicyEnum.QUEUE_ONE,
        max_age=600,
        max_concurrency=3,
        limits=[limit_name],
        max_attempts=5,
        retry_backoff=3,
        retry_backoff_max=90,
        retry_jitter=False,
        timeout=45,
        priority=2,
        tracing_id="trace-1",
        expose_metrics=True,
        keep_last=50,
        keep_for="2d",
        keep_failed_longer=True,
        **schedule,
    )


@pytest.mark.parametrize("kind", ["once", "interval", "cron"])
def test_a_task_patched_one_field_keeps_every_other(client_session, kind):
    m = models()
    limit = client_session.call("limits.limits_create", body=m.LimitRequest(name="api", max_concurrency=9), expect=201)
    task = client_session.call("tasks.tasks_create", body=_task_request(kind, limit.name), expect=201)
    before = _fields(client_session.call("tasks.tasks_retrieve", task.id))
    assert before["name"] == f"nightly {kind}" and before["timezone"] == "Europe/Paris"

    # The variant that keeps the runner, then the runner's own variant (which names the runner).
    patched = client_session.call(
        "tasks.tasks_partial_update", task.id, body=m.PatchedTaskUpdateKeepRunnerRequest(priority=7)
    )
    assert patched.priority == 7
    client_session.call(
        "tasks.tasks_partial_update",
        task.id,
        body=m.PatchedTaskUpdateHttpRequest(runner=m.HttpRunnerEnum.HTTP, tracing_id="trace-2"),
    )
    after = _fields(client_session.call("tasks.tasks_retrieve", task.id))
    assert after == before | {"priority": 7, "tracing_id": "trace-2"}
    assert after["status"] == "ACTIVE"


def test_a_limit_patched_one_field_keeps_every_other(client_session):
    m = models()
    limit = client_session.call(
        "limits.limits_create",
        body=m.LimitRequest(
            name="per-runner",
            scope=m.ScopeEnum.RUNNER,
            max_concurrency=4,
            windows=[m.WindowRequest(count=10, seconds=1)],
        ),
        expect=201,
    )
    before = _fields(client_session.call("limits.limits_retrieve", limit.id))
    client_session.call("limits.limits_partial_update", limit.id, body=m.PatchedLimitRequest(max_concurrency=7))
    after = _fields(client_session.call("limits.limits_retrieve", limit.id))
    assert after == before | {"max_concurrency": 7}
    assert after["scope"] == "runner"


def test_a_channel_and_a_rule_patched_one_field_keep_every_other(client_session):
    m = models()
    channel = client_session.call(
        "notification_channels.notification_channels_create",
        body=m.ChannelRequest(
            name="ops hook",
            kind=m.KindEnum.WEBHOOK,
            target="http://127.0.0.1:9/hook",
            quiet_from="22:00",
            quiet_to="06:30",
            timezone="Europe/Paris",
        ),
        expect=201,
    )
    before = _fields(client_session.call("notification_channels.notification_channels_retrieve", channel.id))
    assert before["quiet_from"].startswith("22:00")
    client_session.call(
        "notification_channels.notification_channels_partial_update",
        channel.id,
        body=m.PatchedChannelRequest(name="ops hook 2"),
    )
    after = _fields(client_session.call("notification_channels.notification_channels_retrieve", channel.id))
    assert after == before | {"name": "ops hook 2"}

    rule = client_session.call(
        "notification_rules.notification_rules_create",
        body=m.RuleRequest(
            channel=channel.id,
            enabled=False,
            on_failure=False,
            on_retry=True,
            on_recovery=True,
            on_skip=True,
            late_after=60,
            running_longer_than="10m",
            no_success_within="1d",
            digest_every="1h",
        ),
        expect=201,
    )
    before = _fields(client_session.call("notification_rules.notification_rules_retrieve", rule.id))
    client_session.call(
        "notification_rules.notification_rules_partial_update", rule.id, body=m.PatchedRuleRequest(enabled=True)
    )
    after = _fields(client_session.call("notification_rules.notification_rules_retrieve", rule.id))
    assert after == before | {"enabled": True}
