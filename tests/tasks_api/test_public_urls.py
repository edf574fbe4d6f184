"""Absolute URLs TMS hands out (trigger URLs, signed upload URLs, callback URLs) point where the
site is reached (issue 44: a site on port 8123 showed trigger URLs on 8000, refused there)."""

from __future__ import annotations

import hashlib

import pytest
from rest_framework.test import APIClient

from executions.callbacks import callback_url
from tasks_api.hooks import task_hook_set
from tests.backoffice.helpers import csrf_client
from tests.factories import TaskFactory
from tms_core.public_url import FALLBACK, public_url

pytestmark = pytest.mark.django_db

#: A site on another port than 8000, as `make run PORT=8123` serves it.
ELSEWHERE = {"HTTP_HOST": "127.0.0.1:8123"}


@pytest.fixture
def unset(settings):
    settings.TMS_PUBLIC_URL = ""
    return settings


def test_the_api_shows_trigger_urls_on_the_host_and_port_the_request_reached(unset, api_client, user):
    task = TaskFactory(owner=user)
    made = api_client.post(f"/api/v1/tasks/{task.pk}/trigger-url", **ELSEWHERE)
    assert made.status_code == 201, made.content
    assert made.json()["url"] == f"http://127.0.0.1:8123/hooks/v1/{made.json()['id']}"
    read = api_client.get(f"/api/v1/tasks/{task.pk}/trigger-url", HTTP_HOST="localhost:9001")
    assert read.json()["url"] == f"http://localhost:9001/hooks/v1/{made.json()['id']}"
    # The URL shown answers: the same path on the site starts a run (202).
    path = read.json()["url"].removeprefix("http://localhost:9001")
    fired = APIClient().post(path, HTTP_AUTHORIZATION=f"Bearer {made.json()['secret']}", **ELSEWHERE)
    assert fired.status_code == 202, fired.content


def test_the_task_page_shows_the_trigger_url_on_the_host_and_port_it_was_reached_at(unset, user):
    task = TaskFactory(owner=user)
    hook = task_hook_set(task=task).hook
    client = csrf_client(user)
    page = client.get(f"/ui/tasks/{task.pk}/", **ELSEWHERE)
    assert page.status_code == 200
    assert page.context["hook_url"] == f"http://127.0.0.1:8123/hooks/v1/{hook.pk}"
    assert f"http://127.0.0.1:8123/hooks/v1/{hook.pk}" in page.content.decode()


def test_signed_upload_urls_are_on_the_host_and_port_the_request_reached(unset, api_client):
    content = b"#!/bin/sh\necho hi\n"
    body = {"name": "job.sh", "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    started = api_client.post("/api/v1/artifacts/uploads", body, format="json", **ELSEWHERE)
    assert started.status_code == 201, started.content
    assert started.json()["upload"]["url"].startswith("http://127.0.0.1:8123/api/v1/artifacts/uploads/")


def test_forwarded_host_and_scheme_count_only_where_the_settings_trust_them(unset, api_client, user):
    task = TaskFactory(owner=user)
    proxied = {"HTTP_X_FORWARDED_HOST": "tms.example.org", "HTTP_X_FORWARDED_PROTO": "https"}
    unset.ALLOWED_HOSTS = ["127.0.0.1", "tms.example.org", "testserver"]
    made = api_client.post(f"/api/v1/tasks/{task.pk}/trigger-url", **ELSEWHERE, **proxied)
    assert made.json()["url"].startswith("http://127.0.0.1:8123/hooks/v1/")  # untrusted: ignored
    unset.USE_X_FORWARDED_HOST = True
    unset.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    read = api_client.get(f"/api/v1/tasks/{task.pk}/trigger-url", **ELSEWHERE, **proxied)
    assert read.json()["url"] == f"https://tms.example.org/hooks/v1/{made.json()['id']}"


def test_a_configured_public_url_wins_over_the_request(settings, api_client, user):
    settings.TMS_PUBLIC_URL = "https://tms.example.org/"
    task = TaskFactory(owner=user)
    made = api_client.post(f"/api/v1/tasks/{task.pk}/trigger-url", **ELSEWHERE)
    assert made.json()["url"] == f"https://tms.example.org/hooks/v1/{made.json()['id']}"
    assert callback_url(execution_id=7) == "https://tms.example.org/api/v1/executions/7/callback"


def test_without_a_request_or_a_setting_the_fallback_is_runserver_s_address(unset):
    assert public_url() == FALLBACK == "http://127.0.0.1:8000"
    assert callback_url(execution_id=7) == "http://127.0.0.1:8000/api/v1/executions/7/callback"
