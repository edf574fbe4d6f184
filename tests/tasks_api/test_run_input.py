"""Run input (issue 31): a trigger's ``input``, a task's ``input_schema`` checked at trigger time,
``input_fills`` filling config paths at run time, a trigger URL's JSON body as input, and the
input shown masked in the API, the back office and the admin."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from executions import transitions, worker_services
from executions.models import Execution, ExecutionOrigin, ExecutionStatus
from executions.runs import run_spec
from tasks_api.creation import task_create
from tasks_api.triggers import task_trigger
from tasks_app.models import AuditEntry, Task, TaskVersion
from tasks_app.run_input import INPUT_MAX_CHARS, config_filled
from tasks_app.secrets import config_open
from tms_core.errors import InvalidInput

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "properties": {"message": {"type": "string", "minLength": 1}, "count": {"type": "integer"}},
    "required": ["message"],
}


def _create(client: APIClient, **fields: Any) -> dict:
    # A start a day ahead: the task's only runs are the ones its tests trigger.
    later = (timezone.now() + timedelta(days=1)).isoformat()
    body = {"runner": "subprocess", "config": {"command": ["echo", "nothing given"]}, "start_at": later, **fields}
    response = client.post("/api/v1/tasks", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def _errors(response) -> dict:
    assert response.status_code == 400, response.content
    return response.json()["errors"]


# --- the task's settings ------------------------------------------------------------------------


def test_a_task_declares_its_input_schema_and_fills_shown_audited_and_versioned(api_client, user):
    task = _create(api_client, input_schema=SCHEMA, input_fills={"command.1": "message"})

    assert task["input_schema"] == SCHEMA and task["input_fills"] == {"command.1": "message"}
    assert api_client.get(f"/api/v1/tasks/{task['id']}").json()["input_fills"] == {"command.1": "message"}
    created = AuditEntry.objects.get(object_id=task["id"], action="create")
    assert created.changes["input_schema"] == {"from": None, "to": SCHEMA}
    assert created.changes["input_fills"]["to"] == {"command.1": "message"}

    response = api_client.patch(f"/api/v1/tasks/{task['id']}", {"input_fills": {}}, format="json")

    assert response.status_code == 200 and response.json()["input_fills"] == {}
    update = AuditEntry.objects.get(object_id=task["id"], action="update")
    assert update.changes["input_fills"] == {"from": {"command.1": "message"}, "to": {}}
    assert TaskVersion.objects.get(task_id=task["id"], number=2).changed == ["input_fills"]


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ([1, 2], "A JSON Schema: an object"),
        ({"type": "no-such-type"}, "Not a valid JSON Schema"),
        ({"properties": {"a": {"minLength": -1}}}, "properties.a.minLength"),
    ],
)
def test_an_input_schema_that_is_no_schema_is_a_400_on_its_field(api_client, schema, words):
    errors = _errors(api_client.post("/api/v1/tasks", {"runner": "noop", "input_schema": schema}, format="json"))

    assert set(errors) == {"input_schema"} and words in errors["input_schema"][0]
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("fills", "words"),
    [
        ({"command.7": "message"}, "'command.7' names nothing in config"),
        ({"env.TOKEN": "token"}, "is (or holds) a secret"),
        ({"command.1": ""}, "may not be blank"),
        (["command.1"], "Expected a dictionary"),
        # Issue 44, item 8: accepted, and filled nothing.
        ({"command.1": "."}, "its input path '.' has an empty part"),
        ({"command.1": "payload..date"}, "has an empty part"),
        ({"command.": "date"}, "'command.' has an empty part"),
    ],
)
def test_a_fill_path_the_config_lacks_or_a_secret_is_a_400_on_input_fills(api_client, fills, words):
    body = {
        "runner": "subprocess",
        "config": {"command": ["echo", "x"], "env": {"TOKEN": "s3cret-value"}},
        "input_fills": fills,
    }
    errors = _errors(api_client.post("/api/v1/tasks", body, format="json"))

    assert set(errors) == {"input_fills"} and words in json.dumps(errors["input_fills"])
    assert not Task.objects.exists()


def test_a_patch_with_a_fill_that_cannot_apply_is_refused(api_client):
    task = _create(api_client, config={"command": ["echo", "a"]})
    errors = _errors(
        api_client.patch(f"/api/v1/tasks/{task['id']}", {"input_fills": {"command.1": "."}}, format="json")
    )
    assert "has an empty part" in errors["input_fills"][0]
    assert Task.objects.get(pk=task["id"]).input_fills in (None, {})


def test_a_change_of_config_that_removes_a_filled_path_is_refused(api_client):
    task = _create(api_client, config={"command": ["echo", "a", "b"]}, input_fills={"command.2": "b"})

    errors = _errors(api_client.patch(f"/api/v1/tasks/{task['id']}", {"config": {"command": ["echo"]}}, format="json"))

    assert "'command.2' names nothing in config" in errors["input_fills"][0]
    assert config_open(Task.objects.get(pk=task["id"]).config) == {"command": ["echo", "a", "b"]}


# --- trigger with an input ----------------------------------------------------------------------


def test_a_trigger_s_input_is_stored_and_shown_with_secret_looking_values_masked(api_client):
    task = _create(api_client)
    given = {"message": "hello", "api_token": "tok-123456", "nested": {"password": "pw-abcdef", "n": 2}}

    response = api_client.post(f"/api/v1/tasks/{task['id']}/trigger", {"input": given}, format="json")

    assert response.status_code == 201, response.json()
    shown = response.json()["input"]
    assert shown == {"message": "hello", "api_token": "********", "nested": {"password": "********", "n": 2}}
    execution = Execution.objects.get(pk=response.json()["id"])
    assert execution.input == given and execution.origin == ExecutionOrigin.TRIGGER
    listed = api_client.get(f"/api/v1/tasks/{task['id']}/executions").json()["results"][0]
    assert listed["input"] == shown and listed["replay_of"] is None and listed["config"] is None
    assert "tok-123456" not in json.dumps(api_client.get(f"/api/v1/executions/{execution.pk}").json())


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ([1, 2], "A JSON object"),
        ("text", "A JSON object"),
        ({"message": ""}, "should be non-empty (at message)"),
        ({"message": "x", "count": "three"}, "'three' is not of type 'integer' (at count)"),
        ({"count": 1}, "'message' is a required property (at the input itself)"),
        ({"message": "x" * (INPUT_MAX_CHARS + 1)}, f"At most {INPUT_MAX_CHARS} characters"),
        ({"message": "nul \x00"}, "Null characters"),
    ],
)
def test_a_bad_input_is_a_400_on_input_with_the_validator_s_message_and_nothing_is_created(api_client, given, words):
    task = _create(api_client, input_schema=SCHEMA)

    errors = _errors(api_client.post(f"/api/v1/tasks/{task['id']}/trigger", {"input": given}, format="json"))

    assert set(errors) == {"input"} and words in " ".join(errors["input"])
    assert not Execution.objects.filter(task_id=task["id"]).exists()


def test_a_trigger_without_input_is_checked_as_an_empty_object(api_client):
    required = _create(api_client, input_schema=SCHEMA)
    optional = _create(api_client, input_schema={"type": "object"})

    errors = _errors(api_client.post(f"/api/v1/tasks/{required['id']}/trigger", format="json"))
    ok = api_client.post(f"/api/v1/tasks/{optional['id']}/trigger", format="json")

    assert "'message' is a required property" in errors["input"][0]
    assert ok.status_code == 201 and ok.json()["input"] is None


def test_an_input_whose_fill_the_runner_refuses_is_a_400_on_input(api_client):
    task = _create(
        api_client,
        runner="http",
        config={"url": "http://127.0.0.1:9/ping", "max_response_bytes": 5000},
        input_fills={"max_response_bytes": "limit"},
    )

    errors = _errors(
        api_client.post(f"/api/v1/tasks/{task['id']}/trigger", {"input": {"limit": "lots"}}, format="json")
    )

    assert "the runner refuses" in errors["input"][0]
    assert not Execution.objects.filter(task_id=task["id"]).exists()


def test_debounced_triggers_join_one_run_and_the_last_input_wins(user):
    task = task_create(owner=user, runner="noop", config={}, trigger_debounce=timedelta(seconds=60))
    first = task_trigger(task=task, actor="t", run_input={"n": 1})
    second = task_trigger(task=task, actor="t", run_input={"n": 2})
    third = task_trigger(task=task, actor="t", run_input={"n": 3})

    assert second.joined and third.joined
    assert first.execution.pk == second.execution.pk == third.execution.pk
    (run,) = Execution.objects.filter(task=task, origin=ExecutionOrigin.TRIGGER)
    assert run.input == {"n": 3} and third.execution.input == {"n": 3}
    assert run.due_at == first.execution.due_at  # the first trigger's time: later ones do not push it

    # A run taken meanwhile (its time came) is not joined: the next trigger gets a run of its own.
    Execution.objects.filter(pk=run.pk).update(status=ExecutionStatus.PENDING)
    fourth = task_trigger(task=task, actor="t", run_input={"n": 4})
    assert not fourth.joined and fourth.execution.input == {"n": 4}
    assert Execution.objects.get(pk=run.pk).input == {"n": 3}


# --- the config the runner gets -----------------------------------------------------------------


def test_fills_set_exactly_their_paths_and_a_missing_value_keeps_the_config_s():
    config = {"command": ["echo", "default"], "cwd": "/tmp", "nested": {"a": 1, "b": [1, 2]}}
    fills = {"command.1": "message", "nested.b.1": "deep.value", "nested.a": "absent"}

    filled = config_filled(config, {"message": "hi", "deep": {"value": [9]}, "other": 1}, fills)

    assert filled == {"command": ["echo", "hi"], "cwd": "/tmp", "nested": {"a": 1, "b": [1, [9]]}}
    assert config == {"command": ["echo", "default"], "cwd": "/tmp", "nested": {"a": 1, "b": [1, 2]}}
    assert config_filled(config, None, fills) is config


def test_a_workflow_step_s_input_fills_its_config_and_a_schema_mismatch_fails_its_start(user):
    upstream = task_create(owner=user, runner="noop", config={})
    step = task_create(
        owner=user,
        runner="subprocess",
        config={"command": ["echo", "none"]},
        input_fills={"command.1": "rows"},
        input_schema={"type": "object", "properties": {"rows": {"type": "string"}}},
        after=[{"task": str(upstream.pk), "on": "success"}],
    )
    root = Execution.objects.get(task=upstream).pk
    Execution.objects.filter(pk=root).update(status=ExecutionStatus.PENDING)
    assert transitions.execution_claim_loaded(
        execution_id=root, attempt=1, worker_id="w", lease_seconds=60, checked=True
    )
    assert transitions.execution_succeed(
        execution_id=root, attempt=1, worker_id="w", output='{"rows": "3"}', max_chars=10_000
    )
    run = Execution.objects.get(task=step)

    assert run.origin == ExecutionOrigin.WORKFLOW and run.input == {"rows": "3"}
    assert run_spec(run, step, starting=True).config["command"] == ["echo", "3"]
    run.input = {"rows": 3}
    with pytest.raises(ValueError, match="does not satisfy the task's input_schema: 3 is not of type 'string'"):
        run_spec(run, step, starting=True)


def test_a_filled_config_reaches_the_runner_and_the_task_s_config_is_unchanged(api_client, user):
    task = _create(api_client, input_schema=SCHEMA, input_fills={"command.1": "message"})
    response = api_client.post(f"/api/v1/tasks/{task['id']}/trigger", {"input": {"message": "filled!"}}, format="json")
    plain = api_client.post(f"/api/v1/tasks/{task['id']}/trigger", {"input": {"message": "second"}}, format="json")
    assert response.status_code == plain.status_code == 201

    # A worker's way, in this process: the monitor's take, then the worker's run with the real
    # subprocess runner.
    for dispatch in transitions.executions_take_due(limit=10, actor="monitor"):
        worker_services.execution_run(execution_id=dispatch.execution_id, attempt=dispatch.attempt, worker_id="w1")

    outputs = dict(Execution.objects.filter(task_id=task["id"]).values_list("pk", "output"))
    assert outputs[response.json()["id"]].strip() == "filled!" and outputs[plain.json()["id"]].strip() == "second"
    assert config_open(Task.objects.get(pk=task["id"]).config) == {"command": ["echo", "nothing given"]}


# --- trigger URLs -------------------------------------------------------------------------------


def _hook(api_client: APIClient, task_id: str) -> dict:
    response = api_client.post(f"/api/v1/tasks/{task_id}/trigger-url")
    assert response.status_code == 201
    return response.json()


def _fire(made: dict, body: bytes, content_type: str = "application/json"):
    timestamp = str(int(time.time()))
    digest = hmac.new(made["secret"].encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return APIClient().post(
        f"/hooks/v1/{made['id']}",
        data=body,
        content_type=content_type,
        HTTP_X_TMS_TIMESTAMP=timestamp,
        HTTP_X_TMS_SIGNATURE=digest,
    )


def test_a_trigger_url_s_json_body_is_the_run_s_input(api_client):
    task = _create(api_client, input_schema=SCHEMA, input_fills={"command.1": "message"})
    made = _hook(api_client, task["id"])

    response = _fire(made, json.dumps({"message": "from a webhook", "count": 2}).encode())

    assert response.status_code == 202, response.content
    assert Execution.objects.get(pk=response.json()["execution"]).input == {"message": "from a webhook", "count": 2}


def test_a_trigger_url_body_the_schema_refuses_is_a_400_and_starts_nothing(api_client):
    task = _create(api_client, input_schema=SCHEMA)
    made = _hook(api_client, task["id"])

    response = _fire(made, json.dumps({"message": 5}).encode())

    assert _errors(response) == {"input": ["5 is not of type 'string' (at message)"]}
    assert not Execution.objects.filter(task_id=task["id"]).exists()


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"ref=main&event=push", "application/x-www-form-urlencoded"),
        (b"[1, 2]", "application/json"),
        (b"", "text/plain"),
    ],
)
def test_a_trigger_url_body_that_is_no_json_object_starts_a_run_without_input(api_client, body, content_type):
    task = _create(api_client)
    made = _hook(api_client, task["id"])

    response = _fire(made, body, content_type)

    assert response.status_code == 202, response.content
    assert Execution.objects.get(pk=response.json()["execution"]).input is None


# --- pages --------------------------------------------------------------------------------------


def test_the_execution_page_and_the_admin_show_the_input_masked(user, admin_user):
    task = task_create(owner=user, runner="noop", config={})
    execution = task_trigger(task=task, actor="t", run_input={"city": "Oslo", "secret_key": "k-9876543"}).execution
    page = Client()
    page.force_login(user)
    admin = Client()
    admin.force_login(admin_user)

    html = page.get(f"/ui/executions/{execution.pk}/").content.decode()
    admin_html = admin.get(f"/admin/executions/execution/{execution.pk}/change/").content.decode()

    for shown in (html, admin_html):
        assert "Oslo" in shown and "k-9876543" not in shown and "********" in shown
    assert 'id="execution-input"' in html


def test_task_check_rejects_input_given_to_the_service_too(user):
    task = task_create(owner=user, runner="noop", config={}, input_schema=SCHEMA)

    with pytest.raises(InvalidInput) as caught:
        task_trigger(task=task, actor="t", run_input={"message": 1})

    assert caught.value.errors == {"input": ["1 is not of type 'string' (at message)"]}
    assert not Execution.objects.filter(task=task, origin=ExecutionOrigin.TRIGGER).exists()
