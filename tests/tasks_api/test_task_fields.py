"""Task fields are declared once (issue 29): tasks_app.fields.TASK_FIELDS, and the serializers,
the update service, the audit snapshot and the admin's groups follow from it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.utils import flatten_fieldsets
from django.db import models

from tasks_api.admin import TaskAdmin
from tasks_api.creation import task_create
from tasks_api.editing import RUN_FIELDS, SCHEDULE_FIELDS, task_update
from tasks_api.serializers import TaskCreateSerializer, TaskSerializer, TaskUpdateSerializer, read_fields
from tasks_app import fields as task_fields
from tasks_app.models import AuditAction, AuditEntry, Limit, Task, TaskDependency
from tms_core.errors import InvalidInput


def _model_fields(model: type[models.Model]) -> list[str]:
    # ``after`` is the reverse side of TaskDependency.task (a link with its own ``on``), which a
    # task's settings write as a list, like a many-to-many.
    return [
        field.name
        for field in model._meta.get_fields()
        if field.concrete
        or field.many_to_many
        or (isinstance(field, models.ManyToOneRel) and field.field == TaskDependency._meta.get_field("task"))
    ]


def undeclared(have: list[str]) -> list[str]:
    """The model fields in ``have`` that :data:`TASK_FIELDS` does not place, the declared names
    the model lacks, and any name declared twice."""
    declared = [field.name for field in task_fields.TASK_FIELDS]
    return sorted(set(have) ^ set(declared)) + sorted({name for name in declared if declared.count(name) > 1})


def test_every_field_of_the_task_model_is_declared_once():
    assert undeclared(_model_fields(Task)) == []


def test_a_model_field_added_without_a_place_fails_the_check():
    """What the check above says when someone adds a field to Task and decides nothing (a
    field name added to the model's list: a real model class would stay registered for the run)."""
    assert undeclared([*_model_fields(Task), "reminder"]) == ["reminder"]


def test_each_place_is_where_the_declaration_puts_it():
    settings = set(task_fields.SETTINGS)
    assert set(TaskCreateSerializer().fields) == settings, "the create API takes every setting"
    assert set(TaskUpdateSerializer().fields) == settings
    # The team changes by a move (tasks_api.moving.task_move), not by a partial update's setattr.
    assert settings - {"artifact", "team"} == task_fields.UPDATABLE_FIELDS
    assert SCHEDULE_FIELDS | RUN_FIELDS <= task_fields.UPDATABLE_FIELDS
    shown = set(task_fields.names(shown=True)) - {"next_run_at"}
    assert shown <= set(TaskSerializer().fields) == set(read_fields())
    # The admin's add page shows every setting, in its groups, and the owner.
    add_page = flatten_fieldsets(TaskAdmin(Task, None).get_fieldsets(None))  # type: ignore[arg-type]
    assert sorted(add_page) == sorted(["owner", *task_fields.SETTINGS])
    # Every setting is audited; of the scheduler's own fields only the status is.
    audited = set(task_fields.names(audited=True))
    assert audited == settings | {"status"}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"interval": timedelta(minutes=1), "cron": "* * * * *"}, "cron"),
        ({"interval": timedelta(seconds=30), "jitter": timedelta(minutes=1)}, "jitter"),
        ({"retry_backoff": timedelta(minutes=5), "retry_backoff_max": timedelta(minutes=1)}, "retry_backoff_max"),
        ({"max_age": timedelta(seconds=1), "jitter": timedelta(seconds=5)}, "max_age"),
    ],
)
def test_the_services_apply_the_cross_field_rules_without_the_api(user, changes, field):
    """The admin and the pages reach the same rules through the services, not only through DRF."""
    with pytest.raises(InvalidInput) as refused:
        task_create(owner=user, runner="noop", **changes)
    assert field in refused.value.errors
    task = task_create(owner=user, runner="noop", start_at=None, interval=timedelta(minutes=10))
    with pytest.raises(InvalidInput) as refused:
        task_update(task=task, actor="test", changes={"cron": "", **changes})
    assert field in refused.value.errors


def test_a_created_task_s_audit_entry_names_its_limits(user):
    Limit.objects.create(owner=user, name="api", max_concurrency=2)
    task = task_create(owner=user, runner="noop", limits=["api"])
    entry = AuditEntry.objects.get(task_id=task.pk, action=AuditAction.CREATE)
    assert entry.changes["limits"] == {"from": None, "to": ["api"]}
    assert set(entry.changes) <= set(task_fields.names(audited=True))
