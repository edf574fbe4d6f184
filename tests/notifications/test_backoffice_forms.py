"""Notification channels and rules created, edited, tested and deleted from the back office
(issue 28, item 10), through the API's serializers and services: the API's durations ("1h",
"2m"), the API's errors on the fields, nothing saved on a refusal, another user's objects 404."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notifications.models import Channel, Delivery, Rule
from tasks_api.creation import task_create
from tasks_app.models import AuditEntry
from tests.backoffice.helpers import csrf_client, csrf_token

pytestmark = pytest.mark.django_db

PAGE = "/ui/notifications/"


def _post(client, path: str, data: dict, page: str = PAGE):
    return client.post(path, {"csrfmiddlewaretoken": csrf_token(client, page), **data})


def test_create_edit_test_and_delete_a_channel_from_the_page(user, other_user):
    client = csrf_client(user)
    bad = _post(client, "/ui/notifications/channels/new/", {"name": "ops", "kind": "email", "target": "not mail",
                                                             "failing_after": "3", "timezone": "UTC"})  # fmt: skip
    assert bad.status_code == 400 and "Enter a valid e-mail address." in bad.content.decode()
    assert 'value="not mail"' in bad.content.decode()  # what was typed is kept
    assert not Channel.objects.exists()

    hook = "https://hooks.example.com/tms?token=abc123"
    made = _post(client, "/ui/notifications/channels/new/", {"name": "ops hook", "kind": "webhook",
                 "target": hook, "failing_after": "5", "timezone": "UTC"})  # fmt: skip
    assert made.status_code == 302
    channel = Channel.objects.get()
    assert (channel.owner, channel.kind, channel.failing_after) == (user, "webhook", 5)
    page = client.get(PAGE).content.decode()
    assert "Channel ops hook created." in page and channel.secret in page  # the signing secret, shown once
    assert channel.secret not in client.get(PAGE).content.decode()
    assert AuditEntry.objects.filter(action="channel.create", object_id=str(channel.pk)).exists()

    edit = f"/ui/notifications/channels/{channel.pk}/edit/"
    form = client.get(edit).content.decode()
    assert "abc123" not in form  # the target is shown masked
    saved = _post(client, edit, {"name": "ops hook 2", "kind": "webhook", "target": channel.shown_target(),
                                 "failing_after": "2", "quiet_from": "22:00", "quiet_to": "06:00",
                                 "timezone": "Europe/Berlin"}, page=edit)  # fmt: skip
    assert saved.status_code == 302
    channel.refresh_from_db()
    assert (channel.name, channel.failing_after, str(channel.quiet_from), channel.timezone) == (
        "ops hook 2",
        2,
        "22:00:00",
        "Europe/Berlin",
    )
    assert channel.target == "https://hooks.example.com/tms?token=abc123"  # the mask kept it
    half = _post(client, edit, {"name": "x", "kind": "webhook", "target": channel.shown_target(),
                                "failing_after": "2", "quiet_from": "22:00", "timezone": "UTC"}, page=edit)  # fmt: skip
    assert half.status_code == 400 and "Give both ends of the quiet hours, or neither." in half.content.decode()

    assert _post(client, f"/ui/notifications/channels/{channel.pk}/test/", {}).status_code == 302
    assert Delivery.objects.filter(channel=channel, event="test").count() == 1

    theirs = csrf_client(other_user)
    assert theirs.get(edit).status_code == 404
    assert _post(theirs, f"/ui/notifications/channels/{channel.pk}/delete/", {}).status_code == 404
    assert _post(client, f"/ui/notifications/channels/{channel.pk}/delete/", {}).status_code == 302
    assert not Channel.objects.exists()


def test_rules_from_the_notifications_page_and_the_task_page_with_the_apis_durations(user, other_user):
    client = csrf_client(user)
    page = client.get(PAGE).content.decode()
    assert "Create a channel first" in page
    _post(client, "/ui/notifications/channels/new/", {"name": "mailbox", "kind": "email",
          "target": "ops@example.com", "failing_after": "3", "timezone": "UTC"})  # fmt: skip
    channel = Channel.objects.get()
    task = task_create(owner=user, runner="noop", name="nightly", interval=timedelta(hours=1))
    mine = task_create(owner=other_user, runner="noop", name="bobs", interval=timedelta(hours=1))

    nothing = _post(client, "/ui/notifications/rules/new/", {"channel": channel.pk, "enabled": "on"})
    assert nothing.status_code == 400 and "Choose at least one event" in nothing.content.decode()
    bad = _post(client, "/ui/notifications/rules/new/", {"channel": channel.pk, "on_failure": "on",
                                                         "late_after": "soon"})  # fmt: skip
    assert bad.status_code == 400 and "Invalid duration" in bad.content.decode()
    foreign = _post(client, "/ui/notifications/rules/new/", {"channel": channel.pk, "task": str(mine.pk),
                                                             "on_failure": "on"})  # fmt: skip
    assert foreign.status_code == 400
    assert not Rule.objects.exists()

    default = _post(client, "/ui/notifications/rules/new/", {"channel": channel.pk, "enabled": "on",
                    "on_failure": "on", "no_success_within": "1h", "digest_every": "2m"})  # fmt: skip
    assert default.status_code == 302
    rule = Rule.objects.get()
    assert rule.task is None and rule.no_success_within == timedelta(hours=1)
    assert rule.digest_every == timedelta(minutes=2)
    listed = client.get(PAGE).content.decode()
    assert "every task without rules of its own" in listed and "no success within 1h" in listed

    # From the task's page: the task is the page's; the answer returns there.
    task_page = f"/ui/tasks/{task.pk}/"
    assert 'id="add-rule-form"' in client.get(task_page).content.decode()
    added = _post(client, "/ui/notifications/rules/new/", {"from_task": str(task.pk), "channel": channel.pk,
                  "enabled": "on", "on_retry": "on", "late_after": "90s"}, page=task_page)  # fmt: skip
    assert added.status_code == 302 and added["Location"] == task_page
    own = Rule.objects.get(task=task)
    assert own.on_retry and own.late_after == timedelta(seconds=90)
    assert "when it fails an attempt that will be retried; started late by more than 1m30s" in (
        client.get(task_page).content.decode()
    )

    edit = f"/ui/notifications/rules/{own.pk}/edit/"
    changed = _post(client, edit, {"from_task": str(task.pk), "task": str(task.pk), "channel": channel.pk,
                    "on_failure": "on", "running_longer_than": "2m"}, page=edit)  # fmt: skip
    assert changed.status_code == 302 and changed["Location"] == task_page
    own.refresh_from_db()
    assert (own.on_failure, own.on_retry, own.enabled, own.running_longer_than, own.late_after) == (
        True, False, False, timedelta(minutes=2), None
    )  # fmt: skip
    assert csrf_client(other_user).get(edit).status_code == 404
    assert _post(client, f"/ui/notifications/rules/{own.pk}/delete/", {"from_task": str(task.pk)}).status_code == 302
    assert list(Rule.objects.all()) == [rule]
    assert AuditEntry.objects.filter(action="rule.delete", object_id=str(own.pk)).exists()
    # Another user's task page offers no form to add rules to it.
    assert _post(csrf_client(other_user), "/ui/notifications/rules/new/",
                 {"from_task": str(task.pk), "channel": channel.pk, "on_failure": "on"}).status_code == 404  # fmt: skip


def test_the_admin_add_forms_pick_by_name_and_take_the_apis_durations(django_user_model, user):
    from django.test import Client

    boss = django_user_model.objects.create_superuser(username="boss", password="boss-password")
    admin = Client()
    admin.force_login(boss)
    add = admin.get("/admin/notifications/channel/add/").content.decode()
    assert "DatabaseDefault" not in add and "Created at" not in add
    for path in ("/admin/notifications/channel/add/", "/admin/notifications/rule/add/"):
        page = admin.get(path).content.decode()
        assert "vForeignKeyRawIdAdminField" not in page and "admin-autocomplete" in page, path
    made = admin.post("/admin/notifications/channel/add/", {"owner": user.pk, "name": "mailbox", "kind": "email",
                      "target": "ops@example.com", "failing_after": "3", "timezone": "UTC"})  # fmt: skip
    assert made.status_code == 302, made.content.decode()[:2000]
    channel = Channel.objects.get()
    task = task_create(owner=user, runner="noop", name="nightly", interval=timedelta(hours=1))
    rule = admin.post("/admin/notifications/rule/add/", {"owner": user.pk, "task": task.pk, "channel": channel.pk,
                      "enabled": "on", "on_failure": "on", "no_success_within": "1h", "late_after": "2m"})  # fmt: skip
    assert rule.status_code == 302, rule.content.decode()[:2000]
    saved = Rule.objects.get()
    assert (saved.no_success_within, saved.late_after) == (timedelta(hours=1), timedelta(minutes=2))
    change = admin.get(f"/admin/notifications/rule/{saved.pk}/change/").content.decode()
    assert 'value="1h"' in change and 'value="2m"' in change
    bad = admin.post(f"/admin/notifications/rule/{saved.pk}/change/", {"owner": user.pk, "task": task.pk,
                     "channel": channel.pk, "on_failure": "on", "late_after": "soon"})  # fmt: skip
    assert bad.status_code == 200 and "Invalid duration" in bad.content.decode()
    # The task admin takes them too.
    from tasks_app.models import Task

    response = admin.post(f"/admin/tasks_app/task/{task.pk}/change/", {**_task_form(admin, task), "interval": "2h"})
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Task.objects.get(pk=task.pk).interval == timedelta(hours=2)


def _task_form(client, task) -> dict:
    from tests.tasks_api.test_admin import _form_data

    return _form_data(client.get(f"/admin/tasks_app/task/{task.pk}/change/").context["adminform"].form)
