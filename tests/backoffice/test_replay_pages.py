"""Replay from the back office (issue 46): one finished run from its page, with its own input or
an input edited in the form built from the task's schema (never a config: an editor's change),
and the runs ticked on the execution list; through the API's replay service and its role rule
(operator), saying how many were replayed; a viewer sees no button or box and is refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from executions.models import Execution, ExecutionOrigin, ExecutionStatus
from tasks_api.creation import task_create
from tasks_app.models import AuditEntry
from tests.factories import ExecutionFactory

pytestmark = pytest.mark.django_db

SCHEMA = {"type": "object", "properties": {"day": {"type": "string"}, "n": {"type": "integer", "minimum": 1}}}


@pytest.fixture
def runs(crew):
    task = task_create(
        owner=crew["people"]["admin"], team=crew["team"], runner="noop", name="nightly", input_schema=SCHEMA
    )
    done = datetime(2026, 1, 2, tzinfo=UTC)
    failed = ExecutionFactory(task=task, status=ExecutionStatus.FAILED, finished_at=done, input={"day": "mon", "n": 2})
    ok = ExecutionFactory(task=task, status=ExecutionStatus.SUCCEEDED, finished_at=done)
    waiting = ExecutionFactory(task=task)
    return {"task": task, "failed": failed, "ok": ok, "waiting": waiting}


def _replays():
    return list(Execution.objects.filter(origin=ExecutionOrigin.REPLAY).order_by("id"))


def test_an_operator_replays_a_run_with_its_own_input(client, crew, runs):
    client.force_login(crew["people"]["operator"])
    failed = runs["failed"]
    assert (
        f'href="/ui/executions/{failed.pk}/replay/" id="replay"'
        in client.get(f"/ui/executions/{failed.pk}/").content.decode()
    )
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/ui/executions/{failed.pk}/replay/")
    assert page.status_code == 200 and len(queries) <= 8, [q["sql"] for q in queries]
    html = page.content.decode()
    assert 'name="in-day" value="mon"' in html and 'name="in-n" value="2"' in html
    assert 'name="config"' not in html
    done = client.post(f"/ui/executions/{failed.pk}/replay/", {"in-day": "tue"})  # not ticked: kept
    (new,) = _replays()
    assert done["Location"] == f"/ui/executions/{new.pk}/"
    assert new.replay_of_id == failed.pk and new.input == {"day": "mon", "n": 2} and new.config_override is None
    shown = client.get(done["Location"]).content.decode()
    assert f"1 execution replayed: new run #{new.pk} with its own input." in shown
    assert AuditEntry.objects.filter(action="replay", object_id=str(new.pk)).count() == 1


def test_an_edited_input_is_checked_by_the_schema_on_its_field(client, crew, runs):
    client.force_login(crew["people"]["operator"])
    failed = runs["failed"]
    bad = client.post(f"/ui/executions/{failed.pk}/replay/", {"replace": "on", "in-day": "tue", "in-n": "0"})
    assert bad.status_code == 400 and bad.context["form"].errors == {"in-n": ["Must be at least 1."]}
    assert not _replays()
    done = client.post(f"/ui/executions/{failed.pk}/replay/", {"replace": "on", "in-day": "tue", "in-n": "5"})
    assert done.status_code == 302
    (new,) = _replays()
    assert new.input == {"day": "tue", "n": 5}


def test_an_unfinished_run_is_refused_with_a_message(client, crew, runs):
    client.force_login(crew["people"]["operator"])
    waiting = runs["waiting"]
    assert 'id="replay"' not in client.get(f"/ui/executions/{waiting.pk}/").content.decode()
    refused = client.post(f"/ui/executions/{waiting.pk}/replay/", {})
    assert refused.status_code == 400
    assert "only finished executions are replayed" in refused.content.decode()
    assert not _replays()


def test_the_list_replays_the_ticked_runs_and_says_how_many(client, crew, runs):
    client.force_login(crew["people"]["operator"])
    with CaptureQueriesContext(connection) as queries:
        page = client.get("/ui/executions/")
    html = page.content.decode()
    assert len(queries) <= 8, [q["sql"] for q in queries]
    for run in (runs["failed"], runs["ok"]):
        assert f'name="execution" value="{run.pk}" form="replay-selected"' in html
    ids = [runs["failed"].pk, runs["ok"].pk]
    done = client.post("/ui/executions/replay/", {"execution": ids, "next": "/ui/executions/?status=FAILED"})
    assert done["Location"] == "/ui/executions/?status=FAILED"
    made = _replays()
    assert sorted(e.replay_of_id for e in made) == sorted(ids)
    text = client.get(done["Location"]).content.decode()
    assert "2 executions replayed: new runs #" in text
    # Nothing ticked, or a run that is not finished: said, nothing replayed.
    client.post("/ui/executions/replay/", {})
    refused = client.post("/ui/executions/replay/", {"execution": [runs["waiting"].pk]}, follow=True).content.decode()
    assert "only finished executions are replayed" in refused
    assert len(_replays()) == 2


def test_a_viewer_sees_no_replay_and_is_refused(client, crew, runs, other_user):
    client.force_login(crew["people"]["viewer"])
    failed = runs["failed"]
    assert 'id="replay"' not in client.get(f"/ui/executions/{failed.pk}/").content.decode()
    listing = client.get("/ui/executions/").content.decode()
    assert 'name="execution"' not in listing and 'id="replay-selected"' not in listing
    assert client.get(f"/ui/executions/{failed.pk}/replay/").status_code == 403
    assert client.post(f"/ui/executions/{failed.pk}/replay/", {}).status_code == 403
    assert client.post("/ui/executions/replay/", {"execution": [failed.pk]}).status_code == 403
    client.force_login(other_user)  # not a member: the run is not theirs to see
    assert client.post(f"/ui/executions/{failed.pk}/replay/", {}).status_code == 404
    assert (
        "No execution"
        in client.post("/ui/executions/replay/", {"execution": [failed.pk]}, follow=True).content.decode()
    )
    assert not _replays()


def test_a_secret_left_masked_in_an_edited_input_keeps_its_value(client, crew):
    """The form shows a run's input masked (a token reads ``********``). Replacing the input
    while leaving the token alone once sent the mask itself as the token."""
    task = task_create(owner=crew["people"]["admin"], team=crew["team"], runner="noop", name="with-token")
    stored = {"day": "mon", "api_token": "s3cr3t", "env": {"KEY": "v"}}
    failed = ExecutionFactory(
        task=task, status=ExecutionStatus.FAILED, finished_at=datetime(2026, 1, 2, tzinfo=UTC), input=stored
    )
    client.force_login(crew["people"]["operator"])
    html = client.get(f"/ui/executions/{failed.pk}/replay/").content.decode()
    assert "s3cr3t" not in html and "********" in html
    edited = {"day": "tue", "api_token": "********", "env": {"KEY": "********"}, "extra": "********x"}
    done = client.post(f"/ui/executions/{failed.pk}/replay/", {"replace": "on", "input": json.dumps(edited)})
    assert done.status_code == 302, done.content.decode()
    (new,) = _replays()
    # Each value still reading the mask is the stored one; what was typed stays as typed.
    assert new.input == {"day": "tue", "api_token": "s3cr3t", "env": {"KEY": "v"}, "extra": "********x"}
