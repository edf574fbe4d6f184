"""Issue 43, item 2: an input cannot send a task's secrets where it says. A fill (``input_fills``)
of a field that says where a run goes (the runner's ``destination_config_fields``) is refused
while the config holds secrets, when the task is saved; and a run whose filled config goes
elsewhere than its stored one gets none of the config's secrets (tasks saved before the rule)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from executions.models import Execution
from executions.runs import run_spec
from runners.registry import get_runner, runner_aliases
from tasks_api.creation import task_create
from tasks_api.triggers import task_trigger
from tasks_app.models import Task
from tasks_app.run_input import check_input_fills
from tasks_app.secrets import config_open

pytestmark = pytest.mark.django_db

HTTP = {"url": "https://api.example.com/report", "headers": {"Authorization": "Bearer owner-credential"}}


def _body(**fields: Any) -> dict[str, Any]:
    later = (timezone.now() + timedelta(days=1)).isoformat()
    return {"name": "t", "start_at": later, **fields}


def test_a_fill_of_the_url_of_an_http_task_with_a_secret_header_is_a_400_on_input_fills(api_client):
    response = api_client.post(
        "/api/v1/tasks", _body(runner="http", config=HTTP, input_fills={"url": "target"}), format="json"
    )

    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert set(errors) == {"input_fills"}
    assert "'url' says where a run goes" in errors["input_fills"][0]
    assert "headers.Authorization" in errors["input_fills"][0]
    assert not Task.objects.exists()


def test_a_fill_of_args_of_a_subprocess_task_with_a_secret_env_is_refused_but_allowed_without(api_client):
    config = {"command": ["echo", "x"], "env": {"DB_PASSWORD": "s3cret-value"}}
    refused = api_client.post(
        "/api/v1/tasks", _body(runner="subprocess", config=config, input_fills={"command.1": "day"}), format="json"
    )
    plain = api_client.post(
        "/api/v1/tasks",
        _body(runner="subprocess", config={"command": ["echo", "x"]}, input_fills={"command.1": "day"}),
        format="json",
    )

    assert refused.status_code == 400 and "env.DB_PASSWORD" in refused.json()["errors"]["input_fills"][0]
    assert plain.status_code == 201, plain.content


def test_a_fill_that_is_no_destination_stays_allowed_beside_a_secret(api_client):
    config = {**HTTP, "json": {"day": "today"}}
    response = api_client.post(
        "/api/v1/tasks", _body(runner="http", config=config, input_fills={"json.day": "day"}), format="json"
    )

    assert response.status_code == 201, response.content


def test_a_patch_that_adds_a_secret_to_a_task_whose_destination_is_filled_is_refused(api_client):
    created = api_client.post(
        "/api/v1/tasks",
        _body(runner="http", config={"url": "https://api.example.com/report"}, input_fills={"url": "target"}),
        format="json",
    )
    assert created.status_code == 201, created.content
    task_id = created.json()["id"]

    response = api_client.patch(f"/api/v1/tasks/{task_id}", {"config": HTTP}, format="json")
    by_secret_fields = api_client.patch(
        f"/api/v1/tasks/{task_id}",
        {"config": {"url": "https://api.example.com/report", "json": {"k": "v"}}, "secret_fields": ["json.k"]},
        format="json",
    )

    assert response.status_code == 400 and "'url' says where a run goes" in response.json()["errors"]["input_fills"][0]
    assert by_secret_fields.status_code == 400 and "json.k" in by_secret_fields.json()["errors"]["input_fills"][0]
    assert config_open(Task.objects.get(pk=task_id).config) == {"url": "https://api.example.com/report"}


@pytest.mark.parametrize("alias", runner_aliases())
def test_every_runner_s_destination_fields_cannot_be_filled_beside_a_secret(alias):
    fields = get_runner(alias).destination_config_fields
    names = ("anything",) if fields is None else fields
    for name in names:
        config = {name: "value", "token": "a-secret-value"}

        problems = check_input_fills(fills={name: "x"}, runner=alias, config=config, secret_fields=[])
        without_secret = check_input_fills(fills={name: "x"}, runner=alias, config={name: "value"}, secret_fields=[])

        assert len(problems) == 1 and "says where a run goes" in problems[0], (alias, name, problems)
        assert without_secret == [], (alias, name)


def _legacy_task(user) -> Task:
    """A task saved before the rule: the service, below the serializer, stores it as it is."""
    return task_create(owner=user, runner="http", config=HTTP, input_fills={"url": "target"})


def test_a_run_filled_elsewhere_gets_none_of_the_config_s_secrets(user):
    task = _legacy_task(user)
    elsewhere = task_trigger(task=task, actor="operator", run_input={"target": "https://attacker.example/x"})
    same = task_trigger(task=task, actor="operator", run_input={"target": HTTP["url"]})

    moved = run_spec(Execution.objects.get(pk=elsewhere.execution.pk), task, starting=True).config
    kept = run_spec(Execution.objects.get(pk=same.execution.pk), task, starting=True).config

    assert moved["url"] == "https://attacker.example/x"
    assert "Authorization" not in json.dumps(moved)
    assert kept["headers"] == {"Authorization": "Bearer owner-credential"}
    # The task keeps its own secret for its own runs.
    assert config_open(Task.objects.get(pk=task.pk).config) == HTTP


def test_the_back_office_refuses_an_edit_that_adds_a_secret_beside_a_destination_fill(client, user):
    task = task_create(
        owner=user, runner="http", config={"url": "https://api.example.com/report"}, input_fills={"url": "target"}
    )
    client.force_login(user)
    data = dict(client.get(f"/ui/tasks/{task.pk}/edit/").context["form"].initial)
    data["config"] = json.dumps(HTTP)

    response = client.post(f"/ui/tasks/{task.pk}/edit/", data)

    assert response.status_code == 400
    assert "says where a run goes" in response.content.decode()
    assert config_open(Task.objects.get(pk=task.pk).config) == {"url": "https://api.example.com/report"}
