"""The back office's pages through Django's test client: every page renders with real data,
every action goes through the services (with CSRF enforced), bad forms show their errors and
change nothing, and another user's tasks and executions are 404s everywhere."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from executions.models import Execution, ExecutionEvent, ExecutionOrigin
from executions.models import ExecutionStatus as S
from tasks_api.creation import task_create
from tasks_app.masking import MASK
from tasks_app.models import Task, TaskStatus
from tests.backoffice.helpers import csrf_client, csrf_token, run
from tests.factories import ExecutionFactory

pytestmark = pytest.mark.django_db

HOOK = {"url": "http://127.0.0.1:9/hook", "headers": {"Authorization": "Bearer top-secret-value"}}


def _state() -> tuple:
    return (
        list(Task.objects.order_by("pk").values()),
        list(Execution.objects.order_by("pk").values()),
        ExecutionEvent.objects.count(),
    )


@pytest.fixture
def alices(user):
    """Alice's cron task with a success, a failure, a waiting run; and a one-shot sleep task."""
    task = task_create(
        owner=user, runner="http", name="hourly hook", config=HOOK, cron="0 * * * *", timezone="Europe/Berlin"
    )
    ok, failed = run(task), run(task, outcome="fail", error="HTTP 500 from the hook")
    waiting = ExecutionFactory(task=task, scheduled_for=timezone.now() + timedelta(minutes=30))
    return task, {"ok": ok, "failed": failed, "waiting": waiting}


# --- login and navigation -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/ui/tasks/", "/ui/executions/", "/ui/dashboard/live"])
def test_pages_need_a_login(client, path):
    response = client.get(path)
    assert response.status_code == 302 and response["Location"].startswith(f"/ui/login/?next={path}")


def test_log_in_and_out_with_a_session(client, user, staff_user):
    assert client.get("/ui/login/").status_code == 200
    response = client.post("/ui/login/", {"username": "alice", "password": "alice-password"})
    assert response.status_code == 302 and response["Location"] == "/"
    page = client.get("/")
    assert page.status_code == 200
    for link in ("Dashboard", "Tasks", "Executions", "API docs", "Flower", 'href="http://127.0.0.1:5555/"'):
        assert link in page.content.decode()
    assert 'href="/admin/"' not in page.content.decode()  # staff only
    assert client.post("/ui/logout/").status_code == 302
    assert client.get("/").status_code == 302
    client.force_login(staff_user)
    assert 'href="/admin/"' in client.get("/").content.decode()


def test_a_wrong_password_is_refused_on_the_form(client, user):
    response = client.post("/ui/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200 and b"Please enter a correct username and password" in response.content


# --- dashboard --------------------------------------------------------------------------------------


def test_dashboard_shows_the_snapshot_with_charts(alice_client, alices, django_assert_max_num_queries):
    # The session, the user, the teams of the switcher, and the snapshot's 10 with the user's team
    # ids (12 with a cold cache: executions.dashboard).
    with django_assert_max_num_queries(15):
        alice_client.get("/")
    with django_assert_max_num_queries(14):  # the settled hours kept (14: the window moved a minute)
        page = alice_client.get("/")
    html = page.content.decode()
    assert page.status_code == 200
    assert '<div class="value" id="tile-runs">2</div>' in html  # one success, one failure
    assert '<div class="value" id="tile-success">50.0%</div>' in html
    assert html.count('role="img"') == 4  # four charts, two of them with a y axis of its own
    assert html.count('<svg class="chart-y-axis"') == 2
    assert "hourly hook" in html  # failing most, and upcoming
    assert "Flower counts <em>Celery tasks</em>" in html
    assert 'data-refresh-url="/ui/dashboard/live?window=24h"' in html
    fragment = alice_client.get("/ui/dashboard/live")
    assert fragment.status_code == 200 and b"<html" not in fragment.content and b"tile-runs" in fragment.content


def test_dashboard_charts_can_show_the_last_hour_or_six(alice_client, alices):
    for window, labels in (("1h", 6), ("6h", 6), ("24h", 8)):
        page = alice_client.get("/", {"window": window})
        assert page.context["window"] == window
        runs_chart = str(page.context["runs_chart"])
        assert labels - 1 <= runs_chart.count('text-anchor="middle">') - runs_chart.count("No runs") <= labels + 1
        assert f'data-refresh-url="/ui/dashboard/live?window={window}"' in page.content.decode()
    assert alice_client.get("/", {"window": "1y"}).context["window"] == "24h"
    fragment = alice_client.get("/ui/dashboard/live", {"window": "1h"})
    assert "Runs per minute, last 1h" in fragment.content.decode()


def test_dashboard_counts_only_the_users_own_runs(client, alices, other_user, staff_user):
    client.force_login(other_user)
    assert '<div class="value" id="tile-runs">0</div>' in client.get("/").content.decode()
    client.force_login(staff_user)
    assert '<div class="value" id="tile-runs">2</div>' in client.get("/").content.decode()


# --- the task list and the New task form -------------------------------------------------------------


def test_new_task_from_the_form_goes_through_the_service(user):
    client = csrf_client(user)
    token = csrf_token(client, "/ui/tasks/")
    data = {
        "csrfmiddlewaretoken": token,
        "name": "every five",
        "runner": "sleep",
        "config": '{"duration": "1s"}',
        "interval": "5m",
        "timezone": "Europe/Berlin",
        "start_at": "2030-01-02T09:30:00",
        "max_attempts": "2",
        "misfire_policy": "run_once",
        "overlap_policy": "skip",
    }
    response = client.post("/ui/tasks/", data)
    task = Task.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/ui/tasks/{task.pk}/"
    assert task.owner == user and task.runner == "sleep" and task.config == {"duration": "1s"}
    assert task.interval == timedelta(minutes=5) and task.max_attempts == 2 and task.overlap_policy == "skip"
    # The wall-clock start is read in the task's zone: 09:30 in Berlin is 08:30 UTC in January.
    assert task.start_at == datetime(2030, 1, 2, 8, 30, tzinfo=UTC)
    assert task.next_run_at == task.start_at


def test_a_task_due_now_gets_its_first_execution_at_once(alice_client):
    alice_client.post(
        "/ui/tasks/", {"runner": "noop", "timezone": "UTC", "misfire_policy": "run_once", "overlap_policy": "allow"}
    )
    task = Task.objects.get()
    assert Execution.objects.filter(task=task).count() == 1


def test_a_post_without_the_csrf_token_is_refused_and_creates_nothing(user):
    client = csrf_client(user)
    response = client.post("/ui/tasks/", {"runner": "noop", "timezone": "UTC"})
    assert response.status_code == 403
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"config": "{not json"}, "config", "Not valid JSON"),
        ({"runner": "sleep", "config": '{"duration": "forever"}'}, "config", "duration: "),
        ({"interval": "5m", "cron": "*/5 * * * *"}, "cron", "Give an interval or a cron expression, not both."),
        ({"cron": "61 * * * *"}, "cron", ""),
        ({"timezone": "Mars/Olympus"}, "timezone", ""),
        ({"interval": "soon"}, "interval", ""),
        ({"start_at": "yesterday"}, "start_at", "Enter a date and time"),
        (
            {"start_at": "2030-01-02T10:00:00", "end_at": "2030-01-01T10:00:00"},
            "end_at",
            "Must not be before start_at.",
        ),
        ({"runner": "shell"}, "runner", "Select a valid choice"),
        ({"priority": "12"}, "priority", ""),
        ({"runner": "noop", "config": '{"x": 1}'}, "config", "This runner takes no config."),
    ],
)
def test_a_bad_new_task_shows_its_errors_on_the_form_and_creates_nothing(alice_client, fields, field, message):
    data = {"runner": "noop", "timezone": "UTC", "misfire_policy": "run_once", "overlap_policy": "allow", **fields}
    response = alice_client.post("/ui/tasks/", data)
    assert response.status_code == 400
    form = response.context["form"]
    assert field in form.errors, form.errors
    assert message in " ".join(form.errors[field])
    assert message in response.content.decode().replace("&#x27;", "'")
    assert not Task.objects.exists() and not Execution.objects.exists()


def test_the_task_list_shows_own_tasks_in_words(alice_client, alices, other_user):
    task_create(owner=other_user, runner="noop", name="bobs secret task")
    html = alice_client.get("/ui/tasks/").content.decode()
    assert "hourly hook" in html and "Every hour (Europe/Berlin)" in html
    assert "bobs secret task" not in html
    assert "hourly hook" in alice_client.get("/ui/tasks/?q=hourly&status=ACTIVE").content.decode()
    # (The name stays on the page as a suggestion of the form's "runs after" pickers: not a row.)
    assert not alice_client.get("/ui/tasks/?status=PAUSED").context["rows"]


# --- the task page ------------------------------------------------------------------------------------


def test_task_page_shows_schedule_runs_occurrences_and_masked_config(alice_client, alices):
    task, runs = alices
    page = alice_client.get(f"/ui/tasks/{task.pk}/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "Every hour (Europe/Berlin)" in html
    assert "top-secret-value" not in html and "Authorization" in html and MASK in html
    # Next fire times in the task's zone and in UTC.
    first = page.context["fire_times"][0]
    assert first.local.strftime("%Y-%m-%d %H:%M:%S") in html and first.utc.strftime("%Y-%m-%d %H:%M:%S") in html
    assert "CET" in html or "CEST" in html
    # Recent runs with status, duration and lateness.
    assert f"/ui/executions/{runs['ok'].pk}/" in html and f"/ui/executions/{runs['failed'].pk}/" in html
    rows = {row["execution"].pk: row for row in page.context["recent"]}
    assert rows[runs["ok"].pk]["lateness"].endswith(("s", "ms")) and rows[runs["ok"].pk]["duration"]
    # The occurrences timeline.
    assert page.context["occurrences"].items and "Occurrences" in html


def test_task_page_reads_the_task_its_state_and_owner_in_one_query(alice_client, alices, django_assert_num_queries):
    """The owner's task page: the task with its state and owner found together, the task's rules
    and the owner's defaults together, the channels once (16 queries before, 12 then; 13 with the
    tasks it follows and that follow it, read in one; 14 with the teams "Move to team…" offers an
    editor; 15 with the user's team ids read before the task, tasks_app.teams.scope_to_teams)."""
    task, _ = alices
    with django_assert_num_queries(15):
        page = alice_client.get(f"/ui/tasks/{task.pk}/")
    assert page.status_code == 200 and page.context["state"] and page.context["settings_rows"][-1] == ("Owner", "alice")


def test_task_page_lists_skipped_occurrences_with_their_reason(alice_client, alices):
    from executions.models import SkippedOccurrence

    task, _ = alices
    when = timezone.now().replace(minute=0, second=0, microsecond=0)
    SkippedOccurrence.objects.create(
        task=task, scheduled_for=when, reason="overlap", detail="the previous run was still running"
    )
    html = alice_client.get(f"/ui/tasks/{task.pk}/").content.decode()
    assert "skipped · overlap" in html and "the previous run was still running" in html


def test_each_occurrence_links_to_why_with_its_exact_instant(alice_client, user):
    from executions.models import SkippedOccurrence

    start = timezone.now().replace(microsecond=123456) - timedelta(minutes=10)
    task = task_create(owner=user, runner="noop", interval=timedelta(seconds=30), start_at=start, misfire_policy="skip")
    when = start + timedelta(seconds=30)  # the start has microseconds: so has every fire time
    SkippedOccurrence.objects.update_or_create(
        task=task, scheduled_for=when, defaults={"reason": "overlap", "detail": "still running"}
    )
    html = alice_client.get(f"/ui/tasks/{task.pk}/").content.decode()
    link = f"?at={when.isoformat().replace('+', '%2B').replace(':', '%3A')}#why"
    assert link in html
    page = alice_client.get(f"/ui/tasks/{task.pk}/", {"at": when.isoformat()})
    assert page.context["why"].verdict == "skipped" and page.context["why"].occurrence == when


def test_why_form_answers_and_refuses_bad_times(alice_client, alices):
    task, _ = alices
    page = alice_client.get(f"/ui/tasks/{task.pk}/", {"at": "2020-01-01T00:00:00"})
    assert page.status_code == 200 and page.context["why"].verdict == "before_start"
    assert 'id="why-answer"' in page.content.decode()
    bad = alice_client.get(f"/ui/tasks/{task.pk}/", {"at": "whenever"})
    assert bad.context["why"] is None and "at" in bad.context["why_form"].errors


def test_occurrence_window_can_be_chosen_and_a_bad_one_is_an_error(alice_client, alices):
    task, _ = alices
    page = alice_client.get(f"/ui/tasks/{task.pk}/", {"from": "2030-01-01T00:00:00", "to": "2030-01-01T06:00:00"})
    window = page.context["occurrences"]
    assert window.start == datetime(2029, 12, 31, 23, 0, tzinfo=UTC)  # midnight in Berlin
    assert len([item for item in window.items if item.fire_time]) == 6
    bad = alice_client.get(f"/ui/tasks/{task.pk}/", {"from": "2030-01-02T00:00:00", "to": "2030-01-01T00:00:00"})
    assert bad.status_code == 200 and "to" in bad.context["window_form"].errors


def test_the_task_page_makes_rotates_and_removes_its_trigger_url(user, alices):
    from tasks_app.models import AuditEntry, TaskHook

    task, _ = alices
    client = csrf_client(user)
    token = csrf_token(client, f"/ui/tasks/{task.pk}/")
    assert "None: only its owner" in client.get(f"/ui/tasks/{task.pk}/").content.decode()

    made = client.post(f"/ui/tasks/{task.pk}/trigger-url/", {"csrfmiddlewaretoken": token, "action": "make"})
    hook = TaskHook.objects.get(task=task)
    page = made.content.decode()
    secret = made.context["hook_secret"]
    assert made.status_code == 200 and secret.startswith("tms_hook_") and secret in page and hook.pk in page
    # Shown once: the page read again shows the URL, never the secret.
    again = client.get(f"/ui/tasks/{task.pk}/").content.decode()
    assert hook.pk in again and secret not in again and "Rotate secret" in again
    rotated = client.post(f"/ui/tasks/{task.pk}/trigger-url/", {"csrfmiddlewaretoken": token, "action": "make"})
    assert rotated.context["hook_secret"] != secret and TaskHook.objects.get(task=task).pk == hook.pk
    removed = client.post(f"/ui/tasks/{task.pk}/trigger-url/", {"csrfmiddlewaretoken": token, "action": "remove"})
    assert removed.status_code == 302 and not TaskHook.objects.filter(task=task).exists()
    actions = list(
        AuditEntry.objects.filter(task_id=task.pk, action__startswith="trigger_url")
        .values_list("action", flat=True)
        .order_by("id")
    )
    assert actions == ["trigger_url.create", "trigger_url.rotate", "trigger_url.delete"]


def test_pause_resume_run_now_and_delete_go_through_the_services(user, alices):
    task, runs = alices
    client = csrf_client(user)
    token = csrf_token(client, f"/ui/tasks/{task.pk}/")
    assert client.post(f"/ui/tasks/{task.pk}/pause/", {"csrfmiddlewaretoken": token}).status_code == 302
    task.refresh_from_db()
    assert task.status == TaskStatus.PAUSED
    waiting = Execution.objects.get(pk=runs["waiting"].pk)
    assert waiting.status == S.CANCELLED  # as the API's pause does
    assert waiting.events.last().actor == "user:alice"
    assert "Resume" in client.get(f"/ui/tasks/{task.pk}/").content.decode()
    client.post(f"/ui/tasks/{task.pk}/resume/", {"csrfmiddlewaretoken": token})
    task.refresh_from_db()
    assert task.status == TaskStatus.ACTIVE

    response = client.post(f"/ui/tasks/{task.pk}/run/", {"csrfmiddlewaretoken": token})
    triggered = Execution.objects.get(task=task, origin=ExecutionOrigin.TRIGGER)
    assert response["Location"] == f"/ui/executions/{triggered.pk}/" and triggered.status == S.SCHEDULED

    response = client.post(f"/ui/tasks/{task.pk}/delete/", {"csrfmiddlewaretoken": token})
    assert response["Location"] == "/ui/tasks/"
    task.refresh_from_db()
    assert task.status == TaskStatus.DELETED
    assert not Execution.objects.filter(task=task, status__in=[S.SCHEDULED, S.PENDING, S.RUNNING]).exists()
    assert client.get(f"/ui/tasks/{task.pk}/").status_code == 404


@pytest.mark.parametrize("action", ["pause", "resume", "run", "delete", "backfill"])
def test_task_actions_refuse_get_and_posts_without_csrf(user, alices, action):
    task, _ = alices
    client = csrf_client(user)
    before = _state()
    # "run" answers a GET with its input form (issue 46), which changes nothing either.
    assert client.get(f"/ui/tasks/{task.pk}/{action}/").status_code == (200 if action == "run" else 405)
    assert client.post(f"/ui/tasks/{task.pk}/{action}/").status_code == 403
    assert _state() == before


def test_backfill_creates_the_missing_past_runs(alice_client, user):
    task = task_create(
        owner=user,
        runner="noop",
        name="hourly",
        interval=timedelta(hours=1),
        start_at=datetime(2026, 1, 1, tzinfo=UTC),
        misfire_policy="skip",
    )
    before = Execution.objects.filter(task=task).count()
    response = alice_client.post(
        f"/ui/tasks/{task.pk}/backfill/", {"start": "2026-01-01T00:00:00", "end": "2026-01-01T02:00:00"}
    )
    assert response.status_code == 302
    assert Execution.objects.filter(task=task).count() == before + 3


def test_a_backfill_of_a_range_with_no_fire_times_says_so_on_the_page(alice_client, user):
    task = task_create(
        owner=user,
        runner="noop",
        name="daily",
        cron="0 9 * * *",
        timezone="Europe/Berlin",
        start_at=datetime(2026, 1, 1, tzinfo=UTC),
        misfire_policy="skip",
    )
    before = Execution.objects.filter(task=task).count()
    response = alice_client.post(
        f"/ui/tasks/{task.pk}/backfill/", {"start": "2026-01-01T10:00:00", "end": "2026-01-01T20:00:00"}, follow=True
    )
    assert Execution.objects.filter(task=task).count() == before
    text = response.content.decode()
    assert "No fire times between 2026-01-01 10:00:00 CET and 2026-01-01 20:00:00 CET: nothing to backfill." in text
    assert "0 execution(s) created" not in text


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"start": "2026-01-02T00:00:00", "end": "2026-01-01T00:00:00"}, "end", "Must not be before start."),
        ({"start": "2026-01-01T00:00:00", "end": "2099-01-01T00:00:00"}, "end", "Must not be in the future"),
        ({"start": "", "end": "2026-01-01T00:00:00"}, "start", "This field is required."),
        ({"start": "2000-01-01T00:00:00", "end": "2026-01-01T00:00:00"}, "end", "more than 500 fire times"),
    ],
)
def test_a_bad_backfill_shows_its_error_on_the_form_and_creates_nothing(alice_client, user, data, field, message):
    task = task_create(
        owner=user,
        runner="noop",
        interval=timedelta(hours=1),
        start_at=datetime(2000, 1, 1, tzinfo=UTC),
        misfire_policy="skip",
    )
    before = _state()
    response = alice_client.post(f"/ui/tasks/{task.pk}/backfill/", data)
    assert response.status_code == 400
    errors = response.context["backfill_form"].errors
    assert message in " ".join(errors[field]), errors
    assert message in response.content.decode()
    assert _state() == before


def test_edit_changes_only_what_was_changed(alice_client, alices):
    task, _ = alices
    Task.objects.filter(pk=task.pk).update(start_at=task.start_at.replace(microsecond=123456))
    task.refresh_from_db()
    form = alice_client.get(f"/ui/tasks/{task.pk}/edit/").context["form"]
    data = dict(form.initial.items())
    data["name"] = "renamed"
    response = alice_client.post(f"/ui/tasks/{task.pk}/edit/", data)
    assert response.status_code == 302, response.context["form"].errors if response.context else ""
    after = Task.objects.get(pk=task.pk)
    assert after.name == "renamed"
    assert after.start_at == task.start_at  # microseconds kept: the shown time was not sent back
    assert after.config == task.config and after.cron == task.cron


def test_edit_of_the_schedule_replaces_the_waiting_runs(alice_client, alices):
    task, runs = alices
    data = dict(alice_client.get(f"/ui/tasks/{task.pk}/edit/").context["form"].initial)
    data.update(cron="", interval="10m")
    assert alice_client.post(f"/ui/tasks/{task.pk}/edit/", data).status_code == 302
    task.refresh_from_db()
    assert task.interval == timedelta(minutes=10) and task.cron == ""
    waiting = Execution.objects.get(pk=runs["waiting"].pk)
    assert waiting.status == S.CANCELLED and waiting.superseded


def test_a_bad_edit_shows_its_errors_and_changes_nothing(alice_client, alices):
    task, _ = alices
    data = dict(alice_client.get(f"/ui/tasks/{task.pk}/edit/").context["form"].initial)
    before = _state()
    data.update(interval="5m")  # and the cron is still there
    response = alice_client.post(f"/ui/tasks/{task.pk}/edit/", data)
    assert response.status_code == 400
    assert "Give an interval or a cron expression, not both." in response.context["form"].errors["cron"]
    data.update(interval="", config='{"url": "ftp://nowhere"}')
    response = alice_client.post(f"/ui/tasks/{task.pk}/edit/", data)
    assert response.status_code == 400 and "config" in response.context["form"].errors
    assert _state() == before


# --- the execution page ----------------------------------------------------------------------------


def test_execution_page_shows_timeline_error_attempts_and_flower(alice_client, alices, settings):
    settings.TMS_FLOWER_URL = "http://flower.example:5555"
    _task, runs = alices
    failed = runs["failed"]
    Execution.objects.filter(pk=failed.pk).update(message_id="c0ffee-1234", external_run_id="run-42")
    page = alice_client.get(f"/ui/executions/{failed.pk}/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "HTTP 500 from the hook" in html
    assert 'href="http://flower.example:5555/task/c0ffee-1234"' in html
    assert "run-42" in html and f"tms-{failed.pk}-1" in html
    events = list(failed.events.order_by("id"))
    assert len(page.context["events"]) == len(events) == 4
    for event in events:  # times with seconds
        assert event.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") in html
    assert 'id="retry"' in html and 'id="cancel"' not in html


def _flower_links(html: str) -> list[str]:
    """The hrefs of every link to Flower on a page (the top bar's and the execution's own)."""
    import re

    return re.findall(r'<a [^>]*href="([^"]*)"[^>]*>[^<]*(?:Flower|c0ffee)', html)


def test_the_top_bar_links_flower_s_home_and_the_execution_its_own_celery_task(alice_client, alices, settings):
    """Issue 44: on an execution page the top bar's "Flower" pointed at ``/task/<id>/`` (Flower
    404s the trailing slash), or at ``/`` (TMS's own dashboard) for a run never sent to Celery."""
    settings.TMS_FLOWER_URL = "http://flower.example:5555"
    _task, runs = alices
    sent, never_sent = runs["failed"], runs["waiting"]
    Execution.objects.filter(pk=sent.pk).update(message_id="c0ffee-1234")
    Execution.objects.filter(pk=never_sent.pk).update(message_id="")

    html = alice_client.get(f"/ui/executions/{sent.pk}/").content.decode()
    task_page = "http://flower.example:5555/task/c0ffee-1234"  # flower/urls.py: r"/task/(.+)"
    assert _flower_links(html) == ["http://flower.example:5555/", task_page, task_page]
    fragment = alice_client.get(f"/ui/executions/{sent.pk}/", {"fragment": "1"}).content.decode()
    assert _flower_links(fragment) == [task_page]

    html = alice_client.get(f"/ui/executions/{never_sent.pk}/").content.decode()
    assert _flower_links(html) == ["http://flower.example:5555/"]
    assert 'id="flower-link"' not in html and 'href="/task/' not in html


def test_cancel_and_retry_go_through_the_services(user, alices):
    _task, runs = alices
    client = csrf_client(user)
    token = csrf_token(client, f"/ui/executions/{runs['waiting'].pk}/")
    response = client.post(f"/ui/executions/{runs['waiting'].pk}/cancel/", {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    waiting = Execution.objects.get(pk=runs["waiting"].pk)
    assert waiting.status == S.CANCELLED and waiting.events.last().actor == "user:alice"

    response = client.post(f"/ui/executions/{runs['failed'].pk}/retry/", {"csrfmiddlewaretoken": token})
    retry = Execution.objects.get(retry_of=runs["failed"])
    assert response["Location"] == f"/ui/executions/{retry.pk}/" and retry.attempt == 2
    html = client.get(f"/ui/executions/{retry.pk}/").content.decode()
    assert f'href="/ui/executions/{runs["failed"].pk}/"' in html  # the attempt chain: retry of
    html = client.get(f"/ui/executions/{runs['failed'].pk}/").content.decode()
    assert f'href="/ui/executions/{retry.pk}/"' in html and 'id="retry"' not in html  # retried by


def test_cancelling_a_finished_run_is_an_error_message_and_changes_nothing(alice_client, alices):
    _, runs = alices
    before = _state()
    response = alice_client.post(f"/ui/executions/{runs['ok'].pk}/cancel/", follow=True)
    assert "is SUCCEEDED and can no longer be cancelled" in response.content.decode()
    response = alice_client.post(f"/ui/executions/{runs['ok'].pk}/retry/", follow=True)
    assert "Only FAILED or CANCELLED executions can be retried" in response.content.decode()
    assert _state() == before


@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_execution_actions_refuse_get_and_posts_without_csrf(user, alices, action):
    _, runs = alices
    client = csrf_client(user)
    before = _state()
    target = runs["waiting"] if action == "cancel" else runs["failed"]
    assert client.get(f"/ui/executions/{target.pk}/{action}/").status_code == 405
    assert client.post(f"/ui/executions/{target.pk}/{action}/").status_code == 403
    assert _state() == before


def test_execution_list_shows_what_ran_before_what_waits(alice_client, alices, other_user):
    task_create(owner=other_user, runner="noop", name="bobs")
    _, runs = alices
    page = alice_client.get("/ui/executions/")
    assert [row["execution"].pk for row in page.context["rows"]] == [runs["failed"].pk, runs["ok"].pk]
    waiting = alice_client.get("/ui/executions/?status=SCHEDULED").context["rows"]
    scheduled = Execution.objects.filter(task=runs["ok"].task, status=S.SCHEDULED).order_by("due_at", "id")
    assert [row["execution"].pk for row in waiting] == list(scheduled.values_list("pk", flat=True))
    assert runs["waiting"].pk in [row["execution"].pk for row in waiting]
    assert alice_client.get("/ui/executions/?status=FAILED").context["rows"][0]["execution"].status == S.FAILED


# --- isolation -----------------------------------------------------------------------------------------


TASK_PAGES = [
    ("get", "/ui/tasks/{id}/"),
    ("get", "/ui/tasks/{id}/edit/"),
    ("post", "/ui/tasks/{id}/edit/"),
    ("post", "/ui/tasks/{id}/pause/"),
    ("post", "/ui/tasks/{id}/resume/"),
    ("post", "/ui/tasks/{id}/run/"),
    ("post", "/ui/tasks/{id}/backfill/"),
    ("post", "/ui/tasks/{id}/delete/"),
    ("post", "/ui/tasks/{id}/trigger-url/"),
]
EXECUTION_PAGES = [
    ("get", "/ui/executions/{id}/"),
    ("get", "/ui/executions/{id}/?fragment=1"),
    ("post", "/ui/executions/{id}/cancel/"),
    ("post", "/ui/executions/{id}/retry/"),
]


@pytest.mark.parametrize(("method", "path"), TASK_PAGES)
def test_another_users_task_pages_are_404_and_change_nothing(client, alices, other_user, method, path):
    task, _ = alices
    client.force_login(other_user)
    before = _state()
    response = getattr(client, method)(
        path.format(id=task.pk), {"name": "hijacked", "start": "2026-01-01T00:00:00", "end": "2026-01-01T01:00:00"}
    )
    assert response.status_code == 404
    assert _state() == before


@pytest.mark.parametrize(("method", "path"), EXECUTION_PAGES)
@pytest.mark.parametrize("which", ["ok", "failed", "waiting"])
def test_another_users_execution_pages_are_404_and_change_nothing(client, alices, other_user, method, path, which):
    _, runs = alices
    client.force_login(other_user)
    before = _state()
    assert getattr(client, method)(path.format(id=runs[which].pk)).status_code == 404
    assert _state() == before


def test_staff_see_everyones_tasks_and_executions(client, alices, staff_user):
    task, runs = alices
    client.force_login(staff_user)
    assert "hourly hook" in client.get("/ui/tasks/").content.decode()
    assert client.get(f"/ui/tasks/{task.pk}/").status_code == 200
    for execution in runs.values():
        assert client.get(f"/ui/executions/{execution.pk}/").status_code == 200


def test_a_paused_task_lists_no_fire_time_twice_nor_ahead_and_its_next_run_after_resume_is_not_past(
    alice_client, api_client, user
):
    """Issue 44 item 5: a paused task listed each fire time twice in its timeline (upcoming or
    skipped, and again as superseded), listed "Next fire times" while the page said "No runs
    while paused", and right after resume "Next run" showed a time already past."""
    from django.db.models.functions import Now

    from tasks_api.lifecycle import task_pause, task_resume

    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(minutes=10, seconds=30)
    task = task_create(
        owner=user, runner="noop", start_at=start, interval=timedelta(minutes=1), misfire_policy="run_once"
    )
    assert Execution.objects.filter(task=task, superseded=False).exists()
    task_pause(task=task, actor="user:alice")
    # Paused three minutes ago: three fire times passed while paused.
    Task.objects.filter(pk=task.pk).update(paused_at=Now() - timedelta(minutes=3, seconds=10))
    page = alice_client.get(f"/ui/tasks/{task.pk}/")
    html = page.content.decode()
    assert "No runs while paused." in html
    assert page.context["fire_times"] == []
    assert "None while paused" in html and "misfire policy (run once)" in html.lower()
    # The pause in words as the page shows times (issue 44 item 12): local, to the second.
    import re

    from tms_core.clock import local_words

    paused_at = Task.objects.get(pk=task.pk).paused_at
    assert paused_at.microsecond
    reasons = " ".join(item.reason for item in page.context["occurrences"].items)
    assert f"The task was paused at {local_words(paused_at, task.timezone)} and has not been resumed" in reasons
    assert not re.search(r"\d\d:\d\d:\d\d\.\d{6}", reasons) and not re.search(r"\d\d:\d\d:\d\d\.\d{6}", html)
    instants = [item.scheduled_for for item in page.context["occurrences"].items]
    assert len(instants) == len(set(instants)) > 0
    assert not [
        item for item in page.context["occurrences"].items if item.state == "superseded" and item.scheduled_for > now
    ]

    task_resume(task=Task.objects.get(pk=task.pk), actor="user:alice")
    # Runs due in the past wait for the monitor (the misfire policy's catch-up run among them).
    waiting = Execution.objects.filter(task=task, superseded=False, status=S.SCHEDULED, due_at__lt=now)
    catch_up = waiting.order_by("-due_at").first()
    assert catch_up is not None
    page = alice_client.get(f"/ui/tasks/{task.pk}/")
    assert page.context["next_run"] >= now and page.context["next_run"] > catch_up.due_at
    body = api_client.get(f"/api/v1/tasks/{task.pk}").json()
    assert datetime.fromisoformat(body["next_run_at"].replace("Z", "+00:00")) >= now
