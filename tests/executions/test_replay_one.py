"""Replay of one run by id (issue 48, item 6): ``POST /api/v1/executions/{id}/replay`` with an
optional input and ``version`` (current, or the task's version the run was created from), and
who may do which (issue 43's rule: anything but input is an editor's)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from executions.models import Execution, ExecutionOrigin
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_app.models import AuditEntry
from tasks_app.secrets import config_open
from tasks_app.teams.services import member_set, team_create
from tests.factories import ExecutionFactory

pytestmark = pytest.mark.django_db


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def world(db) -> dict[str, Any]:
    users = get_user_model().objects
    admin = users.create_user("wf-admin")
    team = team_create(creator=admin, name="Reports")
    people = {"admin": admin}
    for role in ("operator", "editor"):
        people[role] = users.create_user(f"wf-{role}")
        member_set(team=team, username=f"wf-{role}", role=role)
    later = timezone.now() + timedelta(days=1)
    task = task_create(owner=admin, team=team, runner="subprocess", config={"command": ["echo", "v1"]}, start_at=later)
    when = timezone.now() - timedelta(hours=1)
    run = ExecutionFactory(task=task, status=S.FAILED, scheduled_for=when, finished_at=when)
    run.refresh_from_db()
    return {"people": people, "task": task, "run": run}


def _url(run: Execution) -> str:
    return f"/api/v1/executions/{run.pk}/replay"


def _edit_to_v2(world: dict[str, Any]) -> None:
    changed = _client(world["people"]["editor"]).patch(
        f"/api/v1/tasks/{world['task'].pk}", {"config": {"command": ["echo", "v2"]}}, format="json"
    )
    assert changed.status_code == 200, changed.json()


def test_an_operator_replays_one_run_with_an_input_at_the_current_version(world):
    done = _client(world["people"]["operator"]).post(_url(world["run"]), {"input": {"day": "friday"}}, format="json")
    assert done.status_code == 201, done.json()
    (new_id,) = done.json()["created"]
    new = Execution.objects.get(pk=new_id)
    assert (new.origin, new.replay_of_id, new.input, new.config_override) == (
        ExecutionOrigin.REPLAY,
        world["run"].pk,
        {"day": "friday"},
        None,
    )
    entry = AuditEntry.objects.get(action="replay", object_id=str(new_id))
    assert entry.changes["selection"] == {"executions": [world["run"].pk], "version": "current"}


def test_original_runs_the_config_of_the_run_s_version_and_needs_an_editor_once_it_differs(world):
    run = world["run"]
    assert run.task_version == 1
    # The same version as now: nothing changes what runs, an operator may.
    same = _client(world["people"]["operator"]).post(_url(run), {"version": "original"}, format="json")
    assert same.status_code == 201 and Execution.objects.get(pk=same.json()["created"][0]).config_override is None
    _edit_to_v2(world)
    refused = _client(world["people"]["operator"]).post(_url(run), {"version": "original"}, format="json")
    assert refused.status_code == 403 and "editor" in refused.json()["detail"]
    current = _client(world["people"]["operator"]).post(_url(run), {}, format="json")
    assert current.status_code == 201
    done = _client(world["people"]["editor"]).post(_url(run), {"version": "original"}, format="json")
    assert done.status_code == 201, done.json()
    new = Execution.objects.get(pk=done.json()["created"][0])
    assert config_open(new.config_override) == {"command": ["echo", "v1"]}
    assert Execution.objects.filter(origin=ExecutionOrigin.REPLAY).count() == 3  # the refusal made none


def test_bad_requests_are_400_per_field_and_another_team_s_run_is_404(world, other_user):
    operator = _client(world["people"]["operator"])
    bad = operator.post(_url(world["run"]), {"version": "newest", "input": [1]}, format="json")
    assert bad.status_code == 400 and set(bad.json()["errors"]) == {"version", "input"}
    assert bad.json()["errors"]["input"] == ["A JSON object: the new run's input."]
    assert _client(other_user).post(_url(world["run"]), {}, format="json").status_code == 404
    assert operator.post("/api/v1/executions/999999999/replay", {}, format="json").status_code == 404
    Execution.objects.filter(pk=world["run"].pk).update(status=S.SCHEDULED, finished_at=None)
    unfinished = operator.post(_url(world["run"]), {}, format="json")
    assert unfinished.status_code == 400
    assert not Execution.objects.filter(origin=ExecutionOrigin.REPLAY).exists()


def test_an_input_read_from_the_api_with_its_secrets_masked_keeps_them_when_sent_back(world):
    """The API shows a run's input masked (a token reads ``********``): a client that edits one
    value of it and sends it back replays with the stored secrets, not with the mask."""
    run = world["run"]
    Execution.objects.filter(pk=run.pk).update(input={"day": "mon", "api_token": "s3cr3t", "env": {"KEY": "v"}})
    operator = _client(world["people"]["operator"])
    shown = operator.get(f"/api/v1/executions/{run.pk}").json()["input"]
    assert shown["api_token"] == "********"
    done = operator.post(_url(run), {"input": shown | {"day": "tue", "extra": "********x"}}, format="json")
    assert done.status_code == 201, done.json()
    new = Execution.objects.get(pk=done.json()["created"][0])
    assert new.input == {"day": "tue", "api_token": "s3cr3t", "env": {"KEY": "v"}, "extra": "********x"}
