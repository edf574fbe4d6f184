"""A task's ``env`` over the API, the back office and a replay (issue 43, item 3): what it may set
on a pinned program is refused with a 400 on ``config.env`` naming the variable, wherever the
config is written; and since every value of an environment reads ``********``, the audit log and
the task's versions name the variables a change added, removed or changed."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from backoffice.forms import TaskForm
from executions.models import Execution, ExecutionOrigin
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_app.models import AuditEntry, Task, TaskVersion
from tasks_app.secrets import config_open
from tasks_app.teams.services import member_set, team_create
from tests.factories import ExecutionFactory
from tests.runners.conftest import SYSTEM_PYTHON

pytestmark = pytest.mark.django_db

ATTACK = {"PYTHONWARNINGS": "ignore::antigravity.Foo::0", "BROWSER": "/bin/sh -c 'id' #%s"}


@pytest.fixture
def world(db, settings, tmp_path: Path) -> dict[str, Any]:
    """A ``pinned`` subprocess runner allowing python3 with one script only, a team with an editor
    and an operator, and a task of it running the script, with a failed run."""
    script = tmp_path / "report.py"
    script.write_text("print('report')\n")
    settings.TMS_RUNNERS = {
        **settings.TMS_RUNNERS,
        "pinned": {
            "BACKEND": "runners.subprocess.SubprocessRunner",
            "OPTIONS": {
                "allowed_executables": {SYSTEM_PYTHON: ["^" + str(script).replace(".", r"\.") + "$"], "echo": None},
                "work_dir": str(tmp_path / "runs"),
                "sandbox": "none",
            },
        },
    }
    users = get_user_model().objects
    admin = users.create_user("env-admin")
    team = team_create(creator=admin, name="Env")
    people = {"admin": admin}
    for role in ("operator", "editor"):
        people[role] = users.create_user(f"env-{role}")
        member_set(team=team, username=f"env-{role}", role=role)
    command = [SYSTEM_PYTHON, str(script)]
    task = task_create(
        owner=admin,
        team=team,
        runner="pinned",
        config={"command": command},
        start_at=timezone.now() + timedelta(days=1),
    )
    when = timezone.now() - timedelta(hours=1)
    ExecutionFactory(task=task, status=S.FAILED, scheduled_for=when, finished_at=when)
    return {"team": team, "people": people, "task": task, "command": command}


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _env_errors(response: Any) -> list[str]:
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert set(errors) == {"config"} and set(errors["config"]) == {"env"}, errors
    return errors["config"]["env"]


def test_an_editor_s_create_with_the_audit_s_environment_is_a_400_on_config_env(world):
    editor = _client(world["people"]["editor"])
    body = {"runner": "pinned", "team": world["team"].pk, "config": {"command": world["command"], "env": ATTACK}}

    errors = _env_errors(editor.post("/api/v1/tasks", body, format="json"))

    assert [error.split(":")[0] for error in errors] == ["'PYTHONWARNINGS'", "'BROWSER'"]
    assert Task.objects.filter(runner="pinned").count() == 1


def test_an_editor_s_patch_with_the_audit_s_environment_is_a_400_and_changes_nothing(world):
    editor = _client(world["people"]["editor"])
    task = world["task"]

    errors = _env_errors(
        editor.patch(
            f"/api/v1/tasks/{task.pk}", {"config": {"command": world["command"], "env": ATTACK}}, format="json"
        )
    )
    injecting = _env_errors(
        editor.patch(
            f"/api/v1/tasks/{task.pk}",
            {"config": {"command": ["echo"], "env": {"NODE_OPTIONS": "-r x"}}},
            format="json",
        )
    )

    assert any("PYTHONWARNINGS" in error and "pinned" in error for error in errors)
    assert injecting == [
        "'NODE_OPTIONS' can make the program run other code (an interpreter or shell variable). An operator can add "
        "it to the allowed_env option of the 'pinned' runner."
    ]
    stored = config_open(Task.objects.get(pk=task.pk).config)
    assert stored["command"] == world["command"] and not stored.get("env")
    assert not AuditEntry.objects.filter(task_id=task.pk, action="update").exists()


def test_the_back_office_edit_refuses_the_environment_as_the_api_does(client, world):
    client.force_login(world["people"]["editor"])
    task = world["task"]

    form = TaskForm.initial_for(task)
    form["config"] = json.dumps({"command": world["command"], "env": ATTACK})

    page = client.post(f"/ui/tasks/{task.pk}/edit/", {key: value for key, value in form.items() if value is not None})

    assert page.status_code == 400
    assert "is pinned to its arguments" in page.content.decode().replace("&#x27;", "'")
    assert not config_open(Task.objects.get(pk=task.pk).config).get("env")


def test_a_replay_s_environment_is_refused_to_an_operator_and_to_an_editor_on_config_env(world):
    task = world["task"]
    body = {"task": str(task.pk), "config": {"env": ATTACK}}

    operator = _client(world["people"]["operator"]).post("/api/v1/executions/replay", body, format="json")
    errors = _env_errors(_client(world["people"]["editor"]).post("/api/v1/executions/replay", body, format="json"))

    assert operator.status_code == 403 and "needs editor" in operator.json()["detail"]
    assert any("BROWSER" in error for error in errors)
    assert not Execution.objects.filter(origin=ExecutionOrigin.REPLAY).exists()


def test_the_audit_and_the_versions_name_the_variables_a_change_touched(world):
    editor = _client(world["people"]["editor"])
    task = world["task"]
    url = f"/api/v1/tasks/{task.pk}"

    first = editor.patch(url, {"config": {"command": ["echo"], "env": {"GREETING": "hi"}}}, format="json")
    second = editor.patch(
        url, {"config": {"command": ["echo"], "env": {"GREETING": "hello", "MODE": "x"}}}, format="json"
    )
    third = editor.patch(url, {"config": {"command": ["echo"], "env": {"MODE": "********"}}}, format="json")

    assert first.status_code == second.status_code == third.status_code == 200, (first.json(), second.json())
    entries = list(AuditEntry.objects.filter(task_id=task.pk, action="update").order_by("id"))
    assert [entry.changes["env_names"] for entry in entries] == [
        {"env": {"added": ["GREETING"]}},
        {"env": {"added": ["MODE"], "changed": ["GREETING"]}},
        {"env": {"removed": ["GREETING"]}},
    ]
    assert "hello" not in str([entry.changes for entry in entries])  # the values stay masked
    versions = list(TaskVersion.objects.filter(task_id=task.pk).order_by("number"))
    assert [version.changed for version in versions[1:]] == [
        ["config", "config.env.GREETING"],
        ["config", "config.env.GREETING", "config.env.MODE"],
        ["config", "config.env.GREETING"],
    ]
    # A replay's audit entry names them too (against the task's config).
    replay = editor.post(
        "/api/v1/executions/replay", {"task": str(task.pk), "config": {"env": {"MODE": "y"}}}, format="json"
    )
    assert replay.status_code == 201, replay.json()
    assert AuditEntry.objects.get(action="replay").changes["env_names"] == {
        str(task.pk): {"env": {"changed": ["MODE"]}}
    }
