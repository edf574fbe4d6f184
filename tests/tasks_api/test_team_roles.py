"""Teams and roles (issue 30): who sees and who may act on a team's tasks and runs, over the API and
the back office's POSTs alike (:mod:`tasks_app.teams`).

The matrix: each role (and a non-member, and read-only support staff) x each action -> allowed,
403 (sees it, role too low) or 404 (does not see it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from accounts.support_group import ensure_support_group
from executions.models import Execution, ExecutionStatus
from tasks_api.creation import task_create
from tasks_app.models import AuditEntry, Membership, Task, TaskStatus, Team, TeamRole
from tasks_app.teams.services import member_set, team_create
from tests.factories import ExecutionFactory

ROLES = ["viewer", "operator", "editor", "admin", "outsider", "staff"]
RANK = {"viewer": 0, "operator": 1, "editor": 2, "admin": 3}

#: action -> the least role that may do it ("viewer": any member).
API_ACTIONS = {
    "read task": "viewer",
    "read execution": "viewer",
    "list with ?team=": "viewer",
    # Before the pause: pausing cancels the task's waiting runs.
    "cancel": "operator",
    "retry": "operator",
    "replay": "operator",
    "pause": "operator",
    "resume": "operator",
    "run now": "operator",
    "backfill": "operator",
    "change": "editor",
    "trigger url": "editor",
    "create in team": "editor",
    "delete": "editor",
}
PAGE_ACTIONS = {
    "page": "viewer",
    "cancel": "operator",
    "retry": "operator",
    "pause": "operator",
    "resume": "operator",
    "run now": "operator",
    "trigger url": "editor",
    "delete": "editor",
}


@pytest.fixture
def team_world(db):
    """A team ("ops", made by its admin) with one member of each role, a task of it with a
    waiting run and a failed one; a non-member; read-only support staff."""
    users = get_user_model().objects
    admin = users.create_user("ops-admin")
    team = team_create(creator=admin, name="Ops")
    people = {"admin": admin}
    for role in ("viewer", "operator", "editor"):
        people[role] = users.create_user(f"ops-{role}")
        member_set(team=team, username=f"ops-{role}", role=role)
    people["outsider"] = users.create_user("outsider")
    # Read-only support, as tms_create_user --staff and single sign-on's staff role make them.
    people["staff"] = users.create_user("support", is_staff=True)
    people["staff"].groups.add(ensure_support_group())
    task = task_create(
        owner=admin,
        team=team,
        runner="noop",
        start_at=datetime(2025, 1, 1, tzinfo=UTC),
        interval=timedelta(hours=1),
        misfire_policy="skip",
    )
    waiting = ExecutionFactory(task=task)
    failed = ExecutionFactory(task=task, status=ExecutionStatus.FAILED, finished_at=datetime(2025, 1, 2, tzinfo=UTC))
    return {"team": team, "people": people, "task": task, "waiting": waiting, "failed": failed}


def expected(role: str, least: str, *, hidden: int = 404) -> str:
    if role == "outsider":
        return str(hidden)
    if role == "staff":
        return "ok" if least == "viewer" else "403"
    return "ok" if RANK[role] >= RANK[least] else "403"


def outcome(code: int) -> str:
    return "ok" if code < 400 else str(code)


def api_call(client: APIClient, action: str, world: dict) -> int:
    task, waiting, failed, team = world["task"], world["waiting"], world["failed"], world["team"]
    url = f"/api/v1/tasks/{task.pk}"
    calls = {
        "read task": lambda: client.get(url),
        "read execution": lambda: client.get(f"/api/v1/executions/{waiting.pk}"),
        "list with ?team=": lambda: client.get("/api/v1/tasks", {"team": team.slug}),
        "pause": lambda: client.post(f"{url}/pause"),
        "resume": lambda: client.post(f"{url}/resume"),
        "run now": lambda: client.post(f"{url}/trigger", {}, format="json"),
        "backfill": lambda: client.post(
            f"{url}/backfill", {"start": "2025-01-01T00:00:00Z", "end": "2025-01-01T02:00:00Z"}, format="json"
        ),
        "cancel": lambda: client.post(f"/api/v1/executions/{waiting.pk}/cancel"),
        "retry": lambda: client.post(f"/api/v1/executions/{failed.pk}/retry"),
        "replay": lambda: client.post("/api/v1/executions/replay", {"task": str(task.pk)}, format="json"),
        "change": lambda: client.patch(url, {"name": "renamed"}, format="json"),
        "trigger url": lambda: client.post(f"{url}/trigger-url"),
        "delete": lambda: client.delete(url),
        "create in team": lambda: client.post("/api/v1/tasks", {"runner": "noop", "team": team.slug}, format="json"),
    }
    return calls[action]().status_code


@pytest.mark.parametrize("role", ROLES)
def test_the_api_lets_each_role_do_what_its_role_allows(team_world, role):
    """Every action in turn (reads first, the delete last, so that none hides another's
    outcome); the whole row of the matrix is compared at once."""
    client = APIClient()
    client.force_authenticate(team_world["people"][role])
    got = {action: outcome(api_call(client, action, team_world)) for action in API_ACTIONS}
    # A non-member naming the team where a request takes one is told it is not theirs (400 on team).
    want = {
        action: expected(role, least, hidden=400 if action in ("list with ?team=", "create in team") else 404)
        for action, least in API_ACTIONS.items()
    }
    assert got == want


def page_call(client, action: str, world: dict) -> int:
    task, waiting, failed = world["task"], world["waiting"], world["failed"]
    calls = {
        "page": lambda: client.get(f"/ui/tasks/{task.pk}/"),
        "pause": lambda: client.post(f"/ui/tasks/{task.pk}/pause/"),
        "resume": lambda: client.post(f"/ui/tasks/{task.pk}/resume/"),
        "run now": lambda: client.post(f"/ui/tasks/{task.pk}/run/"),
        "cancel": lambda: client.post(f"/ui/executions/{waiting.pk}/cancel/"),
        "retry": lambda: client.post(f"/ui/executions/{failed.pk}/retry/"),
        "trigger url": lambda: client.post(f"/ui/tasks/{task.pk}/trigger-url/", {"action": "make"}),
        "delete": lambda: client.post(f"/ui/tasks/{task.pk}/delete/"),
    }
    return calls[action]().status_code


@pytest.mark.parametrize("role", ROLES)
def test_the_back_office_lets_each_role_do_what_its_role_allows(client, team_world, role):
    client.force_login(team_world["people"][role])
    got = {action: outcome(page_call(client, action, team_world)) for action in PAGE_ACTIONS}
    assert got == {action: expected(role, least) for action, least in PAGE_ACTIONS.items()}


@pytest.mark.parametrize(
    ("role", "buttons", "hidden"),
    [
        ("viewer", [], ["pause", "run-now", "edit", "delete"]),
        ("operator", ["pause", "run-now"], ["edit", "delete"]),
        ("editor", ["pause", "run-now", "edit", "delete"], []),
    ],
)
def test_the_task_page_shows_the_buttons_of_the_role(client, team_world, role, buttons, hidden):
    client.force_login(team_world["people"][role])
    page = client.get(f"/ui/tasks/{team_world['task'].pk}/").content.decode()
    for button in buttons:
        assert f'id="{button}"' in page, (role, button)
    for button in hidden:
        assert f'id="{button}"' not in page, (role, button)
    assert ('id="read-only"' in page) == (role == "viewer")


def test_a_refusal_names_the_role_needed(team_world):
    client = APIClient()
    client.force_authenticate(team_world["people"]["viewer"])
    refused = client.post(f"/api/v1/tasks/{team_world['task'].pk}/pause")
    assert refused.status_code == 403
    assert refused.json()["detail"] == (
        "Your role in this team is viewer: to run, pause, resume, cancel, retry, backfill, trigger and replay "
        "you need operator or higher."
    )


def test_teams_are_isolated_and_team_filters_the_lists(team_world):
    people, task = team_world["people"], team_world["task"]
    mine = task_create(owner=people["viewer"], runner="noop")  # the viewer's personal team
    client = APIClient()
    client.force_authenticate(people["viewer"])
    listed = {row["id"] for row in client.get("/api/v1/tasks").json()["results"]}
    assert listed == {str(task.pk), str(mine.pk)}
    ops = {row["id"] for row in client.get("/api/v1/tasks", {"team": team_world["team"].pk}).json()["results"]}
    assert ops == {str(task.pk)}
    runs = client.get("/api/v1/executions", {"team": team_world["team"].slug}).json()["results"]
    assert {row["task"] for row in runs} == {str(task.pk)} and all(row["team"] == task.team_id for row in runs)
    refused = client.get("/api/v1/executions", {"team": "nope"})
    assert refused.status_code == 400 and "team" in refused.json()["errors"]
    # The outsider sees none of the team's tasks or runs, and nothing of another member's personal team.
    outsider = APIClient()
    outsider.force_authenticate(people["outsider"])
    assert outsider.get("/api/v1/tasks").json()["results"] == []
    assert outsider.get("/api/v1/executions").json()["results"] == []
    assert outsider.get(f"/api/v1/tasks/{mine.pk}").status_code == 404
    assert outsider.get(f"/api/v1/tasks/{task.pk}/executions").status_code == 404
    # A member of the team sees its runs whoever created the task.
    assert client.get(f"/api/v1/tasks/{task.pk}/executions").status_code == 200


def test_a_task_is_created_in_the_personal_team_unless_a_team_is_given(team_world):
    editor = team_world["people"]["editor"]
    client = APIClient()
    client.force_authenticate(editor)
    personal = client.post("/api/v1/tasks", {"runner": "noop"}, format="json").json()
    assert personal["team"] == editor.personal_team.pk
    shared = client.post("/api/v1/tasks", {"runner": "noop", "team": team_world["team"].pk}, format="json").json()
    assert shared["team"] == team_world["team"].pk
    for bad in (True, 1.5, [], "x" * 61):
        refused = client.post("/api/v1/tasks", {"runner": "noop", "team": bad}, format="json")
        assert refused.status_code == 400 and "team" in refused.json()["errors"], bad


def test_moving_a_task_needs_editor_in_both_teams_moves_its_runs_and_is_audited(team_world):
    people, task, team = team_world["people"], team_world["task"], team_world["team"]
    editor = people["editor"]
    other = team_create(creator=people["admin"], name="Data")
    client = APIClient()
    client.force_authenticate(editor)
    # Not a member of the target: a 400 on team, as for a team that does not exist.
    assert client.patch(f"/api/v1/tasks/{task.pk}", {"team": other.slug}, format="json").status_code == 400
    member_set(team=other, username=editor.username, role=TeamRole.OPERATOR)
    refused = client.patch(f"/api/v1/tasks/{task.pk}", {"team": other.slug}, format="json")
    assert refused.status_code == 403 and "editor" in refused.json()["detail"]
    member_set(team=other, username=editor.username, role=TeamRole.EDITOR)
    moved = client.patch(f"/api/v1/tasks/{task.pk}", {"team": other.slug, "name": "moved"}, format="json")
    assert moved.status_code == 200, moved.json()
    assert (moved.json()["team"], moved.json()["name"]) == (other.pk, "moved")
    assert set(Execution.objects.filter(task=task).values_list("team_id", flat=True)) == {other.pk}
    entry = AuditEntry.objects.filter(task_id=task.pk, detail="moved").get()
    assert entry.changes == {"team": {"from": team.slug, "to": other.slug}} and entry.actor_id == editor.pk
    # The old team's viewer no longer sees it or its runs.
    viewer = APIClient()
    viewer.force_authenticate(people["viewer"])
    assert viewer.get(f"/api/v1/tasks/{task.pk}").status_code == 404
    assert viewer.get(f"/api/v1/executions/{team_world['waiting'].pk}").status_code == 404


def test_runs_created_later_carry_the_tasks_team(team_world):
    task = team_world["task"]
    client = APIClient()
    client.force_authenticate(team_world["people"]["operator"])
    run = client.post(f"/api/v1/tasks/{task.pk}/trigger", {}, format="json").json()
    retried = client.post(f"/api/v1/executions/{team_world['failed'].pk}/retry").json()
    assert set(Execution.objects.filter(pk__in=[run["id"], retried["id"]]).values_list("team_id", flat=True)) == {
        team_world["team"].pk
    }
    assert Task.objects.get(pk=task.pk).status == TaskStatus.ACTIVE


# -- The pages each role reads, and the buttons it gets ------------------------------------------

#: page -> (the least role that reads it ("viewer": any member), the path); staff read every page
#: a viewer reads, a non-member gets 404. The lists answer 200 to everyone: whether they hold the
#: team's rows is checked below.
PAGE_READS = {
    "task page": ("viewer", lambda w: f"/ui/tasks/{w['task'].pk}/"),
    "task edit page": ("editor", lambda w: f"/ui/tasks/{w['task'].pk}/edit/"),
    "execution page (waiting)": ("viewer", lambda w: f"/ui/executions/{w['waiting'].pk}/"),
    "execution page (failed)": ("viewer", lambda w: f"/ui/executions/{w['failed'].pk}/"),
    "team page": ("viewer", lambda w: f"/ui/teams/{w['team'].pk}/"),
}

#: page -> {button id: the least role that sees it}.
PAGE_BUTTONS = {
    "task page": {
        "pause": "operator",
        "run-now": "operator",
        "backfill-form": "operator",
        "edit": "editor",
        "delete": "editor",
    },
    "execution page (waiting)": {"cancel": "operator"},
    "execution page (failed)": {"retry": "operator"},
    "team page": {"add-member-form": "admin", "rename-form": "admin", "delete-team": "admin"},
}


def allowed(role: str, least: str) -> bool:
    """Whether ``role`` may do what needs ``least`` (staff: read only, by default)."""
    return role in RANK and RANK[role] >= RANK[least]


@pytest.mark.parametrize("role", ROLES)
def test_each_role_reads_the_pages_its_role_allows_and_sees_only_its_buttons(client, team_world, role):
    client.force_login(team_world["people"][role])
    reads = {page: outcome(client.get(path(team_world)).status_code) for page, (_, path) in PAGE_READS.items()}
    assert reads == {page: expected(role, least) for page, (least, _) in PAGE_READS.items()}
    shown = {}
    for page, buttons in PAGE_BUTTONS.items():
        if role == "outsider":
            continue
        html = client.get(PAGE_READS[page][1](team_world)).content.decode()
        shown[page] = {button for button in buttons if f'id="{button}"' in html}
    want = {
        page: {button for button, least in buttons.items() if allowed(role, least)}
        for page, buttons in PAGE_BUTTONS.items()
        if role != "outsider"
    }
    assert shown == want
    # The lists hold the team's task and runs for members and staff, nothing of it for anyone else.
    task, team = team_world["task"], team_world["team"]
    tasks = client.get("/ui/tasks/").content.decode()
    runs = client.get("/ui/executions/").content.decode()
    teams = client.get("/ui/teams/").content.decode()
    member = role != "outsider"
    assert (f"/ui/tasks/{task.pk}/" in tasks, f"/ui/executions/{team_world['failed'].pk}/" in runs) == (member, member)
    assert (f'id="team-{team.pk}"' in teams) == member


#: team action -> the least role that may do it.
TEAM_POSTS = {"add or change a member": "admin", "rename": "admin", "delete": "admin", "remove a member": "admin"}


def team_post(client, action: str, world: dict) -> int:
    team = world["team"]
    calls = {
        "add or change a member": lambda: client.post(
            f"/ui/teams/{team.pk}/members/", {"username": "ops-viewer", "role": "viewer"}
        ),
        "rename": lambda: client.post(f"/ui/teams/{team.pk}/rename/", {"name": "Ops"}),
        # The team holds a task: an admin is told so on the page (a redirect), the others refused.
        "delete": lambda: client.post(f"/ui/teams/{team.pk}/delete/"),
        "remove a member": lambda: client.post(f"/ui/teams/{team.pk}/members/ops-extra/remove/"),
    }
    return calls[action]().status_code


@pytest.mark.parametrize("role", ROLES)
def test_each_role_changes_a_team_only_as_admin(client, team_world, role):
    get_user_model().objects.create_user("ops-extra")
    member_set(team=team_world["team"], username="ops-extra", role=TeamRole.VIEWER)
    client.force_login(team_world["people"][role])
    got = {action: outcome(team_post(client, action, team_world)) for action in TEAM_POSTS}
    assert got == {action: expected(role, least) for action, least in TEAM_POSTS.items()}
    kept = Membership.objects.filter(team=team_world["team"], user__username="ops-extra").exists()
    assert kept == (role != "admin")
    assert Team.objects.filter(pk=team_world["team"].pk).exists()  # it holds a task: never deleted


ADMIN_PAGES = {
    "task list": lambda w: "/admin/tasks_app/task/",
    "task": lambda w: f"/admin/tasks_app/task/{w['task'].pk}/change/",
    "execution list": lambda w: "/admin/executions/execution/",
    "execution": lambda w: f"/admin/executions/execution/{w['failed'].pk}/change/",
}


@pytest.mark.parametrize("role", ROLES)
def test_the_admin_lets_in_staff_only_and_read_only(client, team_world, role):
    """A team role gives nothing in the admin (it is for staff): every member, admin included, is
    sent to the admin's login page. Support staff read every task and run there and save nothing."""
    client.force_login(team_world["people"][role])
    for name, path in ADMIN_PAGES.items():
        answer = client.get(path(team_world))
        if role != "staff":
            assert answer.status_code == 302 and answer["Location"].startswith("/admin/login/"), (name, role)
            continue
        assert answer.status_code == 200, name
        assert 'name="_save"' not in answer.content.decode(), name
    if role == "staff":
        name_before = Task.objects.get(pk=team_world["task"].pk).name
        refused = client.post(ADMIN_PAGES["task"](team_world), {"name": "changed in the admin"})
        assert refused.status_code == 403
        assert Task.objects.get(pk=team_world["task"].pk).name == name_before
