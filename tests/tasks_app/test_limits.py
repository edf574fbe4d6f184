"""Limits and quotas (issue 15, finding 5; per team since issue 30): config and request size,
per-team quotas of tasks, executions created on request and artifact bytes, the backfill bound,
and runners' minimum intervals. Each against the real PostgreSQL, through the API where users
meet it. A user alone in their personal team sees exactly the per-user quotas of before."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
import requests
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from executions.models import Execution
from tasks_api.creation import task_create
from tasks_app.models import ApiIdempotencyKey, Artifact, QuotaUse, Task, TeamQuota
from tasks_app.quotas import json_size, owner_limits, owner_quota_set
from tasks_app.schedules import Schedule, shortest_gap
from tasks_app.teams.services import personal_team_of
from tests.conftest import account_key_for
from tests.factories import TaskFactory
from tms_core.errors import InvalidInput

pytestmark = pytest.mark.django_db

URL = "/api/v1/tasks"
HTTP_TASK = {"runner": "http", "config": {"url": "http://127.0.0.1:9/hook", "method": "POST"}}


def _iso(when) -> str:
    return when.isoformat().replace("+00:00", "Z")


@pytest.fixture
def tms(settings):
    """Change TMS settings (read through tms_settings() at each use) for one test."""

    def change(**values: Any) -> None:
        settings.TMS = {**settings.TMS, **values}

    return change


# --- config and request size -----------------------------------------------------------------


#: 8.8 MB of config that every field of the http runner accepts (1,100 headers of 8,000 characters).
BIG_CONFIG = {**HTTP_TASK["config"], "headers": {f"X-Pad-{n}": "x" * 8000 for n in range(1100)}}


def test_an_8_8_mb_config_is_refused_and_nothing_is_stored(api_client, settings):
    response = api_client.post(URL, {"runner": "http", "config": BIG_CONFIG}, HTTP_IDEMPOTENCY_KEY="big-1")
    # The body alone is over TMS_MAX_REQUEST_BYTES: a clean 413 in the API's error shape.
    assert response.status_code == 413, response.content[:300]
    assert response.json()["type"] == "request_too_large"
    assert not Task.objects.exists() and not ApiIdempotencyKey.objects.exists()

    # With room for the body, the config bound answers: 400 on config.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 16 * 1024 * 1024
    response = api_client.post(URL, {"runner": "http", "config": BIG_CONFIG}, HTTP_IDEMPOTENCY_KEY="big-1")
    assert response.status_code == 400, response.content[:300]
    assert "TMS_MAX_CONFIG_BYTES" in response.json()["errors"]["config"][0]
    assert not Task.objects.exists() and not ApiIdempotencyKey.objects.exists()


def test_the_idempotency_record_stays_within_the_config_bound(api_client):
    config = {**HTTP_TASK["config"], "headers": {f"X-Pad-{n}": "x" * 8000 for n in range(7)}}  # ~56 KB
    response = api_client.post(URL, {"runner": "http", "config": config}, HTTP_IDEMPOTENCY_KEY="fits-1")
    assert response.status_code == 201, response.content[:300]
    # It stores the response (the task with its config) once more: bounded by the config's bound.
    record = ApiIdempotencyKey.objects.get()
    assert json_size(record.response_body) < 65536 + 4096
    assert len(record.request_fingerprint) == 64  # a digest, not the request


def test_a_config_over_tms_max_config_bytes_is_a_400_on_config(api_client):
    config = {**HTTP_TASK["config"], "json": {"blob": "x" * 70_000}}  # 70 KB: under the request bound
    response = api_client.post(URL, {"runner": "http", "config": config}, HTTP_IDEMPOTENCY_KEY="big-2")
    assert response.status_code == 400, response.content
    [message] = response.json()["errors"]["config"]
    assert "65536 bytes" in message and "TMS_MAX_CONFIG_BYTES" in message
    assert not Task.objects.exists() and not ApiIdempotencyKey.objects.exists()


def test_the_config_bound_holds_in_the_service_and_on_change(api_client, user, tms):
    with pytest.raises(InvalidInput) as caught:
        task_create(owner=user, runner="http", config=BIG_CONFIG)
    assert list(caught.value.errors) == ["config"]
    tms(MAX_CONFIG_BYTES=2048)
    created = api_client.post(URL, HTTP_TASK)
    assert created.status_code == 201, created.content
    patched = api_client.patch(f"{URL}/{created.json()['id']}", {"config": {**HTTP_TASK["config"], "json": "z" * 3000}})
    assert patched.status_code == 400 and "config" in patched.json()["errors"]
    assert Task.objects.get().config == HTTP_TASK["config"]


# --- tasks quota -----------------------------------------------------------------------------


def test_the_task_quota_answers_400_and_an_operator_can_raise_it(api_client, user, tms):
    tms(QUOTA_MAX_TASKS=2)
    assert [api_client.post(URL, HTTP_TASK).status_code for _ in range(2)] == [201, 201]

    refused = api_client.post(URL, HTTP_TASK)
    assert refused.status_code == 400
    assert refused.json()["errors"]["non_field_errors"][0].startswith("quota: at most 2 tasks")
    assert Task.objects.filter(owner=user).count() == 2

    owner_quota_set(owner=user, max_tasks=3)
    assert api_client.post(URL, HTTP_TASK).status_code == 201
    assert owner_limits(user).max_tasks == 3
    # Deleting a task frees its place.
    assert api_client.post(URL, HTTP_TASK).status_code == 400
    api_client.delete(f"{URL}/{Task.objects.filter(owner=user).first().pk}")
    assert api_client.post(URL, HTTP_TASK).status_code == 201


# --- hourly execution quota ------------------------------------------------------------------


def test_run_now_and_retry_count_against_the_hourly_quota_with_retry_after(api_client, user):
    owner_quota_set(owner=user, max_executions_per_hour=2)
    task = TaskFactory(owner=user, start_at=timezone.now() + timedelta(days=1))
    assert [api_client.post(f"{URL}/{task.pk}/trigger").status_code for _ in range(2)] == [201, 201]

    refused = api_client.post(f"{URL}/{task.pk}/trigger")
    assert refused.status_code == 429, refused.content
    body = refused.json()
    assert body["type"] == "quota_exceeded" and "at most 2 executions per hour" in body["detail"]
    assert 3500 <= int(refused["Retry-After"]) <= 3600
    assert Execution.objects.filter(task=task).count() == 2

    # A retry is an execution created on request too.
    failed = Execution.objects.filter(task=task).first()
    Execution.objects.filter(pk=failed.pk).update(status="FAILED")
    assert api_client.post(f"/api/v1/executions/{failed.pk}/retry").status_code == 429
    # Once the window moves past the uses, it fits again.
    QuotaUse.objects.filter(team=personal_team_of(user)).update(at=timezone.now() - timedelta(hours=1, seconds=1))
    assert api_client.post(f"/api/v1/executions/{failed.pk}/retry").status_code == 201, "quota frees after an hour"


def test_a_backfill_larger_than_the_hourly_quota_is_a_400_on_end(api_client, user):
    owner_quota_set(owner=user, max_executions_per_hour=3)
    now = timezone.now().replace(microsecond=0)
    task = TaskFactory(owner=user, start_at=now - timedelta(hours=1), interval=timedelta(minutes=1))
    response = api_client.post(
        f"{URL}/{task.pk}/backfill", {"start": _iso(now - timedelta(minutes=10)), "end": _iso(now)}
    )
    assert response.status_code == 400
    assert "quota: at most 3 executions per hour" in response.json()["errors"]["end"][0]
    assert not Execution.objects.filter(task=task).exists()


def test_a_backfill_is_bounded_by_tms_backfill_max(api_client, user, tms):
    tms(BACKFILL_MAX=5)
    now = timezone.now().replace(microsecond=0)
    task = TaskFactory(owner=user, start_at=now - timedelta(hours=1), interval=timedelta(minutes=1))
    response = api_client.post(
        f"{URL}/{task.pk}/backfill", {"start": _iso(now - timedelta(minutes=10)), "end": _iso(now)}
    )
    assert response.status_code == 400
    assert "more than 5 fire times" in response.json()["errors"]["end"][0]


@pytest.mark.django_db(transaction=True)
def test_concurrent_backfills_create_exactly_the_hourly_quota(live_server, django_user_model):
    """Four backfills of 5 runs each, sent at once against a quota of 10: two pass, two are
    answered 429, and exactly 10 executions exist (a count-then-insert race would make 20)."""
    owner = django_user_model.objects.create_user(username="carol", password="x")
    owner_quota_set(owner=owner, max_executions_per_hour=10)
    token = account_key_for(owner)
    now = timezone.now().replace(second=0, microsecond=0)
    task = TaskFactory(owner=owner, start_at=now - timedelta(hours=2), interval=timedelta(minutes=1))
    ranges = [(now - timedelta(minutes=10 * k + 9), now - timedelta(minutes=10 * k + 5)) for k in range(4)]
    barrier = threading.Barrier(len(ranges))
    answers: list[requests.Response] = []

    def backfill(start, end) -> None:
        barrier.wait()
        answers.append(
            requests.post(
                f"{live_server.url}{URL}/{task.pk}/backfill",
                json={"start": _iso(start), "end": _iso(end)},
                headers={"Authorization": f"Token {token}"},
                timeout=30,
            )
        )

    threads = [threading.Thread(target=backfill, args=bounds) for bounds in ranges]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    codes = sorted(answer.status_code for answer in answers)
    assert codes == [201, 201, 429, 429], [answer.content for answer in answers]
    for answer in answers:
        if answer.status_code == 429:
            assert answer.json()["type"] == "quota_exceeded" and int(answer.headers["Retry-After"]) > 0
        else:
            assert len(answer.json()["execution_ids"]) == 5
    assert Execution.objects.filter(task=task).count() == 10


# --- artifact bytes --------------------------------------------------------------------------


def test_the_artifact_quota_is_a_400_on_file(api_client, user, settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    owner_quota_set(owner=user, max_artifact_bytes=100)

    def upload(size: int):
        content = SimpleUploadedFile("tool.sh", b"#" * size)
        return api_client.post("/api/v1/artifacts", {"file": content}, format="multipart")

    assert upload(60).status_code == 201
    refused = upload(41)
    assert refused.status_code == 400
    assert refused.json()["errors"]["file"][0].startswith("quota: artifacts may take at most 100 bytes")
    assert upload(40).status_code == 201
    assert sum(Artifact.objects.filter(owner=user).values_list("size", flat=True)) == 100


def test_a_quota_row_left_empty_means_the_defaults(user, tms):
    tms(QUOTA_MAX_TASKS=7, QUOTA_EXECUTIONS_PER_HOUR=8, QUOTA_ARTIFACT_BYTES=9)
    TeamQuota.objects.create(team=personal_team_of(user))
    limits = owner_limits(user)
    assert (limits.max_tasks, limits.max_executions_per_hour, limits.max_artifact_bytes) == (7, 8, 9)
    with pytest.raises(InvalidInput):
        owner_quota_set(owner=user, max_tasks=-1)


# --- minimum interval per runner --------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "seconds"),
    [
        ("* * * * *", 60),
        ("*/5 * * * *", 300),
        ("0 9 * * *", 86400),
        ("0,59 0,23 * * *", 60),  # 23:59 then 00:00 the next day
        ("*/10 * * * * *", 10),
        ("0 0 29 2 *", 86400),
        ("@hourly", 3600),
    ],
)
def test_shortest_gap_of_a_cron_expression(cron, seconds):
    schedule = Schedule(start_at=timezone.now(), cron=cron)
    assert shortest_gap(schedule) == timedelta(seconds=seconds)


def test_a_schedule_denser_than_the_runners_minimum_interval_is_a_400(api_client, settings):
    email = {"to": ["ops@example.com"], "subject": "report"}
    settings.TMS_RUNNERS = {
        **settings.TMS_RUNNERS,
        "email": {**settings.TMS_RUNNERS["email"], "OPTIONS": {"allowed_recipients": ["@example.com"]}},
    }
    for schedule in ({"cron": "* * * * *"}, {"interval": 60}, {"cron": "*/5 * * * *", "jitter": 10}):
        response = api_client.post(URL, {"runner": "email", "config": email, **schedule})
        assert response.status_code == 400, (schedule, response.content)
        assert "at most one run every 300 s" in response.json()["errors"]["schedule"][0]
    ok = api_client.post(URL, {"runner": "email", "config": email, "cron": "*/5 * * * *"})
    assert ok.status_code == 201, ok.content

    http = api_client.post(URL, {**HTTP_TASK, "interval": 0.5})
    assert http.status_code == 400 and "every 1 s" in http.json()["errors"]["schedule"][0]
    created = api_client.post(URL, {**HTTP_TASK, "interval": 1})
    assert created.status_code == 201
    patched = api_client.patch(f"{URL}/{created.json()['id']}", {"interval": 0.5})
    assert patched.status_code == 400 and "schedule" in patched.json()["errors"]
    assert Task.objects.count() == 2


def test_min_interval_is_configured_per_runner_alias(api_client, settings):
    settings.TMS_RUNNERS = {**settings.TMS_RUNNERS, "http": {**settings.TMS_RUNNERS["http"], "MIN_INTERVAL": 3600}}
    response = api_client.post(URL, {**HTTP_TASK, "cron": "*/30 * * * *"})
    assert response.status_code == 400
    assert "every 3600 s" in response.json()["errors"]["schedule"][0]


# --- the admin -------------------------------------------------------------------------------


def test_superusers_set_team_quotas_in_the_admin_and_staff_only_look(admin_client, client, user, django_user_model):
    team = personal_team_of(user)
    response = admin_client.post(
        "/admin/tasks_app/teamquota/add/",
        {"team": team.pk, "max_tasks": "5", "max_executions_per_hour": "", "max_artifact_bytes": "0"},
    )
    assert response.status_code == 302, response.content[:500]
    quota = TeamQuota.objects.get(pk=team.pk)
    assert (quota.max_tasks, quota.max_executions_per_hour, quota.max_artifact_bytes) == (5, None, 0)
    assert owner_limits(user).max_artifact_bytes == 0  # 0: no limit
    # The list is searched by a user's name (their personal team's quota).
    listed = admin_client.get("/admin/tasks_app/teamquota/", {"q": user.username})
    assert listed.status_code == 200 and user.username.encode() in listed.content

    staff = django_user_model.objects.create_user(username="support", password="x", is_staff=True)
    client.force_login(staff)
    assert client.get("/admin/tasks_app/teamquota/").status_code == 200
    change = client.post(f"/admin/tasks_app/teamquota/{team.pk}/change/", {"team": team.pk, "max_tasks": "9999"})
    assert change.status_code == 403
    assert TeamQuota.objects.get(pk=team.pk).max_tasks == 5


def test_staff_granted_the_permission_change_a_team_quota_in_the_admin(client, user, django_user_model):
    from django.contrib.auth.models import Permission

    team = personal_team_of(user)
    operator = django_user_model.objects.create_user(username="quotas", password="x", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="change_teamquota"))
    client.force_login(operator)
    response = client.post(
        "/admin/tasks_app/teamquota/add/",
        {
            "team": team.pk,
            "max_tasks": "4",
            "max_executions_per_hour": "",
            "max_artifact_bytes": "",
            "fair_weight": "2",
        },
    )
    assert response.status_code == 302, response.content[:500]
    assert (owner_limits(user).max_tasks, owner_limits(user).fair_weight) == (4, 2)


def test_uses_past_the_longest_window_are_expired_by_the_beat_job(user):
    from tasks_app.tasks import expire_quota_uses

    team = personal_team_of(user)
    QuotaUse.objects.create(team=team, kind="executions", amount=3)
    old = QuotaUse.objects.create(team=team, kind="send:email", amount=1)
    QuotaUse.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(hours=1, minutes=1))
    assert expire_quota_uses() == 1
    assert list(QuotaUse.objects.values_list("kind", flat=True)) == ["executions"]


def test_materialise_on_request_counts_against_the_hourly_quota(api_client, user):
    """Issue 27, finding 13: 960 executions in one request with an hourly quota of 10."""
    owner_quota_set(owner=user, max_executions_per_hour=10)
    now = timezone.now().replace(second=0, microsecond=0)
    task = TaskFactory(owner=user, start_at=now + timedelta(hours=2), interval=timedelta(minutes=1))
    before = Execution.objects.filter(task=task).count()
    url = f"{URL}/{task.pk}/materialise"
    response = api_client.post(url, {"until": _iso(now + timedelta(hours=18))})
    assert response.status_code == 400
    assert "quota: at most 10 executions per hour" in response.json()["errors"]["until"][0]
    assert Execution.objects.filter(task=task).count() == before
    ok = api_client.post(url, {"until": _iso(now + timedelta(hours=2, minutes=5))})
    assert ok.status_code == 200 and len(ok.json()["execution_ids"]) == 6
    over = api_client.post(url, {"until": _iso(now + timedelta(hours=2, minutes=10))})
    assert over.status_code == 429 and int(over["Retry-After"]) > 0
    assert Execution.objects.filter(task=task).count() == before + 6
