"""Who may change what a run does (issue 43, item 1): an operator reruns a team's tasks as they
are, giving a run its ``input`` only; a ``config`` (a replay's override) is an editor's act, over
the API (users and service accounts), the back office and the admin alike.

The audit's attacks, as an operator: a replay whose ``config.command`` runs a shell, a replay of
an http task with ``method: DELETE`` (keeping the stored ``Authorization`` header), and the same
through an operator service account's token."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.service_accounts import service_account_create, service_account_token_create
from executions.models import Execution, ExecutionOrigin
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_app.models import AuditEntry, Task
from tasks_app.secrets import config_open
from tasks_app.teams.services import member_set, team_create
from tests.factories import ExecutionFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/executions/replay"
SHELL = {"command": ["/bin/sh", "-c", "id"]}
EDITOR_NEEDED = (
    "Your role in this team is operator: `config` changes what these runs do, which needs editor or higher "
    "(an operator may give `input` only)."
)


def _finished(task: Task) -> Execution:
    when = timezone.now() - timedelta(hours=1)
    return ExecutionFactory(task=task, status=S.FAILED, scheduled_for=when, finished_at=when)


def _replays() -> list[Execution]:
    return list(Execution.objects.filter(origin=ExecutionOrigin.REPLAY).order_by("id"))


@pytest.fixture
def world(db) -> dict[str, Any]:
    """A team with an editor and an operator, an echo task and an http task with a secret
    header, each with a failed run."""
    users = get_user_model().objects
    admin = users.create_user("team-admin")
    team = team_create(creator=admin, name="Reports")
    people = {"admin": admin}
    for role in ("operator", "editor"):
        people[role] = users.create_user(f"team-{role}")
        member_set(team=team, username=f"team-{role}", role=role)
    later = timezone.now() + timedelta(days=1)
    echo = task_create(
        owner=admin, team=team, runner="subprocess", config={"command": ["echo", "report"]}, start_at=later
    )
    hook = task_create(
        owner=admin,
        team=team,
        runner="http",
        start_at=later,
        config={"url": "http://127.0.0.1:9/report", "headers": {"Authorization": "Bearer sk-live-123456"}},
    )
    return {"team": team, "people": people, "echo": echo, "hook": hook, "runs": [_finished(echo), _finished(hook)]}


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_an_operator_replay_with_a_command_is_a_403_naming_the_editor_role_and_creates_nothing(world):
    operator = _client(world["people"]["operator"])

    refused = operator.post(URL, {"task": str(world["echo"].pk), "config": SHELL}, format="json")
    dry = operator.post(URL, {"task": str(world["echo"].pk), "config": SHELL, "dry_run": True}, format="json")

    assert refused.status_code == dry.status_code == 403
    assert refused.json()["detail"] == EDITOR_NEEDED
    assert not _replays() and not AuditEntry.objects.filter(action="replay").exists()


def test_an_operator_replay_pointing_an_http_task_elsewhere_or_at_delete_is_refused(world):
    operator = _client(world["people"]["operator"])
    hook = str(world["hook"].pk)

    delete = operator.post(URL, {"task": hook, "config": {"method": "DELETE", "json": {"all": True}}}, format="json")
    moved = operator.post(URL, {"task": hook, "config": {"url": "http://127.0.0.1:8/x"}}, format="json")
    # Even a config that changes nothing is the editor's: the rule is on the field, not its effect.
    empty = operator.post(URL, {"tasks": [hook, str(world["echo"].pk)], "config": {}}, format="json")

    assert (delete.status_code, moved.status_code, empty.status_code) == (403, 403, 403)
    assert "needs editor" in delete.json()["detail"]
    assert not _replays()


def test_a_refusal_holds_when_the_selection_matches_nothing(world):
    Execution.objects.all().delete()
    operator = _client(world["people"]["operator"])

    refused = operator.post(URL, {"task": str(world["echo"].pk), "config": SHELL}, format="json")

    assert refused.status_code == 403 and not _replays()


def test_an_operator_still_replays_with_input_and_the_task_s_own_config(world):
    operator = _client(world["people"]["operator"])

    done = operator.post(URL, {"task": str(world["echo"].pk), "input": {"day": "friday"}}, format="json")

    assert done.status_code == 201, done.json()
    (new,) = _replays()
    assert new.input == {"day": "friday"} and new.config_override is None


def test_an_editor_may_replay_with_a_config(world):
    editor = _client(world["people"]["editor"])

    done = editor.post(URL, {"task": str(world["echo"].pk), "config": {"command": ["echo", "again"]}}, format="json")

    assert done.status_code == 201, done.json()
    (new,) = _replays()
    assert config_open(new.config_override)["command"] == ["echo", "again"]


def test_an_operator_service_account_is_refused_a_config_as_a_member_would_be(world):
    account = service_account_create(team=world["team"], name="ci", role="operator", creator=world["people"]["admin"])
    _, key = service_account_token_create(account=account, name="ci", scopes=["write"], expires_at=None)
    robot = APIClient()
    robot.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")

    shell = robot.post(URL, {"task": str(world["echo"].pk), "config": SHELL}, format="json")
    delete = robot.post(URL, {"task": str(world["hook"].pk), "config": {"method": "DELETE"}}, format="json")
    rerun = robot.post(URL, {"task": str(world["echo"].pk)}, format="json")

    assert (shell.status_code, delete.status_code) == (403, 403)
    assert shell.json()["detail"] == EDITOR_NEEDED
    assert rerun.status_code == 201, rerun.json()
    assert [run.config_override for run in _replays()] == [None]


def test_the_admin_replay_action_reruns_the_task_s_config_and_takes_none(world):
    """The admin's action replays with the runs' own config: a ``config`` posted with it is not
    read, and a staff user allowed to operate executions cannot change a task there."""
    staff = get_user_model().objects.create_user("desk", is_staff=True)
    staff.user_permissions.add(
        Permission.objects.get(codename="change_execution"), Permission.objects.get(codename="view_task")
    )
    client = Client()
    client.force_login(staff)
    failed = world["runs"][0]

    done = client.post(
        "/admin/executions/execution/",
        {"action": "replay_selected", "_selected_action": [failed.pk], "config": '{"command": ["/bin/sh"]}'},
        follow=True,
    )
    change = client.post(
        f"/admin/tasks_app/task/{world['echo'].pk}/change/", {"config": '{"command": ["/bin/sh", "-c", "id"]}'}
    )

    assert "1 replayed as execution(s)" in done.content.decode()
    (new,) = _replays()
    assert new.replay_of_id == failed.pk and new.config_override is None
    assert change.status_code == 403
    assert config_open(Task.objects.get(pk=world["echo"].pk).config) == {"command": ["echo", "report"]}


def test_the_back_office_gives_an_operator_runs_but_not_a_config_change(client, world):
    client.force_login(world["people"]["operator"])
    echo = world["echo"]

    edit = client.post(f"/ui/tasks/{echo.pk}/edit/", {"name": echo.name, "runner": "subprocess", "config": "{}"})
    run = client.post(f"/ui/tasks/{echo.pk}/run/")
    retry = client.post(f"/ui/executions/{world['runs'][0].pk}/retry/")

    assert edit.status_code == 403
    assert run.status_code == retry.status_code == 302
    assert config_open(Task.objects.get(pk=echo.pk).config) == {"command": ["echo", "report"]}
    assert not Execution.objects.filter(task=echo, config_override__isnull=False).exists()


def test_run_now_and_backfill_take_no_config_from_anyone(world):
    """The other ways an operator starts runs name no config at all: a ``config`` is an unknown
    field (400), not an override that is quietly dropped or applied."""
    operator = _client(world["people"]["operator"])
    url = f"/api/v1/tasks/{world['echo'].pk}"
    before = Execution.objects.count()

    run = operator.post(f"{url}/trigger", {"config": SHELL}, format="json")
    backfill = operator.post(
        f"{url}/backfill",
        {"start": "2025-01-01T00:00:00Z", "end": "2025-01-01T02:00:00Z", "config": SHELL},
        format="json",
    )

    assert (run.status_code, backfill.status_code) == (400, 400)
    assert run.json()["errors"] == backfill.json()["errors"] == {"config": ["Unknown field."]}
    assert Execution.objects.count() == before
