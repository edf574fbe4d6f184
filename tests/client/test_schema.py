"""The schema as strict outside tools read it: what a generated client sends by default, which
``null``s a strict OpenAPI 3.0 validator admits, and the formats of values the server takes."""

from __future__ import annotations

from typing import Any

import pytest
from openapi_schema_validator import OAS30Validator
from rest_framework.test import APIClient


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return APIClient().get("/api/schema/?format=json").json()


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _validator(schema: dict[str, Any], node: dict[str, Any]) -> OAS30Validator:
    return OAS30Validator({**node, "components": schema["components"]}, format_checker=OAS30Validator.FORMAT_CHECKER)


def _walk(node: Any, path: str = "#") -> Any:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}/{index}")


def test_no_patch_request_schema_declares_a_default(schema):
    # A generated client sends a field's default when the caller leaves it out: in a PATCH body
    # that is a reset of every field not given.
    checked = set()
    for path, item in schema["paths"].items():
        if "patch" not in item:
            continue
        body = item["patch"]["requestBody"]["content"]["application/json"]["schema"]
        top = _resolve(schema, body)
        for variant in top.get("oneOf", [body]):
            name = variant.get("$ref", path).rsplit("/", 1)[-1]
            properties = _resolve(schema, variant)["properties"]
            assert properties, name
            assert not {field for field, spec in properties.items() if "default" in spec}, name
            checked.add(name)
    assert {"PatchedTaskUpdateKeepRunnerRequest", "PatchedTaskUpdateHttpRequest", "PatchedLimitRequest"} <= checked
    assert {"PatchedChannelRequest", "PatchedRuleRequest"} <= checked
    # Creating still states its defaults: a field left out there does take them.
    assert schema["components"]["schemas"]["TaskCreateNoopRequest"]["properties"]["priority"]["default"] == 5


def test_every_nullable_value_admits_null_under_a_strict_openapi_30_validator(schema):
    # OpenAPI 3.0: ``nullable`` only widens a ``type`` in the same schema object; beside an allOf
    # or a oneOf without one it admits nothing, and strict validators refuse the null.
    untyped = [path for path, node in _walk(schema) if node.get("nullable") is True and "type" not in node]
    assert not untyped
    components = schema["components"]["schemas"]
    for component, field in [
        ("Why", "skipped"),
        ("Why", "execution"),
        ("Occurrence", "skip"),
        ("Occurrence", "execution"),
        ("TaskCreateNoopRequest", "interval"),
        ("PatchedRuleRequest", "late_after"),
        ("CompatScheduleTaskRequest", "start_at"),
    ]:
        spec = components[component]["properties"][field]
        assert not list(_validator(schema, spec).iter_errors(None)), (component, field)
    skipped = components["Why"]["properties"]["skipped"]
    assert list(_validator(schema, skipped).iter_errors({})), "an object that is not a WhySkipped is refused"
    assert not list(_validator(schema, components["TaskCreateNoopRequest"]["properties"]["interval"]).iter_errors(90))


def test_times_of_day_and_wall_clock_times_declare_what_the_server_takes(schema):
    components = schema["components"]["schemas"]
    for component in ("ChannelRequest", "PatchedChannelRequest", "Channel"):
        quiet_from = components[component]["properties"]["quiet_from"]
        assert "format" not in quiet_from, component
        validator = _validator(schema, quiet_from)
        for good in ("22:00", "06:30:15", None):
            assert not list(validator.iter_errors(good)), (component, good)
        for bad in ("2200", "22", "24:00", "22:00:00+02:00", "T22:00"):
            assert list(validator.iter_errors(bad)), (component, bad)
    start_at = _validator(schema, components["TaskCreateNoopRequest"]["properties"]["start_at"])
    for good in ("2030-01-15T09:00:00", "2030-01-15T09:00:00Z", "2030-01-15T09:00:00+09:00", None):
        assert not list(start_at.iter_errors(good)), good
    assert list(start_at.iter_errors("2030-01-15 09:00"))


@pytest.mark.django_db
def test_quiet_hours_take_exactly_hh_mm_and_answer_it(api_client):
    url = "/api/v1/notification-channels"
    body = {"name": "hook", "kind": "webhook", "target": "http://127.0.0.1:9/hook", "timezone": "Europe/Paris"}
    for bad in ("2200", "22", "22:00:00+02:00", "25:00", 2200):
        response = api_client.post(url, {**body, "quiet_from": bad, "quiet_to": "06:30"}, format="json")
        assert response.status_code == 400, (bad, response.content)
        assert set(response.json()["errors"]) == {"quiet_from"}, bad
    created = api_client.post(url, {**body, "quiet_from": "22:00", "quiet_to": "06:30:15"}, format="json")
    assert created.status_code == 201, created.content
    assert (created.json()["quiet_from"], created.json()["quiet_to"]) == ("22:00", "06:30:15")
    cleared = api_client.patch(f"{url}/{created.json()['id']}", {"quiet_from": None, "quiet_to": None}, format="json")
    assert (cleared.json()["quiet_from"], cleared.json()["quiet_to"]) == (None, None)
