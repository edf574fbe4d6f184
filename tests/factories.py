from __future__ import annotations

from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from tasks_app.models import Task


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")


class TaskFactory(factory.django.DjangoModelFactory):
    """A task row without executions; use ``tasks_app.services.task_create`` to materialise."""

    class Meta:
        model = Task

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"task {n}")
    runner = "noop"
    config = factory.LazyFunction(dict)
    start_at = factory.LazyFunction(timezone.now)
    next_run_at = factory.SelfAttribute("start_at")
    timeout = timedelta(seconds=60)
