"""Bulk replay (issue 31): ``POST /api/v1/executions/replay`` runs a selection of finished
executions again, each as a new run due now with ``replay_of``, optionally with another input or
a partial config override that reaches the runner; all or nothing, counted, capped, audited."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from executions import replay, transitions, worker_services
from executions.models import Execution, ExecutionOrigin
from executions.models import ExecutionStatus as S
from executions.retention import retention_prune
from tasks_api.creation import task_create
from tasks_api.limits import limit_create
from tasks_api.triggers import task_trigger
from tasks_app.models import AuditEntry, Task
from tasks_app.quotas import owner_quota_set
from tasks_app.secrets import config_open
from tests.factories import ExecutionFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/executions/replay"


def _later() -> Any:
    return timezone.now() + timedelta(days=1)


def _finished(task: Task, status: str, *, ago: timedelta = timedelta(hours=1), **fields: Any) -> Execution:
    when = timezone.now() - ago
    return ExecutionFactory(task=task, status=status, scheduled_for=when, finished_at=when, **fields)


def _replays() -> list[Execution]:
    return list(Execution.objects.filter(origin=ExecutionOrigin.REPLAY).order_by("id"))


def _errors(response) -> dict:
    assert response.status_code == 400, response.content
    return response.json()["errors"]


@pytest.fixture
def echo(user) -> Task:
    return task_create(
        owner=user, runner="subprocess", config={"command": ["echo", "as configured"]}, start_at=_later()
    )


def test_a_replay_runs_the_selected_finished_executions_again_due_now(api_client, echo):
    failed = _finished(echo, S.FAILED, input={"n": 1})
    _finished(echo, S.SUCCEEDED)
    ExecutionFactory(task=echo, status=S.SCHEDULED)

    response = api_client.post(URL, {"task": str(echo.pk), "status": ["FAILED"]}, format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    (new,) = _replays()
    assert body == {"dry_run": False, "count": 1, "replayed": [failed.pk], "created": [new.pk], "dropped_secrets": {}}
    assert new.replay_of_id == failed.pk and new.status == S.SCHEDULED and new.attempt == 1
    assert new.due_at <= timezone.now() and new.input == {"n": 1} and new.config_override is None
    shown = api_client.get(f"/api/v1/executions/{new.pk}").json()
    assert shown["origin"] == "replay" and shown["replay_of"] == failed.pk and shown["input"] == {"n": 1}
    (entry,) = AuditEntry.objects.filter(action="replay")
    assert entry.changes["count"] == 1 and entry.changes["replayed"] == [failed.pk]
    assert entry.changes["selection"] == {"tasks": [str(echo.pk)], "status": ["FAILED"]}
    assert entry.detail == "1 execution(s) replayed" and entry.owner_id == echo.owner_id


def test_the_selection_reads_finished_time_since_inclusive_until_exclusive(api_client, echo):
    old = _finished(echo, S.SUCCEEDED, ago=timedelta(days=3))
    middle = _finished(echo, S.FAILED, ago=timedelta(days=2))
    recent = _finished(echo, S.CANCELLED, ago=timedelta(hours=1))
    since, until = middle.finished_at, recent.finished_at

    body = {"tasks": [str(echo.pk)], "since": since.isoformat(), "until": until.isoformat(), "dry_run": True}
    response = api_client.post(URL, body, format="json")

    assert response.status_code == 200 and response.json()["replayed"] == [middle.pk]
    everything = api_client.post(URL, {"task": str(echo.pk), "dry_run": True}, format="json").json()
    assert everything["replayed"] == [old.pk, middle.pk, recent.pk] and everything["created"] == []
    assert not _replays() and not AuditEntry.objects.filter(action="replay").exists()


def test_an_input_replaces_the_new_runs_input_checked_by_the_schema(api_client, user):
    task = task_create(
        owner=user,
        runner="noop",
        start_at=_later(),
        input_schema={"type": "object", "required": ["day"], "properties": {"day": {"type": "string"}}},
    )
    done = _finished(task, S.SUCCEEDED, input={"day": "monday"})

    bad = api_client.post(URL, {"task": str(task.pk), "input": {"day": 1}}, format="json")
    good = api_client.post(URL, {"task": str(task.pk), "input": {"day": "friday"}}, format="json")

    assert _errors(bad) == {"input": ["1 is not of type 'string' (at day)"]}
    assert good.status_code == 201
    (new,) = _replays()
    assert new.replay_of_id == done.pk and new.input == {"day": "friday"}
    assert AuditEntry.objects.get(action="replay").changes["input"] == "replaced"


def test_a_config_override_reaches_the_runner_for_the_new_runs_only(api_client, echo):
    done = _finished(echo, S.FAILED)

    response = api_client.post(
        URL, {"task": str(echo.pk), "config": {"command": ["echo", "overridden"]}}, format="json"
    )

    assert response.status_code == 201, response.json()
    (new,) = _replays()
    assert api_client.get(f"/api/v1/executions/{new.pk}").json()["config"] == {"command": ["echo", "overridden"]}
    for dispatch in transitions.executions_take_due(limit=10, actor="monitor"):
        worker_services.execution_run(execution_id=dispatch.execution_id, attempt=dispatch.attempt, worker_id="w1")
    new.refresh_from_db()
    assert new.status == S.SUCCEEDED and new.output.strip() == "overridden" and new.replay_of_id == done.pk
    assert config_open(Task.objects.get(pk=echo.pk).config) == {"command": ["echo", "as configured"]}
    # A retry of the replay runs with the replay's config too.
    Execution.objects.filter(pk=new.pk).update(status=S.FAILED)
    retry = transitions.execution_retry(execution_id=new.pk, actor="t")
    assert Execution.objects.get(pk=retry).config_override == new.config_override


def test_a_config_the_runner_refuses_is_a_400_on_config_and_nothing_is_created(api_client, echo):
    _finished(echo, S.FAILED)

    errors = _errors(api_client.post(URL, {"task": str(echo.pk), "config": {"command": "echo hi"}}, format="json"))
    reserved = _errors(
        api_client.post(URL, {"task": str(echo.pk), "config": {"command": {"$enc": "x"}}}, format="json")
    )

    assert set(errors) == {"config"} and "command" in errors["config"]
    assert "reserved" in reserved["config"][0]
    assert not _replays() and not AuditEntry.objects.filter(action="replay").exists()


def test_secrets_stay_masked_and_never_follow_a_run_pointed_elsewhere(api_client, user):
    task = task_create(
        owner=user,
        runner="http",
        start_at=_later(),
        config={"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": "Bearer sk-live-123456"}},
    )
    _finished(task, S.FAILED)

    same_place = api_client.post(
        URL,
        {"task": str(task.pk), "config": {"headers": {"Authorization": "********"}, "max_response_bytes": 7000}},
        format="json",
    )
    elsewhere = api_client.post(
        URL, {"task": str(task.pk), "config": {"url": "http://127.0.0.1:8/other"}}, format="json"
    )

    assert same_place.status_code == elsewhere.status_code == 201
    kept, moved = _replays()
    assert config_open(kept.config_override)["headers"] == {"Authorization": "Bearer sk-live-123456"}
    assert config_open(kept.config_override)["max_response_bytes"] == 7000
    assert "sk-live" not in str(kept.config_override)  # stored sealed
    assert api_client.get(f"/api/v1/executions/{kept.pk}").json()["config"]["headers"] == {"Authorization": "********"}
    assert elsewhere.json()["dropped_secrets"] == {str(task.pk): ["headers.Authorization"]}
    assert "Authorization" not in config_open(moved.config_override).get("headers", {})


def test_selection_errors_are_400s_per_field_and_create_nothing(api_client, echo):
    _finished(echo, S.FAILED)
    now = timezone.now().isoformat()

    cases = {
        "task": {},
        "status": {"task": str(echo.pk), "status": ["RUNNING"]},
        "until": {"task": str(echo.pk), "since": now, "until": now},
        "input": {"task": str(echo.pk), "input": [1]},
        "dry_run": {"task": str(echo.pk), "dry_run": "perhaps"},
    }
    for field, body in cases.items():
        assert field in _errors(api_client.post(URL, body, format="json")), field
    both = _errors(api_client.post(URL, {"task": str(echo.pk), "tasks": [str(echo.pk)]}, format="json"))
    assert "either task" in both["task"][0]
    assert not _replays()


def test_more_than_the_cap_is_a_400_saying_so(api_client, echo, monkeypatch):
    monkeypatch.setattr(replay, "MAX_REPLAY", 2)
    for hours in (1, 2, 3):
        _finished(echo, S.FAILED, ago=timedelta(hours=hours))

    errors = _errors(api_client.post(URL, {"task": str(echo.pk)}, format="json"))

    assert "more than 2 executions" in errors["non_field_errors"][0]
    assert not _replays()


def test_a_replay_over_the_quota_is_refused_whole(api_client, echo, user):
    for hours in (1, 2, 3):
        _finished(echo, S.FAILED, ago=timedelta(hours=hours))
    owner_quota_set(owner=user, max_executions_per_hour=2)

    response = api_client.post(URL, {"task": str(echo.pk)}, format="json")

    assert response.status_code == 400 and "at most 2 executions per hour" in str(response.json())
    assert not _replays() and not AuditEntry.objects.filter(action="replay").exists()
    owner_quota_set(owner=user, max_executions_per_hour=4)
    assert api_client.post(URL, {"task": str(echo.pk)}, format="json").status_code == 201
    assert len(_replays()) == 3
    over = api_client.post(URL, {"task": str(echo.pk), "status": ["FAILED"]}, format="json")
    assert over.status_code == 429 and len(_replays()) == 3


def test_a_selection_that_matches_nothing_is_a_200_that_creates_nothing(api_client, echo):
    _finished(echo, S.FAILED)
    response = api_client.post(URL, {"task": str(echo.pk), "status": ["SUCCEEDED"]}, format="json")
    assert response.status_code == 200
    assert response.json() == {"dry_run": False, "count": 0, "replayed": [], "created": [], "dropped_secrets": {}}
    assert not _replays() and not AuditEntry.objects.filter(action="replay").exists()


def test_a_dry_run_meets_the_quota_as_the_replay_would_and_counts_nothing(api_client, echo, user):
    for hours in (1, 2, 3):
        _finished(echo, S.FAILED, ago=timedelta(hours=hours))
    owner_quota_set(owner=user, max_executions_per_hour=2)
    never = api_client.post(URL, {"task": str(echo.pk), "dry_run": True}, format="json")
    assert never.status_code == 400 and "at most 2 executions per hour" in str(never.json())

    owner_quota_set(owner=user, max_executions_per_hour=4)
    for _ in range(3):  # counted nothing: three dry runs of three fit a quota of four
        fits = api_client.post(URL, {"task": str(echo.pk), "dry_run": True}, format="json")
        assert fits.status_code == 200 and fits.json()["count"] == 3
    assert api_client.post(URL, {"task": str(echo.pk)}, format="json").status_code == 201
    full = api_client.post(URL, {"task": str(echo.pk), "status": ["FAILED"], "dry_run": True}, format="json")
    assert full.status_code == 429 and len(_replays()) == 3


def test_another_owner_s_task_is_a_404_and_nothing_is_created(api_client, other_user):
    theirs = task_create(owner=other_user, runner="noop", start_at=_later())
    _finished(theirs, S.FAILED)

    response = api_client.post(URL, {"tasks": [str(theirs.pk)]}, format="json")

    assert response.status_code == 404 and not _replays()


def test_the_admin_action_replays_through_the_same_service(admin_user, echo):
    failed = _finished(echo, S.FAILED)
    running = ExecutionFactory(task=echo, status=S.RUNNING)
    client = Client()
    client.force_login(admin_user)

    refused = client.post(
        "/admin/executions/execution/",
        {"action": "replay_selected", "_selected_action": [failed.pk, running.pk]},
        follow=True,
    )
    done = client.post(
        "/admin/executions/execution/", {"action": "replay_selected", "_selected_action": [failed.pk]}, follow=True
    )

    assert "only finished executions are replayed" in refused.content.decode()
    assert "1 replayed as execution(s)" in done.content.decode()
    (new,) = _replays()
    assert new.replay_of_id == failed.pk
    (entry,) = AuditEntry.objects.filter(action="replay")
    assert entry.changes["selection"] == {"executions": [failed.pk], "via": "admin"}


def test_the_execution_page_shows_what_it_replays_and_its_config_masked(api_client, user):
    task = task_create(
        owner=user,
        runner="http",
        start_at=_later(),
        config={"url": "http://127.0.0.1:9/hook", "headers": {"X-Api-Key": "key-abcdef-123"}},
    )
    done = _finished(task, S.FAILED)
    assert (
        api_client.post(URL, {"task": str(task.pk), "config": {"max_response_bytes": 9000}}, format="json").status_code
        == 201
    )
    (new,) = _replays()
    page = Client()
    page.force_login(user)

    html = page.get(f"/ui/executions/{new.pk}/").content.decode()

    assert f'replay of <a href="/ui/executions/{done.pk}/">#{done.pk}</a>' in html
    assert 'id="execution-config"' in html and "key-abcdef-123" not in html and "********" in html


def test_pruning_a_replayed_execution_unlinks_its_replay(api_client, echo, settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "tms_archive": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    Task.objects.filter(pk=echo.pk).update(keep_last=1)
    old = _finished(echo, S.FAILED, ago=timedelta(days=2))
    assert api_client.post(URL, {"task": str(echo.pk)}, format="json").status_code == 201
    (new,) = _replays()
    Execution.objects.filter(pk=new.pk).update(status=S.SUCCEEDED, finished_at=timezone.now())

    report = retention_prune(now=timezone.now())

    assert report.executions == 1 and not Execution.objects.filter(pk=old.pk).exists()
    new.refresh_from_db()
    assert new.replay_of_id is None and new.origin == ExecutionOrigin.REPLAY


def test_a_replay_sent_to_another_host_counts_against_that_host_s_limit(api_client, user):
    limit_create(owner=user, name="solo", scope="host", max_concurrency=1)
    task = task_create(
        owner=user, runner="http", config={"url": "http://127.0.0.1:9/x"}, limits=["solo"], start_at=_later()
    )
    _finished(task, S.FAILED, ago=timedelta(hours=2))
    _finished(task, S.FAILED, ago=timedelta(hours=1))
    body = {"task": str(task.pk), "status": ["FAILED"]}
    elsewhere = api_client.post(URL, {**body, "config": {"url": "http://localhost:9/x"}}, format="json")
    assert elsewhere.status_code == 201
    first, second = _replays()
    running = task_trigger(task=task, actor="t").execution
    Execution.objects.filter(pk__in=[first.pk, second.pk, running.pk]).update(status=S.PENDING)

    def claim(execution: Execution) -> str:
        return transitions.execution_claim_exclusive(
            execution_id=execution.pk, attempt=1, worker_id="w", lease_seconds=60
        ).outcome

    # 127.0.0.1's one slot is taken by the task's own run; the replays go to localhost, which has one.
    assert [claim(running), claim(first), claim(second)] == ["claimed", "claimed", "waiting"]
