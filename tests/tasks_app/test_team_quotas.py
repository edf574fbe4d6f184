"""Quotas count per team (issue 30): a task counts against its team, a run started on request
against its task's team (whoever asks), a runner's send rate per team; the quota is set on the
team (the per-user form meaning the user's personal team); its admins read it through the API and
only operators with the permission change it; migration 0032 moves each user's quota to their
personal team. Against the real PostgreSQL, through the API where users meet it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from executions.models import Execution, ExecutionOrigin
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_api.moving import task_move
from tasks_app.models import AuditEntry, Membership, QuotaUse, Task, Team, TeamQuota, TeamRole
from tasks_app.quotas import owner_limits, owner_quota_set, rate_take, team_limits, team_quota_set
from tasks_app.teams.services import personal_team_of, team_create
from tests.conftest import client_for
from tests.factories import ExecutionFactory
from tms_core.conf import tms_settings
from tms_core.errors import InvalidInput

pytestmark = pytest.mark.django_db

TASKS = "/api/v1/tasks"
HTTP_TASK = {"runner": "http", "config": {"url": "http://127.0.0.1:9/hook", "method": "POST"}}


@pytest.fixture
def ops(user, other_user):
    """Team "ops": alice its admin, bob an editor."""
    team = team_create(creator=user, name="Ops")
    Membership.objects.create(team=team, user=other_user, role=TeamRole.EDITOR)
    return team


def _later():
    return timezone.now() + timedelta(days=1)


# --- tasks -----------------------------------------------------------------------------------------


def test_the_task_quota_counts_the_team_s_tasks_whoever_created_them(api_client, other_client, user, ops):
    team_quota_set(team=ops, max_tasks=2)
    assert api_client.post(TASKS, {**HTTP_TASK, "team": "ops"}, format="json").status_code == 201
    assert other_client.post(TASKS, {**HTTP_TASK, "team": "ops"}, format="json").status_code == 201

    refused = api_client.post(TASKS, {**HTTP_TASK, "team": "ops"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"]["non_field_errors"][0].startswith("quota: at most 2 tasks in this team; it has 2")
    assert Task.objects.filter(team=ops).count() == 2
    # Her personal team has its own quota (the default), untouched by the team's tasks.
    assert api_client.post(TASKS, HTTP_TASK, format="json").status_code == 201


def test_a_user_s_own_quota_does_not_limit_the_team_s_tasks(api_client, user, ops):
    owner_quota_set(owner=user, max_tasks=1)  # her personal team's
    assert api_client.post(TASKS, HTTP_TASK, format="json").status_code == 201
    assert api_client.post(TASKS, HTTP_TASK, format="json").status_code == 400
    codes = [api_client.post(TASKS, {**HTTP_TASK, "team": "ops"}, format="json").status_code for _ in range(3)]
    assert codes == [201, 201, 201]


def test_a_move_into_a_full_team_is_refused_and_the_task_stays(user, ops):
    team_quota_set(team=ops, max_tasks=1)
    task_create(owner=user, runner="noop", team=ops, start_at=_later())
    mine = task_create(owner=user, runner="noop", start_at=_later())
    with pytest.raises(InvalidInput) as refused:
        task_move(task=mine, team=ops, user=user)
    assert "at most 1 tasks in this team" in refused.value.errors["non_field_errors"][0]
    assert Task.objects.get(pk=mine.pk).team_id == personal_team_of(user).pk
    team_quota_set(team=ops, max_tasks=2)
    assert task_move(task=mine, team=ops, user=user).team_id == ops.pk


# --- runs on request -----------------------------------------------------------------------------


def test_runs_on_request_count_against_the_task_s_team_not_the_user(api_client, other_client, user, other_user, ops):
    team_quota_set(team=ops, max_executions_per_hour=2)
    owner_quota_set(owner=other_user, max_executions_per_hour=100)  # bob's own quota does not apply here
    shared = task_create(owner=user, runner="noop", team=ops, start_at=_later())
    assert api_client.post(f"{TASKS}/{shared.pk}/trigger").status_code == 201
    assert other_client.post(f"{TASKS}/{shared.pk}/trigger").status_code == 201
    over = other_client.post(f"{TASKS}/{shared.pk}/trigger")
    assert over.status_code == 429 and "at most 2 executions per hour" in over.json()["detail"]
    assert list(QuotaUse.objects.values_list("team_id", "amount")) == [(ops.pk, 1), (ops.pk, 1)]
    # Bob's task in his personal team counts against his personal team's quota.
    his = task_create(owner=other_user, runner="noop", start_at=_later())
    assert other_client.post(f"{TASKS}/{his.pk}/trigger").status_code == 201
    assert QuotaUse.objects.filter(team=personal_team_of(other_user)).count() == 1


def test_a_replay_of_two_teams_runs_charges_each_team_all_or_nothing(api_client, user, ops):
    shared = task_create(owner=user, runner="noop", team=ops, start_at=_later())
    mine = task_create(owner=user, runner="noop", start_at=_later())
    when = timezone.now() - timedelta(hours=1)
    for task in (shared, mine):
        ExecutionFactory(task=task, status=S.FAILED, scheduled_for=when, finished_at=when)
    team_quota_set(team=ops, max_executions_per_hour=5)
    owner_quota_set(owner=user, max_executions_per_hour=1)
    body = {"tasks": [str(shared.pk), str(mine.pk)]}

    assert api_client.post("/api/v1/executions/replay", body, format="json").status_code == 201
    assert sorted(QuotaUse.objects.values_list("team_id", "amount")) == sorted(
        [(ops.pk, 1), (personal_team_of(user).pk, 1)]
    )
    # Her personal team's hour is used up: nothing replayed, and the team's charge rolled back.
    again = api_client.post("/api/v1/executions/replay", body, format="json")
    assert again.status_code == 429
    assert QuotaUse.objects.count() == 2
    assert Execution.objects.filter(origin=ExecutionOrigin.REPLAY).count() == 2


def test_a_moved_task_s_runs_count_against_its_new_team(api_client, user, ops):
    task = task_create(owner=user, runner="noop", start_at=_later())
    task_move(task=task, team=ops, user=user)
    team_quota_set(team=ops, max_executions_per_hour=1)
    assert api_client.post(f"{TASKS}/{task.pk}/trigger").status_code == 201
    assert api_client.post(f"{TASKS}/{task.pk}/trigger").status_code == 429


def test_a_send_rate_counts_per_team_and_a_user_s_means_their_personal_team(user, ops):
    assert rate_take(team_id=ops.pk, kind="send:email", limit=1, window=60) == 0
    assert rate_take(team_id=ops.pk, kind="send:email", limit=1, window=60) > 0
    # What belongs to a user (a notification channel) counts in their personal team.
    assert rate_take(owner_id=user.pk, kind="send:email", limit=1, window=60) == 0
    assert QuotaUse.objects.filter(team=personal_team_of(user), kind="send:email").count() == 1


# --- setting and reading a team's quota ------------------------------------------------------------


def test_the_per_user_form_sets_the_personal_team_s_quota_and_audits_it(user, ops):
    owner_quota_set(owner=user, max_tasks=3, fair_weight=2)
    quota = TeamQuota.objects.get(team=personal_team_of(user))
    assert (quota.max_tasks, quota.fair_weight) == (3, 2)
    assert owner_limits(user).max_tasks == 3
    assert team_limits(ops.pk).max_tasks == tms_settings().QUOTA_MAX_TASKS  # the default
    entry = AuditEntry.objects.get(action="quota.update")
    assert entry.changes == {"max_tasks": {"from": None, "to": 3}, "fair_weight": {"from": None, "to": 2}}
    owner_quota_set(owner=user, max_tasks=3)  # no change: no entry
    assert AuditEntry.objects.filter(action="quota.update").count() == 1


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ({"max_tasks": -1}, "max_tasks"),
        ({"fair_weight": 0}, "fair_weight"),
        ({"fair_weight": 1001}, "fair_weight"),
        ({"max_executions_per_hour": "ten"}, "max_executions_per_hour"),
        ({"max_artifact_bytes": True}, "max_artifact_bytes"),
        ({"weight": 2}, "weight"),
    ],
)
def test_a_bad_quota_value_is_refused_on_its_field_and_changes_nothing(ops, limits, field):
    with pytest.raises(InvalidInput) as refused:
        team_quota_set(team=ops, **limits)
    assert set(refused.value.errors) == {field}
    assert not TeamQuota.objects.filter(team=ops).exists()


def _quota_url(team: Team) -> str:
    return f"/api/v1/teams/{team.pk}/quota"


def test_a_team_s_admins_read_its_quota_and_what_it_uses(api_client, user, ops):
    conf = tms_settings()
    team_quota_set(team=ops, max_tasks=10, fair_weight=3)
    task = task_create(owner=user, runner="noop", team=ops, start_at=_later())
    assert api_client.post(f"{TASKS}/{task.pk}/trigger").status_code == 201
    response = api_client.get(_quota_url(ops))
    assert response.status_code == 200, response.content
    assert response.json() == {
        "team": ops.pk,
        "max_tasks": 10,
        "max_executions_per_hour": None,
        "max_artifact_bytes": None,
        "fair_weight": 3,
        "in_force": {
            "max_tasks": 10,
            "max_executions_per_hour": conf.QUOTA_EXECUTIONS_PER_HOUR,
            "max_artifact_bytes": conf.QUOTA_ARTIFACT_BYTES,
            "fair_weight": 3,
        },
        "used": {"tasks": 1, "executions_last_hour": 1, "artifact_bytes": 0},
    }


def test_only_a_team_s_admins_and_staff_read_its_quota(other_client, staff_user, django_user_model, ops):
    # Bob is an editor of ops: 403; a stranger: 404, as for a team that does not exist; staff read.
    refused = other_client.get(_quota_url(ops))
    assert refused.status_code == 403 and "only its admins" in refused.json()["detail"]
    stranger = django_user_model.objects.create_user(username="cat", password="x")
    assert client_for(stranger).get(_quota_url(ops)).status_code == 404
    assert client_for(stranger).get("/api/v1/teams/999999/quota").status_code == 404
    assert client_for(staff_user).get(_quota_url(ops)).status_code == 200


def test_only_operators_with_the_permission_change_a_team_s_quota(api_client, staff_user, ops):
    # Its admin may not raise her own team's quota; nor may staff without the permission.
    assert api_client.patch(_quota_url(ops), {"max_tasks": 5000}, format="json").status_code == 403
    assert client_for(staff_user).patch(_quota_url(ops), {"max_tasks": 5000}, format="json").status_code == 403
    assert not TeamQuota.objects.filter(team=ops).exists()

    staff_user.user_permissions.add(Permission.objects.get(codename="change_teamquota"))
    operator = client_for(type(staff_user).objects.get(pk=staff_user.pk))
    changed = operator.patch(_quota_url(ops), {"max_tasks": 5000, "fair_weight": 4}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["in_force"]["max_tasks"] == 5000 and changed.json()["fair_weight"] == 4
    # Null: back to the default; a field left out keeps its value.
    reset = operator.patch(_quota_url(ops), {"max_tasks": None}, format="json")
    assert reset.json()["max_tasks"] is None
    assert reset.json()["in_force"]["max_tasks"] == tms_settings().QUOTA_MAX_TASKS
    assert reset.json()["fair_weight"] == 4


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_tasks": -1}, "max_tasks"),
        ({"fair_weight": 0}, "fair_weight"),
        ({"fair_weight": 1001}, "fair_weight"),
        ({"max_executions_per_hour": "ten"}, "max_executions_per_hour"),
        ({"max_artifact_bytes": 2**64}, "max_artifact_bytes"),
        ({"weight": 2}, "weight"),
        ({"used": {}}, "used"),
        ({}, "non_field_errors"),
    ],
)
def test_a_bad_quota_change_is_a_400_on_its_field(django_user_model, ops, body, field):
    root = django_user_model.objects.create_superuser(username="root", password="x")
    response = client_for(root).patch(_quota_url(ops), body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]
    assert not TeamQuota.objects.filter(team=ops).exists()


# --- the command -------------------------------------------------------------------------------------


def test_the_command_sets_a_team_s_quota_and_user_means_the_personal_team(user, ops):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("tms_quota", "--team", "ops", "--max-tasks", "5", "--fair-weight", "3", stdout=out)
    assert (team_limits(ops.pk).max_tasks, team_limits(ops.pk).fair_weight) == (5, 3)
    assert "max_tasks: 5 (in force: 5)" in out.getvalue()
    call_command("tms_quota", "--user", user.username, "--max-executions-per-hour", "0", stdout=StringIO())
    assert owner_limits(user).max_executions_per_hour == 0
    call_command("tms_quota", "--team", str(ops.pk), "--max-tasks", "default", stdout=StringIO())
    assert TeamQuota.objects.get(team=ops).max_tasks is None
    entry = AuditEntry.objects.filter(action="quota.update").order_by("id").first()
    assert entry.source == "command:tms_quota"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--team", "nope"], "--team: no team 'nope'"),
        (["--user", "nobody"], "--user: no user 'nobody'"),
        (["--team", "ops", "--max-tasks", "many"], "--max-tasks: 'many' is not a whole number"),
        (["--team", "ops", "--fair-weight", "0"], "--fair-weight: Must be between 1 and 1000"),
    ],
)
def test_the_command_refuses_bad_input_and_changes_nothing(ops, args, message):
    from io import StringIO

    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError) as refused:
        call_command("tms_quota", *args, stdout=StringIO())
    assert message in str(refused.value)
    assert not TeamQuota.objects.filter(team=ops).exists()


# --- an existing install -----------------------------------------------------------------------------

BEFORE = [("tasks_app", "0028_task_team_not_null"), ("executions", "0027_steps_published_sequence")]


@pytest.mark.django_db(transaction=True)
def test_an_existing_install_keeps_each_user_s_quota_in_their_personal_team(django_user_model):
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(BEFORE)
        old = executor.loader.project_state(BEFORE).apps
        users, teams = old.get_model("auth", "User"), old.get_model("tasks_app", "Team")
        alice = users.objects.create(username="alice", password="!")
        bob = users.objects.create(username="bob", password="!")
        for person in (alice, bob):
            teams.objects.create(name=person.username, slug=person.username, personal_of_id=person.pk)
        # Made without the user model's signal and before this migration: no personal team yet.
        late = users.objects.create(username="late", password="!")
        quotas = old.get_model("tasks_app", "OwnerQuota")
        quotas.objects.create(user_id=alice.pk, max_tasks=5, max_executions_per_hour=7, fair_weight=3)
        quotas.objects.create(user_id=late.pk, max_artifact_bytes=0)
        uses = old.get_model("tasks_app", "QuotaUse")
        uses.objects.create(owner_id=alice.pk, kind="executions", amount=4)
        uses.objects.create(owner_id=bob.pk, kind="send:email", amount=1)

        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

        alice_team = Team.objects.get(personal_of_id=alice.pk)
        quota = TeamQuota.objects.get(team=alice_team)
        assert (quota.max_tasks, quota.max_executions_per_hour, quota.max_artifact_bytes, quota.fair_weight) == (
            5,
            7,
            None,
            3,
        )
        late_team = Team.objects.get(personal_of_id=late.pk)
        assert late_team.slug == "late" and Membership.objects.get(team=late_team).role == "admin"
        assert TeamQuota.objects.get(team=late_team).max_artifact_bytes == 0
        assert not TeamQuota.objects.filter(team__personal_of_id=bob.pk).exists()  # none set: the defaults
        assert sorted(QuotaUse.objects.values_list("team__personal_of_id", "kind", "amount")) == sorted(
            [(alice.pk, "executions", 4), (bob.pk, "send:email", 1)]
        )
        real = django_user_model.objects.get(pk=alice.pk)
        assert owner_limits(real).max_executions_per_hour == 7 and owner_limits(real).fair_weight == 3
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def test_the_quota_report_counts_the_team_s_artifacts_as_the_check_does(api_client, user, other_user, ops):
    """A shared team's report said 0 bytes (it counted by uploader, the check by team)."""
    from django.db import transaction

    from tasks_app.models import Artifact, ArtifactStatus
    from tasks_app.quotas import quota_check_artifact

    for uploader, size, status in ((user, 300, ArtifactStatus.READY), (other_user, 200, ArtifactStatus.READY)):
        Artifact.objects.create(
            owner=uploader, team=ops, name=f"a{size}", file="x", sha256="0" * 64, size=size, status=status
        )
    Artifact.objects.create(
        owner=user, team=ops, name="bad", file="x", sha256="0" * 64, size=10_000, status=ArtifactStatus.REJECTED
    )
    assert api_client.get(_quota_url(ops)).json()["used"]["artifact_bytes"] == 500
    # alice's uploads are the team's, not her personal team's.
    assert api_client.get(_quota_url(personal_team_of(user))).json()["used"]["artifact_bytes"] == 0
    # The check counts the same 500: 100 more fit a 600-byte quota, 101 do not.
    team_quota_set(team=ops, max_artifact_bytes=600)
    with transaction.atomic():
        quota_check_artifact(team_id=ops.pk, size=100)
    with pytest.raises(InvalidInput) as refused:
        quota_check_artifact(team_id=ops.pk, size=101)
    assert "you keep 500 and this one has 101" in refused.value.errors["file"][0]
