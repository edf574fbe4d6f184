"""The Django admin, driven server-side with Django's test client: every write goes through the
services (or is read-only), actions report per object, secrets are masked, staff can look."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django import forms
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from django.utils.duration import duration_string

from accounts.support_group import SUPPORT_GROUP
from executions.models import Execution, ExecutionEvent, SkippedOccurrence
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_api.selectors import task_why
from tasks_api.task_config import task_config
from tasks_app.masking import MASK, mask_config, unmask_config
from tasks_app.models import Task, TaskStatus
from tests.factories import ExecutionFactory

pytestmark = pytest.mark.django_db

TASKS = "/admin/tasks_app/task/"
EXECUTIONS = "/admin/executions/execution/"
SECRET = "Bearer sk-live-0123456789"


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_superuser(username="boss", password="boss-password")


@pytest.fixture
def admin_client(admin_user) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


def _form_data(form) -> dict[str, Any]:
    """What a browser would post for ``form`` as rendered (its initial values)."""
    data = {}
    for name, field in form.fields.items():
        value = form[name].value()
        if isinstance(field, forms.MultipleChoiceField | forms.ModelMultipleChoiceField):
            # A multiple select posts one value per chosen option, and nothing when none is.
            if value:
                data[name] = [str(v) for v in value]
            continue
        if value is None:
            value = ""
        elif isinstance(value, bool):
            if not value:
                continue
            value = "on"
        elif isinstance(value, timedelta):
            value = duration_string(value)
        elif isinstance(value, datetime):
            value = (value if timezone.is_naive(value) else timezone.localtime(value)).strftime("%Y-%m-%d %H:%M:%S.%f")
        elif isinstance(value, dict | list):
            value = json.dumps(value)
        data[name] = str(value)
    return data


def _add(client: Client, **fields: str):
    form = client.get(f"{TASKS}add/").context["adminform"].form
    return client.post(f"{TASKS}add/", {**_form_data(form), **fields})


def _change(client: Client, task: Task, **fields: str):
    form = client.get(f"{TASKS}{task.pk}/change/").context["adminform"].form
    return client.post(f"{TASKS}{task.pk}/change/", {**_form_data(form), **fields})


def _messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def _action(client: Client, url: str, action: str, objects: list) -> list[str]:
    response = client.post(url, {"action": action, "_selected_action": [str(o.pk) for o in objects]}, follow=True)
    assert response.status_code == 200
    return [str(m) for m in response.context["messages"]]


# --- add and change go through the services ---------------------------------------------------


def test_a_task_added_in_the_admin_is_materialised_and_runs(admin_client, admin_user):
    response = _add(admin_client, name="from admin", runner="noop", interval="00:00:10")
    assert response.status_code == 302, response.context["adminform"].form.errors
    task = Task.objects.get(name="from admin")
    assert task.owner == admin_user and task.status == TaskStatus.ACTIVE
    assert task.next_run_at is not None and Execution.objects.filter(task=task).count() >= 5
    assert task_why(task=task, at=timezone.now() + timedelta(seconds=1)).verdict != "after_end"
    first = Execution.objects.filter(task=task).order_by("scheduled_for").first()
    assert ExecutionEvent.objects.filter(execution=first, to_status=S.SCHEDULED).exists()


def test_a_runner_that_is_not_configured_is_refused_on_the_form(admin_client):
    response = _add(admin_client, name="bad", runner="shell")
    assert response.status_code == 200
    assert "runner" in response.context["adminform"].form.errors
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"runner": "http", "config": '{"url": "not a url"}'}, "config"),
        ({"cron": "*/5 * * * *", "interval": "00:00:10"}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"retry_backoff": "00:10:00", "retry_backoff_max": "00:00:01"}, "retry_backoff_max"),
    ],
)
def test_bad_input_gets_the_apis_messages_on_the_fields(admin_client, fields, field):
    response = _add(admin_client, **{"name": "bad", "runner": "noop", **fields})
    errors = response.context["adminform"].form.errors
    assert response.status_code == 200 and field in errors, errors
    assert not Task.objects.exists()


def test_changing_a_task_goes_through_task_update_and_keeps_sub_second_start_at(admin_client, admin_user):
    start = timezone.now().replace(microsecond=123456) + timedelta(seconds=5)
    task = task_create(owner=admin_user, runner="noop", start_at=start, interval=timedelta(seconds=10))
    response = _change(admin_client, task, name="renamed")
    assert response.status_code == 302, response.context["adminform"].form.errors
    task.refresh_from_db()
    assert task.name == "renamed" and task.start_at == start
    for execution in Execution.objects.filter(task=task):
        assert task_why(task=task, at=execution.scheduled_for).verdict != "not_a_fire_time"
    # A schedule change replaces the future runs, as PATCH does.
    old = set(Execution.objects.filter(task=task, status=S.SCHEDULED).values_list("pk", flat=True))
    assert _change(admin_client, task, interval="00:00:20").status_code == 302
    assert Execution.objects.filter(pk__in=old, status=S.CANCELLED, superseded=True).count() == len(old)
    task.refresh_from_db()
    assert task.interval == timedelta(seconds=20)


def test_status_is_read_only_in_the_change_form(admin_client, admin_user):
    task = task_create(owner=admin_user, runner="noop", interval=timedelta(seconds=10))
    form = admin_client.get(f"{TASKS}{task.pk}/change/").context["adminform"].form
    assert "status" not in form.fields and "owner" not in form.fields
    _change(admin_client, task, status="PAUSED")
    task.refresh_from_db()
    assert task.status == TaskStatus.ACTIVE


# --- actions -----------------------------------------------------------------------------------


def test_pause_resume_and_run_now_in_bulk_report_each_task(admin_client, admin_user):
    tasks = [task_create(owner=admin_user, runner="noop", interval=timedelta(seconds=2)) for _ in range(2)]
    scheduled = Execution.objects.filter(task__in=tasks, status=S.SCHEDULED).count()
    assert scheduled >= 20

    notes = _action(admin_client, TASKS, "pause_selected", tasks)
    assert sum("paused;" in note for note in notes) == 2 and "2 paused, 0 refused." in notes
    assert not Execution.objects.filter(task__in=tasks, status=S.SCHEDULED).exists()
    assert all(t.status == TaskStatus.PAUSED for t in Task.objects.filter(pk__in=[t.pk for t in tasks]))
    actors = set(ExecutionEvent.objects.filter(to_status=S.CANCELLED).values_list("actor", flat=True))
    assert actors == {"user:boss"}

    notes = _action(admin_client, TASKS, "resume_selected", tasks)
    assert sum("resumed;" in note for note in notes) == 2
    assert Execution.objects.filter(task__in=tasks, status=S.SCHEDULED).count() >= 20

    notes = _action(admin_client, TASKS, "run_now_selected", tasks[:1])
    assert any("created, due now" in note for note in notes)
    assert Execution.objects.filter(task=tasks[0], origin="trigger").count() == 1


def test_delete_is_a_soft_delete_through_the_service(admin_client, admin_user):
    task = task_create(owner=admin_user, runner="noop", interval=timedelta(seconds=10))
    confirm = admin_client.get(f"{TASKS}{task.pk}/delete/")
    assert confirm.status_code == 200 and not confirm.context["perms_lacking"]
    response = admin_client.post(f"{TASKS}{task.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.status == TaskStatus.DELETED
    assert Execution.objects.filter(task=task).exists()  # history kept
    assert not Execution.objects.filter(task=task, status__in=[S.SCHEDULED, S.PENDING, S.RUNNING]).exists()

    more = [task_create(owner=admin_user, runner="noop", interval=timedelta(seconds=10)) for _ in range(2)]
    response = admin_client.post(
        TASKS, {"action": "delete_selected", "_selected_action": [str(t.pk) for t in more], "post": "yes"}, follow=True
    )
    assert response.status_code == 200
    assert Task.objects.filter(pk__in=[t.pk for t in more], status=TaskStatus.DELETED).count() == 2


def test_cancel_and_retry_executions_in_bulk(admin_client, admin_user):
    task = task_create(owner=admin_user, runner="noop", start_at=timezone.now() + timedelta(hours=1))
    waiting = ExecutionFactory(task=task, scheduled_for=timezone.now() + timedelta(minutes=5))
    failed = ExecutionFactory(task=task, scheduled_for=timezone.now() - timedelta(minutes=5), status=S.FAILED)
    done = ExecutionFactory(task=task, scheduled_for=timezone.now() - timedelta(minutes=6), status=S.SUCCEEDED)

    notes = _action(admin_client, EXECUTIONS, "cancel_selected", [waiting, done])
    assert any(note.startswith(f"execution {waiting.pk}") and "cancelled (was SCHEDULED" in note for note in notes)
    assert any(note.startswith(f"execution {done.pk}") and "not cancelled" in note for note in notes)
    assert "1 cancelled, 1 refused." in notes
    waiting.refresh_from_db()
    assert waiting.status == S.CANCELLED

    notes = _action(admin_client, EXECUTIONS, "retry_selected", [failed])
    retry = Execution.objects.get(retry_of=failed)
    assert any(f"retried as execution {retry.pk}" in note for note in notes)
    assert ExecutionEvent.objects.filter(execution=retry, actor="user:boss").exists()


# --- read-only models --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["/admin/executions/skippedoccurrence/add/", f"{EXECUTIONS}add/", "/admin/executions/worker/add/"],
)
def test_platform_rows_cannot_be_added(admin_client, url):
    assert admin_client.get(url).status_code == 403


def test_skipped_occurrences_show_no_add_button(admin_client, admin_user):
    task = task_create(owner=admin_user, runner="noop", interval=timedelta(seconds=10))
    SkippedOccurrence.objects.create(task=task, scheduled_for=timezone.now(), reason="missed")
    page = admin_client.get("/admin/executions/skippedoccurrence/")
    assert page.status_code == 200 and not page.context["has_add_permission"]


# --- the execution page and times --------------------------------------------------------------


def test_the_execution_page_shows_error_and_output_first_and_times_with_seconds(admin_client, admin_user):
    task = task_create(owner=admin_user, runner="noop", start_at=timezone.now() + timedelta(hours=1))
    at = timezone.now().replace(microsecond=0) - timedelta(minutes=3)
    execution = ExecutionFactory(
        task=task, scheduled_for=at, status=S.FAILED, error="boom: exit code 3", output="partial output"
    )
    page = admin_client.get(f"{EXECUTIONS}{execution.pk}/change/").content.decode()
    assert "boom: exit code 3" in page and "partial output" in page
    assert page.index("boom: exit code 3") < page.index("Lease owner")
    assert at.strftime("%Y-%m-%d %H:%M:%S") in page  # with seconds
    listing = admin_client.get(EXECUTIONS).content.decode()
    assert at.strftime("%Y-%m-%d %H:%M:%S") in listing
    assert not re.search(r"\d{1,2}:\d{2} [ap]\.m\.", listing)


# --- secrets -----------------------------------------------------------------------------------


def test_mask_config_masks_secret_looking_values_and_unmask_restores_them():
    config = {
        "url": "https://user:pw@example.com/hook",
        "headers": {"Authorization": SECRET, "Accept": "application/json", "X-Api-Key": "k"},
        "env": {"DB_URL": "postgres://x", "MODE": "fast"},
        "api_token": "t",
        "password": "",
        "command": ["run"],
    }
    masked = mask_config(config)
    assert masked == {
        "url": f"https://user:{MASK}@example.com/hook",
        "headers": {"Authorization": MASK, "Accept": "application/json", "X-Api-Key": MASK},
        "env": {"DB_URL": MASK, "MODE": MASK},
        "api_token": MASK,
        "password": "",
        "command": ["run"],
    }
    assert config["headers"]["Authorization"] == SECRET  # never changed in place
    assert unmask_config(masked, config) == config
    edited = {**masked, "headers": {**masked["headers"], "Accept": "text/plain"}}
    assert unmask_config(edited, config)["headers"] == {**config["headers"], "Accept": "text/plain"}


def test_config_secrets_are_masked_in_the_admin_and_kept_when_saving(admin_client, admin_user):
    config = {"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": SECRET}}
    task = task_create(owner=admin_user, runner="http", config=config, start_at=timezone.now() + timedelta(hours=1))
    page = admin_client.get(f"{TASKS}{task.pk}/change/").content.decode()
    assert "sk-live" not in page and MASK in page
    assert _change(admin_client, task, name="renamed").status_code == 302
    task.refresh_from_db()
    assert task_config(task) == config and task.name == "renamed"
    assert SECRET not in json.dumps(task.config)  # stored encrypted


# --- staff: read-only support ------------------------------------------------------------------


def test_staff_made_by_the_command_can_log_in_and_look_but_not_change(admin_user):
    task = task_create(
        owner=admin_user,
        runner="http",
        config={"url": "http://127.0.0.1:9/", "headers": {"Authorization": SECRET}},
        start_at=timezone.now() + timedelta(minutes=1),
    )
    call_command(
        "tms_create_user", "sam", "--staff", "--password", "sam-password-1", stdout=io.StringIO(), stderr=io.StringIO()
    )
    sam = get_user_model().objects.get(username="sam")
    assert list(sam.groups.values_list("name", flat=True)) == [SUPPORT_GROUP]
    client = Client()
    # Through the login page itself (the lockout backend needs the request Client.login lacks).
    login = client.post("/admin/login/", {"username": "sam", "password": "sam-password-1"})
    assert login.status_code == 302
    index = client.get("/admin/")
    assert index.status_code == 200
    assert "have permission to view or edit anything" not in index.content.decode()
    assert client.get(TASKS).status_code == 200
    assert client.get(EXECUTIONS).status_code == 200
    detail = client.get(f"{TASKS}{task.pk}/change/")
    assert detail.status_code == 200 and "sk-live" not in detail.content.decode()
    assert client.get(f"{TASKS}add/").status_code == 403
    assert client.post(f"{TASKS}{task.pk}/delete/", {"post": "yes"}).status_code == 403
    # No actions for read-only support: posting one changes nothing.
    client.post(TASKS, {"action": "pause_selected", "_selected_action": [str(task.pk)]})
    task.refresh_from_db()
    assert task.status != TaskStatus.PAUSED


def test_retention_settings_are_changed_in_the_admin_through_the_service(admin_client, admin_user):
    task = task_create(owner=admin_user, runner="noop", start_at=timezone.now() + timedelta(hours=1))
    response = _change(admin_client, task, keep_last="5", keep_for="2 00:00:00", keep_failed_longer="on")
    assert response.status_code == 302, response.context["adminform"].form.errors
    task.refresh_from_db()
    assert (task.keep_last, task.keep_for, task.keep_failed_longer) == (5, timedelta(days=2), True)
    bad = _change(admin_client, task, keep_last="0", keep_for="00:10:00")
    assert bad.status_code == 200 and {"keep_last", "keep_for"} <= set(bad.context["adminform"].form.errors)
    task.refresh_from_db()
    assert task.keep_last == 5


# --- named limits ----------------------------------------------------------------------------

LIMITS = "/admin/tasks_app/limit/"


def _limit_form(**fields: Any) -> dict[str, Any]:
    return {"owner": "", "name": "api", "scope": "key", "key": "", "max_concurrency": "", "windows": "[]", **fields}


def test_limits_are_added_and_changed_in_the_admin_through_the_services(admin_client, admin_user):
    from tasks_app.models import AuditEntry, Limit

    # Bad input: an error on the field, no limit, no server error (the form once forwarded the
    # page's read-only "use" column to the service: a TypeError on every add).
    response = admin_client.post(f"{LIMITS}add/", _limit_form(windows='[{"count": 0, "seconds": 1}]'))
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["windows"]
    assert not Limit.objects.exists()

    windows = '[{"count": 10, "seconds": 1}]'
    response = admin_client.post(f"{LIMITS}add/", _limit_form(owner=admin_user.pk, windows=windows))
    assert response.status_code == 302, response.context["adminform"].form.errors
    limit = Limit.objects.get()
    assert (limit.owner, limit.name, limit.windows) == (admin_user, "api", [{"count": 10, "seconds": 1.0}])

    response = admin_client.post(f"{LIMITS}{limit.pk}/change/", _limit_form(windows=windows, max_concurrency="2"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    limit.refresh_from_db()
    assert limit.max_concurrency == 2 and limit.owner == admin_user  # the owner stays
    assert AuditEntry.objects.filter(object_type="limit").count() == 2  # created, updated
    assert "not used yet" in admin_client.get(f"{LIMITS}{limit.pk}/change/").content.decode()


# --- after (workflows) -------------------------------------------------------------------------


def test_after_is_set_and_changed_in_the_admin_through_the_services(admin_client, admin_user):
    first = task_create(owner=admin_user, runner="noop", name="first")
    response = _add(admin_client, name="second", runner="noop", after=json.dumps([{"task": str(first.pk)}]))
    assert response.status_code == 302, response.context["adminform"].form.errors
    second = Task.objects.get(name="second")
    assert second.has_after and second.next_run_at is None
    assert not Execution.objects.filter(task=second).exists(), "no schedule: it runs only after first"
    # A cycle is an error on the form's field, as in the API.
    response = _change(admin_client, first, after=json.dumps([{"task": str(second.pk)}]))
    assert response.status_code == 200
    assert "cycle" in " ".join(response.context["adminform"].form.errors["after"])
    response = _change(admin_client, second, after="[]")
    assert response.status_code == 302
    second.refresh_from_db()
    assert not second.has_after


def test_the_change_page_shows_upstream_and_downstream_tasks_read_only(admin_client, admin_user):
    first = task_create(owner=admin_user, runner="noop", name="first")
    second = task_create(
        owner=admin_user, runner="noop", name="second", after=[{"task": str(first.pk), "on": "failure"}]
    )
    html = admin_client.get(f"/admin/tasks_app/task/{first.pk}/change/").content.decode()
    assert f'<a href="/admin/tasks_app/task/{second.pk}/change/">second</a> (on failure)' in html
    html = admin_client.get(f"/admin/tasks_app/task/{second.pk}/change/").content.decode()
    assert f'<a href="/admin/tasks_app/task/{first.pk}/change/">first</a> (on failure)' in html
    assert 'name="upstream_tasks"' not in html and 'name="downstream_tasks"' not in html  # read-only
