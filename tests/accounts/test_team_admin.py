"""Teams and memberships in the Django admin (issue 46): every write goes through the team
services the API calls (:mod:`tasks_app.teams.services`), with the same rules: a taken slug, the last
admin demoted or removed, a team that still holds tasks, a personal team's one member, a staff
member who is neither the team's admin nor holds ``tasks_app.change_team``: each an error on
the form or an error message, never a 500 and never Django's "deleted successfully"."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts.service_accounts import service_account_create
from tasks_api.creation import task_create
from tasks_app.models import AuditEntry, Membership, Team
from tasks_app.teams.services import member_set, team_create

pytestmark = pytest.mark.django_db

TEAMS = "/admin/tasks_app/team/"
MEMBERS = "/admin/tasks_app/membership/"


@pytest.fixture
def users(db):
    make = get_user_model().objects.create_user
    return {name: make(name) for name in ("ann", "ben", "cat")}


@pytest.fixture
def shared(users, admin_user):
    """A shared team: ann its one admin, ben a viewer."""
    team = team_create(creator=users["ann"], name="Data", slug="data")
    member_set(team=team, username="ben", role="viewer")
    return team


def members_of(team: Team) -> dict[str, str]:
    return dict(Membership.objects.filter(team=team).values_list("user__username", "role"))


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def field_errors(response) -> dict[str, list[str]]:
    form = response.context["adminform"].form
    return {name: list(errors) for name, errors in form.errors.items()}


def test_staff_create_a_team_through_the_service_and_a_taken_slug_is_an_error_on_its_field(admin_client, admin_user):
    page = admin_client.get(f"{TEAMS}add/")
    assert page.status_code == 200
    response = admin_client.post(f"{TEAMS}add/", {"name": "Data Platform", "slug": ""})
    assert response.status_code == 302, field_errors(response)
    team = Team.objects.get(slug="data-platform")
    # As team_create does it: the creator its admin, managed (made by staff), audited.
    assert (team.name, team.managed, members_of(team)) == ("Data Platform", True, {"admin": "admin"})
    assert AuditEntry.objects.filter(action="team.create", object_id=str(team.pk)).count() == 1

    taken = admin_client.post(f"{TEAMS}add/", {"name": "Again", "slug": "data-platform"})
    assert taken.status_code == 200
    assert field_errors(taken) == {"slug": ["The slug 'data-platform' is taken: choose another."]}
    assert Team.objects.filter(name="Again").count() == 0


def test_a_rename_goes_through_the_service_and_the_slug_stays(admin_client, shared):
    response = admin_client.post(f"{TEAMS}{shared.pk}/change/", {"name": "Data Science", "slug": "other"})
    assert response.status_code == 302
    shared.refresh_from_db()
    assert (shared.name, shared.slug) == ("Data Science", "data")
    assert AuditEntry.objects.filter(action="team.update", object_id=str(shared.pk)).count() == 1
    blank = admin_client.post(f"{TEAMS}{shared.pk}/change/", {"name": "  "})
    assert blank.status_code == 200 and "name" in field_errors(blank)


def test_a_team_holding_a_task_is_not_deleted_and_says_why(admin_client, shared, users):
    task_create(owner=users["ann"], team=shared, runner="noop", name="nightly")
    logged = LogEntry.objects.count()
    response = admin_client.post(f"{TEAMS}{shared.pk}/delete/", {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert Team.objects.filter(pk=shared.pk).exists()
    assert messages_of(response) == [
        "data: not deleted: team: The team still holds 1 task(s) (deleted ones keep their history here): move or "
        "delete them first."
    ]
    assert response.redirect_chain[-1][0] == f"{TEAMS}{shared.pk}/change/"
    assert LogEntry.objects.count() == logged  # Django's log entry for the deletion was rolled back

    # Nor a personal one, in bulk (Django's own delete action is gone: its count would be untrue).
    personal = Team.objects.get(personal_of=users["cat"])
    bulk = admin_client.post(
        TEAMS, {"action": "remove_selected", "_selected_action": [personal.pk, shared.pk]}, follow=True
    )
    assert Team.objects.filter(pk__in=[personal.pk, shared.pk]).count() == 2
    assert any("cat: not deleted: team: A personal team cannot be deleted." in m for m in messages_of(bulk))
    assert "delete_selected" not in admin_client.get(TEAMS).content.decode()


def test_an_empty_team_is_deleted(admin_client, shared):
    response = admin_client.post(f"{TEAMS}{shared.pk}/delete/", {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert not Team.objects.filter(pk=shared.pk).exists()
    assert AuditEntry.objects.filter(action="team.delete", object_id=str(shared.pk)).count() == 1


def test_add_a_member_and_the_services_refusals_land_on_the_fields(admin_client, shared, users):
    page = admin_client.get(f"{MEMBERS}add/?team={shared.pk}")
    assert page.status_code == 200
    added = admin_client.post(f"{MEMBERS}add/", {"team": shared.pk, "username": "cat", "role": "operator"})
    assert added.status_code == 302, field_errors(added)
    assert members_of(shared) == {"ann": "admin", "ben": "viewer", "cat": "operator"}
    audit = AuditEntry.objects.filter(action="team.member", object_id=str(shared.pk)).order_by("-id").first()
    assert audit.changes == {"username": "cat", "role": {"from": None, "to": "operator"}}

    unknown = admin_client.post(f"{MEMBERS}add/", {"team": shared.pk, "username": "nobody", "role": "viewer"})
    assert unknown.status_code == 200
    assert field_errors(unknown) == {"username": ["No active user 'nobody'."]}
    personal = Team.objects.get(personal_of=users["ann"])
    alone = admin_client.post(f"{MEMBERS}add/", {"team": personal.pk, "username": "ben", "role": "viewer"})
    assert field_errors(alone) == {
        "username": ["A personal team has one member, its user: create a team to share tasks."]
    }
    robot = service_account_create(team=shared, name="deploy-ci", role="operator", creator=users["ann"])
    as_robot = admin_client.post(
        f"{MEMBERS}add/", {"team": shared.pk, "username": robot.user.get_username(), "role": "admin"}
    )
    assert list(field_errors(as_robot)) == ["username"]
    assert Membership.objects.filter(team=personal).count() == 1


def test_the_last_admin_is_neither_demoted_nor_removed(admin_client, shared):
    ann = Membership.objects.get(team=shared, user__username="ann")
    demoted = admin_client.post(f"{MEMBERS}{ann.pk}/change/", {"role": "editor"})
    assert demoted.status_code == 200
    assert field_errors(demoted) == {"role": ["This is the team's last admin: make another member admin first."]}
    removed = admin_client.post(f"{MEMBERS}{ann.pk}/delete/", {"post": "yes"}, follow=True)
    assert messages_of(removed) == [
        "ann in data: not deleted: username: This is the team's last admin: make another member admin first."
    ]
    bulk = admin_client.post(MEMBERS, {"action": "remove_selected", "_selected_action": [ann.pk]}, follow=True)
    assert any("This is the team's last admin" in m for m in messages_of(bulk))
    assert members_of(shared) == {"ann": "admin", "ben": "viewer"}

    # With another admin, both go through.
    ben = Membership.objects.get(team=shared, user__username="ben")
    assert admin_client.post(f"{MEMBERS}{ben.pk}/change/", {"role": "admin"}).status_code == 302
    assert admin_client.post(f"{MEMBERS}{ann.pk}/change/", {"role": "viewer"}).status_code == 302
    response = admin_client.post(f"{MEMBERS}{ann.pk}/delete/", {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert members_of(shared) == {"ben": "admin"}


def test_staff_without_the_team_permission_act_only_where_they_are_its_admin(shared, users):
    """The API's rule: a team's admin, or ``tasks_app.change_team``. Staff with the membership
    permissions alone manage the teams they are admin of, and get the API's words elsewhere."""
    staff = get_user_model().objects.create_user("sam", is_staff=True)
    staff.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="tasks_app",
            codename__in=["view_membership", "add_membership", "change_membership", "delete_membership", "view_team"],
        )
    )
    client = Client()
    client.force_login(staff)
    refused = client.post(f"{MEMBERS}add/", {"team": shared.pk, "username": "cat", "role": "viewer"})
    assert refused.status_code == 200
    assert field_errors(refused) == {"team": ["You may look at this team but not change it."]}
    ben = Membership.objects.get(team=shared, user__username="ben")
    removed = client.post(f"{MEMBERS}{ben.pk}/delete/", {"post": "yes"}, follow=True)
    assert messages_of(removed) == ["ben in data: not deleted: You may look at this team but not change it."]
    assert members_of(shared) == {"ann": "admin", "ben": "viewer"}

    member_set(team=shared, username="sam", role="admin")
    assert client.post(f"{MEMBERS}add/", {"team": shared.pk, "username": "cat", "role": "viewer"}).status_code == 302
    assert members_of(shared)["cat"] == "viewer"


def test_the_lists_take_the_same_queries_for_three_teams_as_for_thirty(admin_client, users):
    def queries(path: str) -> tuple[int, str]:
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(path)
        assert response.status_code == 200
        return len(captured), response.content.decode()

    for n in range(3):
        team = team_create(creator=users["ann"], name=f"Team {n}")
        member_set(team=team, username="ben", role="viewer")
    few_teams, _ = queries(TEAMS)
    few_members, _ = queries(MEMBERS)
    for n in range(3, 30):
        team = team_create(creator=users["ann"], name=f"Team {n}")
        member_set(team=team, username="ben", role="viewer")
    many_teams, html = queries(TEAMS)
    many_members, members_html = queries(MEMBERS)
    assert (many_teams, many_members) == (few_teams, few_members)
    # The member count is people only (a service account is on its own page, as in the API).
    service_account_create(
        team=Team.objects.get(slug="team-0"), name="deploy-ci", role="operator", creator=users["ann"]
    )
    _, html = queries(f"{TEAMS}?q=team-0")
    assert re.search(r'<td class="field-member_count">2</td>', html), html
    _, members_html = queries(f"{MEMBERS}?q=team-0")
    assert "deploy-ci" not in members_html
