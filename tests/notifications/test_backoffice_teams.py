"""The back office's notifications page by team (issue 30): a member sees the team's channels and
rules, with the buttons their role allows; every POST checks the role again (403 below editor,
404 outside the team); a new channel goes in the team chosen; the rule form on a task's page offers
the task's team's channels."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model

from notifications import services
from notifications.models import Channel, Rule
from tasks_api.creation import task_create
from tasks_app.teams.services import member_set, team_create
from tests.backoffice.helpers import csrf_client, csrf_token

pytestmark = pytest.mark.django_db

PAGE = "/ui/notifications/"


@pytest.fixture
def ops(db):
    users = get_user_model().objects
    ann = users.create_user("ann")
    team = team_create(creator=ann, name="Ops")
    people = {"admin": ann}
    for role in ("viewer", "editor"):
        people[role] = users.create_user(f"ops-{role}")
        member_set(team=team, username=f"ops-{role}", role=role)
    people["outsider"] = users.create_user("outsider")
    channel = services.channel_create(
        owner=ann, team=team, data={"name": "ops hook", "kind": "webhook", "target": "https://hooks.example.com/o"}
    )
    rule = services.rule_create(owner=ann, data={"channel": channel, "on_failure": True})
    return {"team": team, "people": people, "channel": channel, "rule": rule}


def _channel_form(client) -> str:
    page = client.get(PAGE).content.decode()
    return page[page.index('id="new-channel-form"') :]


def _post(client, path: str, data: dict):
    return client.post(path, {"csrfmiddlewaretoken": csrf_token(client, PAGE), **data})


@pytest.mark.parametrize("role", ["viewer", "editor", "outsider"])
def test_the_page_and_its_posts_follow_the_role(ops, role):
    client = csrf_client(ops["people"][role])
    channel, rule = ops["channel"], ops["rule"]
    page = client.get(PAGE).content.decode()
    edit_channel = f"/ui/notifications/channels/{channel.pk}/edit/"
    assert ("ops hook" in page) == (role != "outsider")
    assert (edit_channel in page) == (role == "editor")  # the buttons the role allows
    assert (f"/ui/notifications/channels/{channel.pk}/test/" in page) == (role == "editor")

    want = {"viewer": 403, "editor": 302, "outsider": 404}[role]
    assert client.get(edit_channel).status_code == (200 if role == "editor" else want)
    assert _post(client, f"/ui/notifications/channels/{channel.pk}/test/", {}).status_code == want
    assert _post(client, f"/ui/notifications/rules/{rule.pk}/delete/", {}).status_code == want
    assert Rule.objects.filter(pk=rule.pk).exists() == (role != "editor")
    assert _post(client, f"/ui/notifications/channels/{channel.pk}/delete/", {}).status_code == want
    assert Channel.objects.filter(pk=channel.pk).exists() == (role != "editor")


def test_a_new_channel_goes_in_the_team_chosen_and_a_viewer_cannot_choose_it(ops):
    editor, viewer, team = ops["people"]["editor"], ops["people"]["viewer"], ops["team"]
    body = {"name": "mailbox", "kind": "email", "target": "ops@example.com", "failing_after": "3", "timezone": "UTC"}
    client = csrf_client(editor)
    assert f'value="{team.slug}"' in _channel_form(client)  # offered in the new channel's team menu
    assert _post(client, "/ui/notifications/channels/new/", {**body, "team": team.slug}).status_code == 302
    assert Channel.objects.get(name="mailbox").team_id == team.pk
    # Left out: the personal team.
    assert _post(client, "/ui/notifications/channels/new/", {**body, "name": "own"}).status_code == 302
    assert Channel.objects.get(name="own").team_id == editor.personal_team.pk
    # A viewer is not offered the team, and a hand-made POST naming it is refused on the form.
    viewing = csrf_client(viewer)
    assert f'value="{team.slug}"' not in _channel_form(viewing)
    refused = _post(viewing, "/ui/notifications/channels/new/", {**body, "name": "sneaky", "team": team.slug})
    assert refused.status_code == 400 and not Channel.objects.filter(name="sneaky").exists()


def test_an_editor_adds_a_rule_from_a_task_page_of_the_team_and_a_viewer_cannot(ops):
    team, channel = ops["team"], ops["channel"]
    task = task_create(owner=ops["people"]["admin"], team=team, runner="noop", interval=timedelta(hours=1))
    page = f"/ui/tasks/{task.pk}/"
    editor = csrf_client(ops["people"]["editor"])
    assert "ops hook" in editor.get(page).content.decode()  # the team's channel in the rule form
    made = editor.post(
        "/ui/notifications/rules/new/",
        {"csrfmiddlewaretoken": csrf_token(editor, page), "from_task": str(task.pk), "channel": str(channel.pk),
         "enabled": "on", "on_retry": "on"},
    )  # fmt: skip
    assert made.status_code == 302, made.content[:300]
    assert Rule.objects.get(task=task).team_id == team.pk
    viewer = csrf_client(ops["people"]["viewer"])
    refused = viewer.post(
        "/ui/notifications/rules/new/",
        {"csrfmiddlewaretoken": csrf_token(viewer, page), "from_task": str(task.pk), "channel": str(channel.pk),
         "enabled": "on", "on_skip": "on"},
    )  # fmt: skip
    assert refused.status_code == 403
    assert Rule.objects.filter(task=task).count() == 1


def test_the_admin_adds_in_the_team_given_and_refuses_an_owner_who_is_not_its_editor(ops, django_user_model):
    from django.test import Client

    from tasks_app.models import Calendar, Limit

    boss = django_user_model.objects.create_superuser(username="boss", password="boss-password")
    admin = Client()
    admin.force_login(boss)
    team, editor, viewer = ops["team"], ops["people"]["editor"], ops["people"]["viewer"]
    channel = {"name": "mailbox", "kind": "email", "target": "ops@example.com", "failing_after": "3", "timezone": "UTC"}
    refused = admin.post("/admin/notifications/channel/add/", {**channel, "owner": viewer.pk, "team": team.pk})
    assert refused.status_code == 200 and "Your role in this team is viewer" in refused.content.decode()
    made = admin.post("/admin/notifications/channel/add/", {**channel, "owner": editor.pk, "team": team.pk})
    assert made.status_code == 302, made.content.decode()[:2000]
    assert Channel.objects.get(name="mailbox").team_id == team.pk

    limit = {"name": "api", "scope": "key", "max_concurrency": "2", "windows": "[]"}
    refused = admin.post("/admin/tasks_app/limit/add/", {**limit, "owner": viewer.pk, "team": team.pk})
    assert refused.status_code == 200 and not Limit.objects.filter(name="api").exists()
    made = admin.post("/admin/tasks_app/limit/add/", {**limit, "owner": editor.pk, "team": team.pk})
    assert made.status_code == 302, made.content.decode()[:2000]
    assert Limit.objects.get(name="api").team_id == team.pk

    calendar = {"name": "plant", "weekends_closed": "on", "weekend_days": "[6, 7]", "extra_dates": "[]"}
    made = admin.post("/admin/tasks_app/calendar/add/", {**calendar, "owner": editor.pk})
    assert made.status_code == 302, made.content.decode()[:2000]
    assert Calendar.objects.get(name="plant").team_id == editor.personal_team.pk  # the default
