"""What the API checks and what its OpenAPI schema says agree: each rule the schema states is
enforced, and each rule the API enforces is in the schema as far as OpenAPI can say it."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from tasks_api.limits import limit_create
from tests.factories import TaskFactory
from tms_core.api.base import MAX_DATETIME, MIN_DATETIME, BoundedDateTimeField
from tms_core.api.schema import BOUNDED_DATETIME_PATTERN, duration_pattern
from tms_core.durations import DurationField, parse_duration

pytestmark = pytest.mark.django_db

TASKS = "/api/v1/tasks"
LIMITS = "/api/v1/limits"


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    with django_db_blocker.unblock():
        return APIClient().get("/api/schema/?format=json").json()


def _component(schema, name):
    return schema["components"]["schemas"][name]


# --- unknown fields -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "TaskCreateHttpRequest",
        "PatchedTaskUpdateKeepRunnerRequest",
        "SchedulePreviewRequest",
        "BackfillRequest",
        "MaterialiseRequest",
        "CallbackRequest",
        "CompatScheduleTaskRequest",
        "HttpConfigRequest",
        "SleepConfigRequest",
    ],
)
def test_bodies_that_refuse_unknown_fields_say_so(schema, name):
    component = _component(schema, name)
    assert component["additionalProperties"] is False
    assert "Rejects fields the serializer does not know" not in component.get("description", "")


# --- a runner's config --------------------------------------------------------------------------


def test_a_new_task_has_one_schema_per_runner_selected_by_runner(schema, settings):
    body = _component(schema, "TaskCreateRequest")
    mapping = body["discriminator"]["mapping"]
    assert body["discriminator"]["propertyName"] == "runner"
    assert set(mapping) == set(settings.TMS_RUNNERS)
    assert [ref["$ref"] for ref in body["oneOf"]] == list(mapping.values())
    http = _component(schema, "TaskCreateHttpRequest")
    assert http["properties"]["runner"] == {"$ref": "#/components/schemas/HttpRunnerEnum"}
    assert _component(schema, "HttpRunnerEnum")["enum"] == ["http"]
    assert {"runner", "config"} <= set(http["required"])
    config = _component(schema, "HttpConfigRequest")  # derived from the backend's own serializer
    assert "url" in config["required"] and config["properties"]["url"]["maxLength"] == 2048
    noop = _component(schema, "TaskCreateNoopRequest")
    assert "config" not in noop["required"]
    assert noop["properties"]["config"] == {"type": "object", "properties": {}, "additionalProperties": False}


def test_a_change_names_its_runner_or_keeps_the_current_one(schema):
    body = _component(schema, "PatchedTaskUpdateRequest")
    refs = [ref["$ref"].rsplit("/", 1)[1] for ref in body["oneOf"]]
    assert refs[0] == "PatchedTaskUpdateKeepRunnerRequest" and "PatchedTaskUpdateHttpRequest" in refs
    keep = _component(schema, refs[0])
    assert "runner" not in keep["properties"] and "config" in keep["properties"]
    assert "config" not in _component(schema, "PatchedTaskUpdateHttpRequest").get("required", [])


# --- date-times -----------------------------------------------------------------------------------


def test_the_date_time_pattern_states_the_year_bounds():
    assert MIN_DATETIME.year == 1970 and MAX_DATETIME.year == 9000  # what the pattern is written for
    pattern = re.compile(BOUNDED_DATETIME_PATTERN)
    for good in ["1970-01-01T00:00:00Z", "8999-12-31T23:59:59.999999-23:59", "2026-03-29T02:30:00+02:00"]:
        assert pattern.match(good), good
    for bad in ["1969-12-31T23:59:59Z", "9000-01-01T00:00:00Z", "2026-03-29t02:30:00z", "2026-03-29T02:30:00"]:
        assert not pattern.match(bad), bad


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("1970-01-01T00:30:00+01:00", True),  # 1969 in UTC, 1970 as written
        ("8999-12-31T23:00:00-05:00", True),  # 9000 in UTC, 8999 as written
        ("1969-12-31T23:30:00-01:00", False),  # 1970 in UTC, 1969 as written
        ("9000-01-01T00:30:00+01:00", False),
    ],
)
def test_date_time_bounds_apply_to_the_date_as_written(value, accepted):
    field = BoundedDateTimeField()
    if accepted:
        assert field.to_internal_value(value) == datetime.fromisoformat(value)
    else:
        with pytest.raises(Exception, match="Must be between 1970-01-01 and 9000-01-01"):
            field.to_internal_value(value)


def test_why_and_materialise_accept_every_date_time_the_schema_allows(api_client, user):
    task = TaskFactory(owner=user)
    response = api_client.get(f"{TASKS}/{task.pk}/why", {"at": "1970-01-01T00:30:00+01:00"})
    assert response.status_code == 200, response.content
    response = api_client.get(f"{TASKS}/{task.pk}/why", {"at": "1969-12-31T23:30:00-01:00"})
    assert response.status_code == 400 and response.json()["errors"]["at"]


# --- durations ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("minimum", "maximum"),
    [(None, None), (timedelta(milliseconds=100), None), (timedelta(seconds=1), timedelta(days=30))],
)
@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data())
def test_every_duration_string_the_pattern_allows_is_accepted(minimum, maximum, data):
    field = DurationField(min_value=minimum, max_value=maximum)
    pattern = duration_pattern(minimum, maximum)
    text = data.draw(st.from_regex(pattern, fullmatch=True))
    value = field.to_internal_value(text)
    assert (minimum or timedelta(0)) <= value <= (maximum or timedelta(days=3650))


def test_the_duration_pattern_leaves_out_durations_out_of_bounds():
    pattern = re.compile(duration_pattern(timedelta(milliseconds=100), None))
    for good in ["0.1", "100ms", "0.1s", "1h30m", "90s", "100000us", "999d"]:
        assert pattern.match(good), good
    # Bounds rounded inwards to powers of ten: 3650d is accepted but not in the pattern.
    for bad in ["0", "0.09", "99ms", "0.05s", "1ms1h", "3651d", "-1s", "1e3", "3650d"]:
        assert not pattern.match(bad), bad
    assert parse_duration("1h30m") == timedelta(minutes=90)


def test_an_interval_under_100ms_is_refused_as_the_schema_says(api_client, schema):
    interval = _component(schema, "TaskCreateSleepRequest")["properties"]["interval"]["oneOf"]
    assert interval[0]["minimum"] == 0.1 and not re.match(interval[1]["pattern"], "50ms")
    response = api_client.post(
        TASKS, {"runner": "sleep", "config": {"duration": "1s"}, "interval": "50ms"}, format="json"
    )
    assert response.status_code == 400 and response.json()["errors"] == {"interval": ["Must be at least 100ms."]}


# --- pages and filters ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("offset=null", "offset"),
        ("offset=-1", "offset"),
        ("limit=0", "limit"),
        ("limit=x", "limit"),
        ("offset=", "offset"),
    ],
)
def test_a_bad_page_parameter_is_a_400_not_the_first_page(api_client, user, query, field):
    TaskFactory(owner=user)
    response = api_client.get(f"{TASKS}?{query}")
    assert response.status_code == 400, response.content
    assert list(response.json()["errors"]) == [field]


def test_a_big_limit_is_capped_and_the_task_list_refuses_an_offset(api_client, user):
    for _ in range(3):
        TaskFactory(owner=user)
    response = api_client.get(f"{TASKS}?limit=100000")
    assert response.status_code == 200 and len(response.json()["results"]) == 3
    refused = api_client.get(f"{TASKS}?offset=1")
    assert (
        refused.status_code == 400 and "follow the `next` and `previous` links" in refused.json()["errors"]["offset"][0]
    )


def test_a_bounded_list_pages_by_offset_in_range(api_client, user):
    for name in ("a", "b", "c"):
        limit_create(owner=user, name=name, max_concurrency=1)
    response = api_client.get(f"{LIMITS}?limit=100000&offset=1")
    assert response.status_code == 200 and len(response.json()["results"]) == 2
    assert response.json()["count"] == 3
    assert api_client.get(f"{LIMITS}?offset=100000000000000000").json()["results"] == []


def test_page_parameters_are_documented_with_their_bounds(schema):
    parameters = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/tasks"]["get"]["parameters"]}
    assert parameters["limit"] == {"type": "integer", "minimum": 1}
    assert "offset" not in parameters and parameters["cursor"]["type"] == "string"
    assert parameters["runner"]["minLength"] == 1 and "minLength" not in parameters["search"]
    bounded = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/limits"]["get"]["parameters"]}
    assert bounded["offset"] == {"type": "integer", "minimum": 0}


@pytest.mark.parametrize("url", ["/api/v1/executions?task=", f"{TASKS}?status=", f"{TASKS}?runner="])
def test_an_empty_filter_value_is_a_400_not_no_filter(api_client, user, url):
    TaskFactory(owner=user)
    response = api_client.get(url)
    assert response.status_code == 400, response.content
    assert response.json()["errors"][url.rsplit("?", 1)[1].rstrip("=")] == ["This field may not be blank."]


def test_text_inputs_say_they_refuse_nul_characters(api_client, schema):
    search = next(p for p in schema["paths"]["/api/v1/tasks"]["get"]["parameters"] if p["name"] == "search")
    assert search["schema"]["pattern"] == r"^[^\u0000]*$"
    assert _component(schema, "TaskCreateSleepRequest")["properties"]["name"]["pattern"] == r"^[^\u0000]*$"
    assert api_client.get(f"{TASKS}?search=a%00b").status_code == 400


# --- uploads (schemathesis cannot judge their negative data, see schemathesis.toml) -------------


def test_an_upload_without_a_file_or_with_an_empty_or_long_name_field_is_refused(
    api_client, schema, settings, tmp_path
):
    settings.MEDIA_ROOT = str(tmp_path)
    upload = _component(schema, "ArtifactUploadRequest")
    assert upload["required"] == ["file"] and upload["properties"]["file"]["minLength"] == 1
    url = "/api/v1/artifacts"
    assert api_client.post(url, {"name": "x"}, format="multipart").json()["errors"] == {
        "file": ["No file was submitted."]
    }
    empty = SimpleUploadedFile("empty.sh", b"")
    assert api_client.post(url, {"file": empty}, format="multipart").status_code == 400
    long = {"file": SimpleUploadedFile("a.sh", b"#!/bin/sh\n"), "name": "n" * 201}
    assert list(api_client.post(url, long, format="multipart").json()["errors"]) == ["name"]
    fine = {"file": SimpleUploadedFile("a.sh", b"#!/bin/sh\n"), "name": "123"}
    assert api_client.post(url, fine, format="multipart").status_code == 201


def test_a_number_for_a_text_field_is_refused_as_the_schema_says(api_client):
    body = {"runner": "sleep", "config": {"duration": "1s"}, "name": 5, "tracing_id": 1.5}
    response = api_client.post(TASKS, body, format="json")
    assert response.status_code == 400
    assert response.json()["errors"] == {"name": ["Not a valid string."], "tracing_id": ["Not a valid string."]}
