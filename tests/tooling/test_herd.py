"""The herd scenario's accounting: a run that never started is lost, a second start is a duplicate."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model

from executions.models import Execution, ExecutionEvent
from tasks_app.models import Task
from tms_core.clock import db_now
from tooling.harness.fill import insert_tasks
from tooling.harness.herd import herd_account

pytestmark = pytest.mark.django_db


def test_herd_account_counts_lost_and_duplicated_starts():
    owner = get_user_model().objects.create(username="herd-owner")
    due = db_now().replace(microsecond=0) - timedelta(minutes=1)
    insert_tasks(
        owner_id=owner.pk,
        count=5,
        columns={"cron": "'* * * * *'", "start_at": "%(due)s", "next_run_at": "%(due)s", "max_runs": "1"},
        params={"due": due},
    )
    tasks = list(Task.objects.filter(owner=owner).order_by("id"))
    started = due + timedelta(milliseconds=250)
    # Task 0: started once. Task 1: started twice (a duplicate). Task 2: its run never started.
    # Task 3: no run at all. Task 4: started once, a second late.
    plan = [
        (tasks[0], 1, started),
        (tasks[1], 2, started),
        (tasks[2], 0, None),
        (tasks[4], 1, due + timedelta(seconds=1)),
    ]
    for task, starts, started_at in plan:
        execution = Execution.objects.create(
            task=task,
            owner_id=owner.pk,
            team_id=task.team_id,
            scheduled_for=due,
            due_at=due,
            status="SUCCEEDED" if starts else "PENDING",
            started_at=started_at,
        )
        ExecutionEvent.objects.bulk_create(
            [ExecutionEvent(execution=execution, from_status="PENDING", to_status="RUNNING", attempt=1, actor="w")]
            * starts
        )
    # A run of another minute is not the herd's.
    Execution.objects.create(
        task=tasks[3],
        owner_id=owner.pk,
        team_id=tasks[3].team_id,
        scheduled_for=due + timedelta(minutes=1),
        due_at=due,
        status="PENDING",
    )

    account = herd_account(owner_id=owner.pk, due=due)

    assert account.expected == 5
    assert account.started == 3
    assert account.lost == 2
    assert account.duplicated == 1
    assert sorted(account.lateness_s) == [0.25, 0.25, 1.0]
    assert account.last_start_s == 1.0
