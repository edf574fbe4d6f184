from __future__ import annotations

from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from executions import transitions
from executions.models import Execution, ExecutionStatus
from tasks_app.models import Task
from tasks_app.teams.services import personal_team_of


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")


class TaskFactory(factory.django.DjangoModelFactory):
    """A task row without executions; use ``tasks_api.creation.task_create`` to materialise."""

    class Meta:
        model = Task

    owner = factory.SubFactory(UserFactory)
    team = factory.LazyAttribute(lambda task: personal_team_of(task.owner))
    name = factory.Sequence(lambda n: f"task {n}")
    runner = "noop"
    config = factory.LazyFunction(dict)
    start_at = factory.LazyFunction(timezone.now)
    next_run_at = factory.SelfAttribute("start_at")
    timeout = timedelta(seconds=60)


class ExecutionFactory(factory.django.DjangoModelFactory):
    """An execution created the way the platform creates them (through ``transitions``), then put
    into the requested state for the test (``status`` and any other field)."""

    class Meta:
        model = Execution

    task = factory.SubFactory(TaskFactory)
    scheduled_for = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))
    status = ExecutionStatus.SCHEDULED

    @classmethod
    def _create(cls, model_class: type[Execution], *args: object, **kwargs: object) -> Execution:
        task: Task = kwargs.pop("task")  # type: ignore[assignment]
        scheduled_for = kwargs.pop("scheduled_for")
        (pk,) = transitions.executions_create(
            rows=[transitions.NewExecution(task.pk, scheduled_for, task.priority)],
            actor="factory",  # type: ignore[arg-type]
        )
        Execution.objects.filter(pk=pk).update(**kwargs)
        return Execution.objects.get(pk=pk)
