"""The task forms' team, ``after``, named limits and input schema, the team on the task page and
list, and "Move to team…" (issue 46): every write through the API's serializers and services, with
their role checks; errors on the field."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tasks_api.calendars import calendar_create
from tasks_api.creation import task_create
from tasks_api.limits import limit_create
from tasks_app.models import AuditEntry, Task, TaskDependency
from tasks_app.teams.services import member_set, team_create


def _new(**fields):
    """The "New task" form's POST: a one-shot noop task unless said."""
    data = {"name": "", "runner": "noop", "timezone": "UTC", "misfire_policy": "run_once", "overlap_policy": "allow"}
    data.update({f"after_on_{i}": "success" for i in range(3)})
    data.update(fields)
    return data


@pytest.fixture
def ops(db, user):
    """Alice's shared team "ops": Bob an editor, Vera a viewer, Otto an operator."""
    team = team_create(creator=user, name="Ops", slug="ops")
    for name, role in (("bob", "editor"), ("vera", "viewer"), ("otto", "operator")):
        get_user_model().objects.create_user(name)
        member_set(team=team, username=name, role=role)
    return team


def _edit_data(client, task) -> dict:
    """The edit form as the page shows it (what a browser posts back unchanged)."""
    form = client.get(f"/ui/tasks/{task.pk}/edit/").context["form"]
    data = {}
    for name, field in form.fields.items():
        value = form.initial.get(name, field.initial)
        if value is None:
            continue
        data[name] = value if isinstance(value, list) else str(value)
    return data


def test_the_new_form_offers_the_editors_teams_and_creates_in_the_chosen_one(alice_client, user, ops, client):
    page = alice_client.get("/ui/tasks/")
    choices = dict(page.context["form"].fields["team"].choices)
    assert (
        set(choices) == {user.personal_team.slug, "ops"}
        and page.context["form"].fields["team"].initial == user.personal_team.slug
    )
    made = alice_client.post("/ui/tasks/", _new(name="nightly", team="ops"), follow=True)
    task = Task.objects.get(name="nightly")
    assert task.team_id == ops.pk
    assert "Task nightly created in team Ops." in made.content.decode()
    # The list and the task page show the team.
    listed = alice_client.get("/ui/tasks/").content.decode()
    assert 'href="?team=ops" title="Only the tasks of this team">Ops</a>' in listed
    assert 'id="task-team">Team: <a href' in alice_client.get(f"/ui/tasks/{task.pk}/").content.decode()
    # A viewer of ops is offered only their personal team; a forged "ops" is refused on the field.
    vera = get_user_model().objects.get(username="vera")
    client.force_login(vera)
    assert list(dict(client.get("/ui/tasks/").context["form"].fields["team"].choices)) == [vera.personal_team.slug]
    refused = client.post("/ui/tasks/", _new(name="sneaky", team="ops"))
    assert refused.status_code == 400 and refused.context["form"].errors["team"]
    assert not Task.objects.filter(name="sneaky").exists()


def test_after_by_name_with_on_and_errors_on_the_field(alice_client, user, ops):
    extract = task_create(owner=user, team=ops, runner="noop", name="extract")
    task_create(owner=user, runner="noop", name="other team's")  # Alice's personal team
    made = alice_client.post(
        "/ui/tasks/", _new(name="load", team="ops", after_task_0="extract", after_on_0="failure"), follow=True
    )
    assert made.status_code == 200
    load = Task.objects.get(name="load")
    assert list(TaskDependency.objects.filter(task=load).values_list("upstream_id", "on")) == [(extract.pk, "failure")]
    # A task of another team is not found by its name; an unknown one neither: said on `after`.
    for name in ("other team's", "nope"):
        refused = alice_client.post("/ui/tasks/", _new(name="x", team="ops", after_task_0=name))
        assert refused.status_code == 400
        assert refused.context["form"].errors["after"] == [f"No task named {name!r} in the task's team."]
    # Two tasks of one name: the id is asked for.
    task_create(owner=user, team=ops, runner="noop", name="extract")
    twice = alice_client.post("/ui/tasks/", _new(name="x", team="ops", after_task_0="extract"))
    assert "2 tasks of the team are named 'extract'" in twice.context["form"].errors["after"][0]
    assert not Task.objects.filter(name="x").exists()


def test_the_edit_form_keeps_after_and_refuses_a_cycle_with_the_services_words(alice_client, user, ops):
    extract = task_create(owner=user, team=ops, runner="noop", name="extract")
    load = task_create(owner=user, team=ops, runner="noop", name="load", after=[{"task": str(extract.pk)}])
    data = _edit_data(alice_client, load)
    assert data["after_task_0"] == "extract" and data["after_on_0"] == "success"
    unchanged = alice_client.post(f"/ui/tasks/{load.pk}/edit/", data, follow=True)
    assert "Nothing changed." in unchanged.content.decode()
    # extract after load: a cycle, refused by the service on `after`, nothing saved.
    data = _edit_data(alice_client, extract)
    data["after_task_0"] = "load"
    cycle = alice_client.post(f"/ui/tasks/{extract.pk}/edit/", data)
    assert cycle.status_code == 400 and "A cycle" in cycle.context["form"].errors["after"][0]
    assert not TaskDependency.objects.filter(task=extract).exists()
    # Changing how it follows: saved and audited as the API's PATCH is.
    data = _edit_data(alice_client, load)
    data["after_on_0"] = "completion"
    saved = alice_client.post(f"/ui/tasks/{load.pk}/edit/", data, follow=True)
    assert "Saved: after." in saved.content.decode()
    assert TaskDependency.objects.get(task=load).on == "completion"
    assert AuditEntry.objects.filter(task_id=load.pk, action="update").exists()
    # Clearing the row removes the link.
    data = _edit_data(alice_client, load)
    data["after_task_0"] = ""
    alice_client.post(f"/ui/tasks/{load.pk}/edit/", data)
    assert not TaskDependency.objects.filter(task=load).exists()


def test_input_schema_and_named_limits_in_the_form(alice_client, user, ops):
    limit_create(owner=user, team=ops, name="api", max_concurrency=2)
    limit_create(owner=user, name="mine", max_concurrency=1)  # Alice's personal team
    bad = alice_client.post("/ui/tasks/", _new(name="s", team="ops", input_schema="{not json"))
    assert bad.status_code == 400 and bad.context["form"].errors["input_schema"][0].startswith("Not valid JSON")
    bad = alice_client.post("/ui/tasks/", _new(name="s", team="ops", input_schema='{"type": "nonsense"}'))
    assert bad.status_code == 400 and bad.context["form"].errors["input_schema"]
    # A limit of another team is not the task's: the service's words, on `limits`.
    wrong = alice_client.post("/ui/tasks/", _new(name="s", team="ops", limits=["mine"]))
    assert wrong.status_code == 400 and "No limit named 'mine'" in wrong.context["form"].errors["limits"][0]
    schema = '{"type": "object", "required": ["day"]}'
    made = alice_client.post("/ui/tasks/", _new(name="s", team="ops", limits=["api"], input_schema=schema))
    assert made.status_code == 302
    task = Task.objects.get(name="s")
    assert task.input_schema == {"type": "object", "required": ["day"]}
    assert list(task.limits.values_list("name", flat=True)) == ["api"]
    # The edit form shows them and clears them.
    data = _edit_data(alice_client, task)
    assert data["limits"] == ["api"] and '"required"' in data["input_schema"]
    data.pop("limits")
    data["input_schema"] = ""
    saved = alice_client.post(f"/ui/tasks/{task.pk}/edit/", data, follow=True)
    assert "Saved: input_schema, limits." in saved.content.decode()
    task.refresh_from_db()
    assert task.input_schema is None and not task.limits.exists()
    # The calendar's help links to the calendar pages, not the API.
    html = alice_client.get(f"/ui/tasks/{task.pk}/edit/").content.decode()
    assert 'href="/ui/calendars/">business calendars</a>' in html and "/api/v1/calendars" not in html


def test_move_to_team_through_the_service_with_its_role_checks(alice_client, user, ops, client):
    task = task_create(owner=user, runner="noop", name="mover")
    page = alice_client.get(f"/ui/tasks/{task.pk}/").content.decode()
    assert 'id="move-task-form"' in page and '<option value="ops">Ops</option>' in page
    moved = alice_client.post(f"/ui/tasks/{task.pk}/move/", {"team": "ops"}, follow=True)
    assert "Moved mover to team Ops" in moved.content.decode()
    task.refresh_from_db()
    assert task.team_id == ops.pk
    assert AuditEntry.objects.filter(task_id=task.pk, detail="moved").exists()
    # What keeps it in its team is said: a calendar of ops.
    calendar_create(owner=user, team=ops, name="ops days", weekends_closed=True)
    data = _edit_data(alice_client, task)
    data["calendar"] = "ops days"
    assert alice_client.post(f"/ui/tasks/{task.pk}/edit/", data).status_code == 302
    kept = alice_client.post(f"/ui/tasks/{task.pk}/move/", {"team": user.personal_team.slug}, follow=True)
    assert (
        "was not moved" in kept.content.decode()
        and "calendar: The task uses calendar &#x27;ops days&#x27;" in kept.content.decode()
    )
    assert Task.objects.get(pk=task.pk).team_id == ops.pk
    # The edit form moves it too, with the calendar replaced in the same request.
    data = _edit_data(alice_client, task)
    data.update(team=user.personal_team.slug, calendar="")
    saved = alice_client.post(f"/ui/tasks/{task.pk}/edit/", data, follow=True)
    assert "Saved: calendar, team." in saved.content.decode()
    assert Task.objects.get(pk=task.pk).team_id == user.personal_team.pk
    # Bob (editor of ops, not of Alice's personal team) may not move a task of ops to his own team
    # and back into Alice's: the target must be his; a viewer sees no move and gets a 403.
    shared = task_create(owner=user, team=ops, runner="noop", name="shared")
    bob = get_user_model().objects.get(username="bob")
    client.force_login(bob)
    assert client.post(f"/ui/tasks/{shared.pk}/move/", {"team": user.personal_team.slug}).status_code == 302
    assert Task.objects.get(pk=shared.pk).team_id == ops.pk  # "No team ... of yours", said in a message
    client.force_login(get_user_model().objects.get(username="vera"))
    page = client.get(f"/ui/tasks/{shared.pk}/").content.decode()
    assert 'id="move-task-form"' not in page and 'id="edit"' not in page
    assert client.post(f"/ui/tasks/{shared.pk}/move/", {"team": "ops"}).status_code == 403
    client.force_login(get_user_model().objects.get(username="otto"))
    assert client.post(f"/ui/tasks/{shared.pk}/move/", {"team": "ops"}).status_code == 403
    assert client.get(f"/ui/tasks/{shared.pk}/edit/").status_code == 403


def test_the_list_and_the_form_read_in_a_fixed_number_of_queries(
    alice_client, user, ops, django_assert_max_num_queries
):
    """The team column and the form's choices (teams, limits, task names) cost the same for 3
    tasks as for 30: no query per row."""
    for index in range(3):
        task_create(owner=user, team=ops, runner="noop", name=f"t{index}")
    with django_assert_max_num_queries(99) as few:
        alice_client.get("/ui/tasks/")
    for index in range(27):
        task_create(owner=user, runner="noop", name=f"u{index}")
    with django_assert_max_num_queries(len(few.captured_queries)):
        page = alice_client.get("/ui/tasks/")
    assert len(page.context["rows"]) == 30
