"""Staff without change permissions (read-only support, :mod:`tms_core.roles`) see every task and
execution in the pages but change nothing: the action buttons are hidden and the POSTs refused
with a 403, as the admin refuses its actions. Owners act on their own rows; a change permission
(or superuser) lets staff act on anyone's, through the same services."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from accounts.support_group import ensure_support_group
from executions.models import Execution, ExecutionEvent
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_app.models import Task, TaskStatus
from tests.backoffice.helpers import csrf_client, run
from tests.factories import ExecutionFactory

pytestmark = pytest.mark.django_db

TASK_BUTTONS = ('id="pause"', 'id="run-now"', 'id="edit"', 'id="delete"', 'id="backfill-form"')
TASK_POSTS = ("pause", "resume", "run", "backfill", "delete", "edit")


def _state() -> tuple:
    return (
        list(Task.objects.order_by("pk").values()),
        list(Execution.objects.order_by("pk").values()),
        ExecutionEvent.objects.count(),
    )


@pytest.fixture
def support(django_user_model):
    """A staff user in the support group, as ``tms_create_user --staff`` makes them."""
    sam = django_user_model.objects.create_user(username="sam", password="sam-password-1", is_staff=True)
    sam.groups.add(ensure_support_group())
    return sam


@pytest.fixture
def alices(user):
    task = task_create(owner=user, runner="noop", name="alices job", cron="0 * * * *")
    failed = run(task, outcome="fail")
    running = ExecutionFactory(task=task, status=S.RUNNING)
    return task, failed, running


def test_support_staff_see_alices_pages_without_any_action(support, alices):
    task, failed, running = alices
    client = csrf_client(support)
    page = client.get(f"/ui/tasks/{task.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "alices job" in html and 'id="read-only"' in html
    assert not [button for button in TASK_BUTTONS if button in html]
    for execution in (failed, running):
        html = client.get(f"/ui/executions/{execution.pk}/").content.decode()
        assert 'id="cancel"' not in html and 'id="retry"' not in html
    assert client.get(f"/ui/tasks/{task.pk}/edit/").status_code == 403


@pytest.mark.parametrize("action", TASK_POSTS)
def test_support_staff_task_posts_are_403_and_change_nothing(support, alices, action):
    task, _, _ = alices
    client = csrf_client(support)
    token = client.get("/ui/tasks/").cookies["csrftoken"].value
    before = _state()
    response = client.post(
        f"/ui/tasks/{task.pk}/{action}/",
        {"csrfmiddlewaretoken": token, "name": "taken over", "start": "2026-01-01T00:00", "end": "2026-01-01T03:00"},
    )
    assert response.status_code == 403
    assert _state() == before


@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_support_staff_execution_posts_are_403_and_change_nothing(support, alices, action):
    _, failed, running = alices
    target = running if action == "cancel" else failed
    client = csrf_client(support)
    token = client.get("/ui/tasks/").cookies["csrftoken"].value
    before = _state()
    assert client.post(f"/ui/executions/{target.pk}/{action}/", {"csrfmiddlewaretoken": token}).status_code == 403
    assert _state() == before


def test_a_plain_staff_user_is_read_only_too_but_acts_on_their_own_task(staff_user, alices):
    task, _, _ = alices
    client = csrf_client(staff_user)
    html = client.get(f"/ui/tasks/{task.pk}/").content.decode()
    assert not [button for button in TASK_BUTTONS if button in html]
    own = task_create(owner=staff_user, runner="noop", name="mine", cron="0 * * * *")
    html = client.get(f"/ui/tasks/{own.pk}/").content.decode()
    assert all(button in html for button in TASK_BUTTONS)
    token = client.get("/ui/tasks/").cookies["csrftoken"].value
    assert client.post(f"/ui/tasks/{own.pk}/pause/", {"csrfmiddlewaretoken": token}).status_code == 302
    own.refresh_from_db()
    assert own.status == TaskStatus.PAUSED


def test_staff_granted_change_permissions_operate_through_the_services(support, alices, admin_user):
    task, failed, running = alices
    support.user_permissions.add(
        Permission.objects.get(codename="change_task", content_type__app_label="tasks_app"),
        Permission.objects.get(codename="change_execution", content_type__app_label="executions"),
    )
    client = csrf_client(support)
    html = client.get(f"/ui/tasks/{task.pk}/").content.decode()
    assert 'id="pause"' in html and 'id="run-now"' in html and 'id="delete"' not in html  # no delete_task
    assert 'id="cancel"' in client.get(f"/ui/executions/{running.pk}/").content.decode()
    token = client.get("/ui/tasks/").cookies["csrftoken"].value
    assert client.post(f"/ui/tasks/{task.pk}/pause/", {"csrfmiddlewaretoken": token}).status_code == 302
    task.refresh_from_db()
    assert task.status == TaskStatus.PAUSED
    assert client.post(f"/ui/tasks/{task.pk}/delete/", {"csrfmiddlewaretoken": token}).status_code == 403
    assert client.post(f"/ui/executions/{failed.pk}/retry/", {"csrfmiddlewaretoken": token}).status_code == 302
    assert Execution.objects.filter(retry_of=failed).count() == 1

    html = csrf_client(admin_user).get(f"/ui/tasks/{task.pk}/").content.decode()
    assert all(button in html for button in ('id="resume"', 'id="run-now"', 'id="edit"', 'id="delete"'))


def _forbidden(response) -> str:
    """A 403 of the pages: the styled page with the top bar, not Django's bare "403 Forbidden"."""
    html = response.content.decode()
    assert response.status_code == 403
    assert 'id="forbidden"' in html and 'class="topbar"' in html and 'href="/ui/tasks/"' in html
    return html


def test_a_page_the_role_forbids_is_the_styled_403_naming_the_role_needed(user, support, django_user_model):
    """Issue 44: a page the role forbids answered a bare "403 Forbidden" with no navigation."""
    from tasks_app.teams.services import member_set, team_create

    team = team_create(creator=user, name="Ops")
    django_user_model.objects.create_user("olga")
    member_set(team=team, username="olga", role="operator")
    task = task_create(owner=user, team=team, runner="noop", name="ops job", cron="0 * * * *")
    olga = csrf_client(django_user_model.objects.get(username="olga"))

    html = _forbidden(olga.get(f"/ui/tasks/{task.pk}/edit/"))
    assert '<dd id="role-needed"><strong>editor</strong> or higher, in its team</dd>' in html
    assert '<dd id="role-held"><strong>operator</strong></dd>' in html
    assert "Your role in this team is operator: to create, change, move and delete tasks" in html
    # Support staff see every task and are in no team: still named, the role the change needs.
    html = _forbidden(csrf_client(support).get(f"/ui/tasks/{task.pk}/edit/"))
    assert '<dd id="role-needed"><strong>editor</strong>' in html and "you are not a member of its team" in html
    # A team's notification channels: the editor role.
    from notifications import services as notification_services

    channel = notification_services.channel_create(
        owner=user, team=team, data={"name": "mailbox", "kind": "email", "target": "ops@example.com"}
    )
    html = _forbidden(olga.get(f"/ui/notifications/channels/{channel.pk}/edit/"))
    assert '<dd id="role-needed"><strong>editor</strong>' in html and '<dd id="role-held"><strong>operator' in html
    # A team's admin pages: the admin role.
    html = _forbidden(olga.get(f"/ui/teams/{team.pk}/service-accounts/1/"))
    assert '<dd id="role-needed"><strong>admin</strong> or higher, in its team</dd>' in html
