"""Issue 44, item 1: editing a workflow step must not take it out of its workflow.

A task with ``after`` and no schedule of its own has no fire time left once created; an edit that
re-plans it (config, priority, the schedule's details) used to let the materialiser judge it as a
one-shot task whose time had passed and mark it COMPLETED, silently: its upstream's ends then
started nothing. A task that follows others is never completed by its own schedule's end.
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from executions.materialiser import materialise_due, materialise_task
from executions.models import Execution, ExecutionOrigin
from tasks_api.creation import task_bulk_create, task_create
from tasks_api.editing import task_update
from tasks_api.lifecycle import task_resume
from tasks_api.triggers import task_trigger
from tasks_app.models import AuditEntry, Task, TaskStatus
from tests.workflows import after, end

pytestmark = pytest.mark.django_db


def _steps(task: Task) -> list[Execution]:
    return list(Execution.objects.filter(task=task, origin=ExecutionOrigin.WORKFLOW).order_by("id"))


def _root_run(task: Task) -> int:
    """A run of ``task`` (a trigger: a run of the root like any other), ended as succeeded."""
    run = task_trigger(task=task, actor="test").execution.pk
    end(run)
    return run


@pytest.mark.parametrize(
    "changes",
    [
        {"config": {"duration": "2s"}},
        {"priority": 7},
        {"name": "renamed"},
        {"timezone": "Europe/Paris"},
        {"jitter": timedelta(seconds=5)},
        {"max_attempts": 5},
        {"timeout": timedelta(minutes=3)},
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_an_edit_keeps_a_follower_active_and_in_its_workflow(user, changes):
    upstream = task_create(owner=user, runner="noop", name="extract")
    follower = task_create(
        owner=user, runner="sleep", config={"duration": "1s"}, name="load", after=after((upstream, "success"))
    )
    edited = task_update(task=follower, actor="test", changes=changes)
    assert edited.status == TaskStatus.ACTIVE and edited.next_run_at is None
    materialise_due()  # a pass after the edit changes nothing either
    follower.refresh_from_db()
    assert follower.status == TaskStatus.ACTIVE
    root = _root_run(upstream)
    (step,) = _steps(follower)
    assert step.workflow_run == root


def test_a_patch_of_a_follower_answers_active_and_it_still_runs(api_client, user):
    upstream = task_create(owner=user, runner="noop", name="extract")
    follower = task_create(
        owner=user, runner="sleep", config={"duration": "1s"}, name="load", after=after((upstream, "success"))
    )
    for body in ({"config": {"duration": "2s"}}, {"priority": 7}):
        response = api_client.patch(f"/api/v1/tasks/{follower.pk}", body, format="json")
        assert response.status_code == 200, response.json()
        assert response.json()["status"] == "ACTIVE"
    _root_run(upstream)
    assert len(_steps(follower)) == 1


def test_every_later_run_of_an_edited_diamond_starts_all_its_steps(user):
    a = task_create(owner=user, runner="noop", name="a")
    b = task_create(owner=user, runner="sleep", config={"duration": "1s"}, name="b", after=after((a, "success")))
    c = task_create(owner=user, runner="noop", name="c", after=after((a, "success")))
    d = task_create(owner=user, runner="noop", name="d", after=after((b, "success"), (c, "success")))
    task_update(task=b, actor="test", changes={"config": {"duration": "2s"}})
    task_update(task=c, actor="test", changes={"priority": 7})
    task_update(task=d, actor="test", changes={"name": "load"})
    assert set(Task.objects.filter(pk__in=[b.pk, c.pk, d.pk]).values_list("status", flat=True)) == {"ACTIVE"}
    roots = []
    for _ in range(3):
        root = _root_run(a)
        roots.append(root)
        for step in (_steps(b)[-1], _steps(c)[-1]):
            assert step.workflow_run == root
            end(step.pk)
        assert _steps(d)[-1].workflow_run == root
    for task in (b, c, d):
        assert sorted(step.workflow_run for step in _steps(task)) == roots


def test_a_paused_then_resumed_follower_stays_active_and_runs(user):
    from tasks_api.lifecycle import task_pause

    upstream = task_create(owner=user, runner="noop")
    follower = task_create(owner=user, runner="noop", after=after((upstream, "success")))
    task_pause(task=follower, actor="test")
    assert task_resume(task=follower, actor="test").status == TaskStatus.ACTIVE
    _root_run(upstream)
    assert len(_steps(follower)) == 1


def test_a_follower_with_its_own_one_shot_keeps_following_after_it_ran(user):
    upstream = task_create(owner=user, runner="noop")
    follower = task_create(
        owner=user, runner="noop", start_at=timezone.now() + timedelta(seconds=1), after=after((upstream, "success"))
    )
    assert Execution.objects.filter(task=follower, origin=ExecutionOrigin.SCHEDULE).count() == 1
    follower.refresh_from_db()
    assert follower.status == TaskStatus.ACTIVE and follower.next_run_at is None
    _root_run(upstream)
    assert len(_steps(follower)) == 1


def test_bulk_create_keeps_followers_active_whatever_their_own_schedule(user):
    (upstream,) = task_bulk_create(owner=user, specs=[{"runner": "noop"}])
    plain, once = task_bulk_create(
        owner=user,
        specs=[
            {"runner": "noop", "after": after((upstream, "success"))},
            {"runner": "noop", "start_at": timezone.now(), "after": after((upstream, "success"))},
        ],
    )
    assert plain.status == once.status == TaskStatus.ACTIVE
    assert Task.objects.get(pk=once.pk).status == TaskStatus.ACTIVE


def test_a_one_shot_task_completed_by_an_edit_says_so_in_the_audit_log(user):
    task = task_create(owner=user, runner="noop", start_at=timezone.now() + timedelta(days=2))
    assert task.status == TaskStatus.ACTIVE
    edited = task_update(task=task, actor="test", changes={"start_at": timezone.now() - timedelta(days=1)})
    assert edited.status == TaskStatus.COMPLETED
    (entry,) = AuditEntry.objects.filter(task_id=task.pk, action="materialise")
    assert entry.changes == {"status": {"from": "ACTIVE", "to": "COMPLETED"}}
    assert "no further" in entry.detail


def test_the_materialiser_s_completion_of_a_task_is_audited(user):
    task = task_create(owner=user, runner="noop", start_at=timezone.now() + timedelta(days=2))
    materialise_task(task_id=task.pk, until=timezone.now() + timedelta(days=3))
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED
    assert AuditEntry.objects.filter(task_id=task.pk, action="materialise").count() == 1


def _wrongly_completed(user) -> tuple[Task, Task]:
    """A follower in the state the defect left it: COMPLETED, no cursor."""
    upstream = task_create(owner=user, runner="noop", name="extract")
    follower = task_create(owner=user, runner="noop", name="load", after=after((upstream, "success")))
    Task.objects.filter(pk=follower.pk).update(status=TaskStatus.COMPLETED)
    follower.refresh_from_db()
    return upstream, follower


def test_resume_brings_back_a_wrongly_completed_follower_and_audits_it(user):
    upstream, follower = _wrongly_completed(user)
    resumed = task_resume(task=follower, actor="test")
    assert resumed.status == TaskStatus.ACTIVE
    (entry,) = AuditEntry.objects.filter(task_id=follower.pk, action="resume")
    assert entry.changes == {"status": {"from": "COMPLETED", "to": "ACTIVE"}}
    _root_run(upstream)
    assert len(_steps(follower)) == 1


def test_patching_after_brings_back_a_wrongly_completed_follower(api_client, user):
    upstream, follower = _wrongly_completed(user)
    response = api_client.patch(
        f"/api/v1/tasks/{follower.pk}", {"after": after((upstream, "completion"))}, format="json"
    )
    assert response.status_code == 200 and response.json()["status"] == "ACTIVE"
    (entry,) = AuditEntry.objects.filter(task_id=follower.pk, action="update")
    assert entry.changes["status"] == {"from": "COMPLETED", "to": "ACTIVE"}
    _root_run(upstream)
    assert len(_steps(follower)) == 1


def test_the_migration_restores_wrongly_completed_followers(user):
    _, follower = _wrongly_completed(user)
    finished = task_create(owner=user, runner="noop", start_at=timezone.now() - timedelta(days=1))
    assert finished.status == TaskStatus.COMPLETED
    migration = importlib.import_module("tasks_app.migrations.0035_restore_completed_followers")
    from django.apps import apps

    migration.restore_followers(apps, None)
    follower.refresh_from_db()
    finished.refresh_from_db()
    assert follower.status == TaskStatus.ACTIVE and finished.status == TaskStatus.COMPLETED
    (entry,) = AuditEntry.objects.filter(task_id=follower.pk, action="update")
    assert entry.changes == {"status": {"from": "COMPLETED", "to": "ACTIVE"}} and entry.source == "system"


def _admin_form_data(form: Any) -> dict[str, Any]:
    from tests.tasks_api.test_admin import _form_data

    return _form_data(form)


def test_the_admin_change_form_keeps_a_follower_active(django_user_model, user):
    boss = django_user_model.objects.create_superuser(username="boss", password="boss-password")
    client = Client()
    client.force_login(boss)
    upstream = task_create(owner=user, runner="noop")
    follower = task_create(owner=user, runner="noop", after=after((upstream, "success")))
    url = f"/admin/tasks_app/task/{follower.pk}/change/"
    data = _admin_form_data(client.get(url).context["adminform"].form)
    data["priority"] = "7"
    response = client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    follower.refresh_from_db()
    assert follower.priority == 7 and follower.status == TaskStatus.ACTIVE


def test_the_back_office_edit_keeps_a_follower_active(client, user):
    client.force_login(user)
    upstream = task_create(owner=user, runner="noop")
    follower = task_create(owner=user, runner="noop", after=after((upstream, "success")))
    data = dict(client.get(f"/ui/tasks/{follower.pk}/edit/").context["form"].initial)
    data["priority"] = 7
    response = client.post(f"/ui/tasks/{follower.pk}/edit/", data)
    assert response.status_code == 302, response.context["form"].errors if response.context else ""
    follower.refresh_from_db()
    assert follower.priority == 7 and follower.status == TaskStatus.ACTIVE


# --- Issue 44, item 4: a follower's schedule is said as what runs it, not "Once" ---------------


def test_a_follower_s_description_says_after_what_it_runs(api_client, user, client):
    extract = task_create(owner=user, runner="noop", name="extract")
    check = task_create(owner=user, runner="noop", name="check")
    load = task_create(owner=user, runner="noop", name="load", after=after((extract, "success")))
    both = task_create(owner=user, runner="noop", name="both", after=after((extract, "success"), (check, "failure")))
    assert api_client.get(f"/api/v1/tasks/{load.pk}").json()["description"] == "After extract succeeds"
    assert api_client.get(f"/api/v1/tasks/{both.pk}").json()["description"] == (
        "After check fails for good and extract succeeds (same workflow run)"
    )
    listed = {row["id"]: row["description"] for row in api_client.get("/api/v1/tasks").json()["results"]}
    assert listed[str(load.pk)] == "After extract succeeds" and listed[str(extract.pk)] == "Once"
    client.force_login(user)
    page = client.get(f"/ui/tasks/{load.pk}/")
    assert page.context["schedule"] == "After extract succeeds"
    labels = [label for label, _ in page.context["settings_rows"]]
    assert "Start" not in labels and "Schedule" in labels
    rows = client.get("/ui/tasks/").context["rows"]
    assert {row["task"].pk: row["schedule"] for row in rows}[load.pk] == "After extract succeeds"


def test_a_follower_with_a_one_shot_still_to_come_is_described_by_it(user):
    from tasks_app.schedule_words import schedule_words

    upstream = task_create(owner=user, runner="noop", name="extract")
    later = task_create(
        owner=user, runner="noop", start_at=timezone.now() + timedelta(days=2), after=after((upstream, "success"))
    )
    assert schedule_words(later) == "Once"
