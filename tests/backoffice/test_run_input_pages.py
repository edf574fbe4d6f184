"""Run now with input (issue 46): a task with an ``input_schema`` gets a form built from it (a
typed field per property, or a JSON box beside the schema when it is not a simple object),
checked by the API's trigger service, the schema's problems on the fields in plain words; a
workflow's root starts a workflow run with input; a viewer sees no button and is refused."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from executions.models import Execution, ExecutionOrigin
from tasks_api.creation import task_create
from tests.workflows import after as _after

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "properties": {
        "date": {"type": "string", "format": "date", "title": "Day"},
        "count": {"type": "integer", "minimum": 1},
        "mode": {"enum": ["full", "delta"]},
        "dry": {"type": "boolean"},
    },
    "required": ["date", "count"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {"rows": {"type": "array", "items": {"type": "integer"}}},
    "required": ["rows"],
}


@pytest.fixture
def report(crew):
    return task_create(
        owner=crew["people"]["admin"], team=crew["team"], runner="noop", name="report", input_schema=SCHEMA
    )


def _client(client, user):
    client.force_login(user)
    return client


def test_the_form_has_a_typed_field_per_property_and_runs_with_the_input(client, crew, report):
    client = _client(client, crew["people"]["operator"])
    page = client.get(f"/ui/tasks/{report.pk}/")
    assert f'href="/ui/tasks/{report.pk}/run/" id="run-now">Run now with input' in page.content.decode()
    with CaptureQueriesContext(connection) as queries:
        form = client.get(f"/ui/tasks/{report.pk}/run/")
    assert form.status_code == 200
    assert len(queries) <= 8, [q["sql"] for q in queries]
    html = form.content.decode()
    assert 'name="in-date"' in html and 'type="date"' in html and "Day" in html
    assert 'name="in-count"' in html and 'type="number"' in html
    assert '<option value="&quot;delta&quot;">delta</option>' in html
    assert 'name="input"' not in html  # fields, not the JSON box
    before = Execution.objects.count()
    done = client.post(
        f"/ui/tasks/{report.pk}/run/",
        {"in-date": "2026-11-27", "in-count": "3", "in-mode": '"delta"', "in-dry": "true"},
    )
    assert done.status_code == 302
    new = Execution.objects.get(task=report, origin=ExecutionOrigin.TRIGGER)
    assert Execution.objects.count() == before + 1
    assert new.input == {"date": "2026-11-27", "count": 3, "mode": "delta", "dry": True}
    assert done["Location"] == f"/ui/executions/{new.pk}/"
    shown = client.get(done["Location"]).content.decode()
    assert f"Execution {new.pk} created, due now with the input given." in shown


def test_the_schemas_problems_land_on_their_fields_and_nothing_runs(client, crew, report):
    client = _client(client, crew["people"]["operator"])
    before = Execution.objects.count()
    # The old one-click button posts nothing: the schema's required keys are missing.
    empty = client.post(f"/ui/tasks/{report.pk}/run/")
    assert empty.status_code == 400
    form = empty.context["form"]
    assert form.errors["in-date"] == ["Required."] and form.errors["in-count"] == ["Required."]
    bad = client.post(f"/ui/tasks/{report.pk}/run/", {"in-date": "2026-11-27", "in-count": "0"})
    assert bad.status_code == 400
    assert bad.context["form"].errors == {"in-count": ["Must be at least 1."]}
    typed = client.post(f"/ui/tasks/{report.pk}/run/", {"in-date": "2026-11-27", "in-count": "two"})
    assert typed.status_code == 400 and "in-count" in typed.context["form"].errors
    assert 'class="error">Must be at least 1.<' in bad.content.decode()
    assert Execution.objects.count() == before


def test_a_complex_schema_gets_a_json_box_beside_the_schema(client, crew):
    task = task_create(owner=crew["people"]["admin"], team=crew["team"], runner="noop", name="n", input_schema=NESTED)
    client = _client(client, crew["people"]["operator"])
    html = client.get(f"/ui/tasks/{task.pk}/run/").content.decode()
    assert 'name="input"' in html and 'id="input-schema"' in html and "&quot;items&quot;" in html
    bad = client.post(f"/ui/tasks/{task.pk}/run/", {"input": '{"rows": ["a"]}'})
    assert bad.status_code == 400
    assert bad.context["form"].errors["input"] == ["rows: Must be a whole number. (at 0)"]
    broken = client.post(f"/ui/tasks/{task.pk}/run/", {"input": "{rows"})
    assert broken.status_code == 400 and broken.context["form"].errors["input"][0].startswith("Not valid JSON")
    assert not Execution.objects.filter(task=task, origin=ExecutionOrigin.TRIGGER).exists()
    ok = client.post(f"/ui/tasks/{task.pk}/run/", {"input": '{"rows": [1, 2]}'})
    assert ok.status_code == 302
    assert Execution.objects.get(task=task, origin=ExecutionOrigin.TRIGGER).input == {"rows": [1, 2]}


def test_a_workflow_root_starts_a_workflow_run_with_input(client, crew):
    admin, team = crew["people"]["admin"], crew["team"]
    extract = task_create(owner=admin, team=team, runner="noop", name="extract")
    load = task_create(owner=admin, team=team, runner="noop", name="load", after=_after((extract, "success")))
    client = _client(client, crew["people"]["operator"])
    page = client.get(f"/ui/tasks/{extract.pk}/").content.decode()
    assert 'id="start-workflow"' in page
    assert 'id="start-workflow"' not in client.get(f"/ui/tasks/{load.pk}/").content.decode()
    form = client.get(f"/ui/tasks/{extract.pk}/run/").content.decode()
    assert "Start workflow extract with input" in form and "load (on success)" in form
    done = client.post(f"/ui/tasks/{extract.pk}/run/", {"input": '{"day": "monday"}'})
    new = Execution.objects.get(task=extract, origin=ExecutionOrigin.TRIGGER)
    assert done["Location"] == f"/ui/workflow-runs/{new.pk}/"
    assert new.input == {"day": "monday"}
    assert "Workflow started with the input given" in client.get(done["Location"]).content.decode()


def test_a_viewer_sees_no_run_button_and_is_refused(client, crew, report):
    client = _client(client, crew["people"]["viewer"])
    assert 'id="run-now"' not in client.get(f"/ui/tasks/{report.pk}/").content.decode()
    assert client.get(f"/ui/tasks/{report.pk}/run/").status_code == 403
    assert client.post(f"/ui/tasks/{report.pk}/run/", {"in-date": "2026-11-27", "in-count": "3"}).status_code == 403
    assert not Execution.objects.filter(task=report, origin=ExecutionOrigin.TRIGGER).exists()
