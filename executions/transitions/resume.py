"""Resume a paused workflow run: its hold back to active and, in the same transaction, under the
same lock, the steps its ends held back while it was paused (:mod:`.hold`); and a failed
workflow run's retry from its failed steps (:func:`workflow_run_retry`).

The held steps are those a step's end would have started: for each task's latest run in the
workflow run (a retry on request is its task's run now) that ended SUCCEEDED or FAILED, its
followers as :func:`~executions.transitions.follow.follow_ended` finds them (a fan-in once all its
upstreams ended as asked). Steps that exist already are not created again (the unique
``(task, workflow_run)``; only ends with a follower still missing are looked at).
"""

from __future__ import annotations

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q

from executions.models import Execution, WorkflowRunHold
from executions.models import ExecutionStatus as S
from executions.transitions.actions import execution_retry
from executions.transitions.follow import Ended, follow_ended, map_ends
from executions.transitions.hold import workflow_run_hold_set
from executions.transitions.sql import EXECUTIONS
from tasks_app.models import TaskDependency


def workflow_run_resume(*, workflow_run: int, actor: str, reason: str = "") -> list[int] | None:
    """PAUSED → ACTIVE for ``workflow_run``, and the steps held back created (their ids); None
    when it was not paused (nothing changed)."""
    with transaction.atomic():
        if not workflow_run_hold_set(
            workflow_run=workflow_run,
            hold=WorkflowRunHold.ACTIVE,
            sources=[WorkflowRunHold.PAUSED],
            actor=actor,
            reason=reason,
        ):
            return None
        return follow_ended(held_ends(workflow_run))


def held_ends(workflow_run: int) -> list[Ended]:
    """The ended latest runs of ``workflow_run`` that a follower's step may still be missing for."""
    runs = Q(workflow_run=workflow_run) | Q(pk=workflow_run, workflow_run__isnull=True)
    rows = list(
        Execution.objects.filter(runs, status__in=[S.SUCCEEDED, S.FAILED], map_index__isnull=True)
        .exclude(Exists(Execution.objects.filter(retry_of_id=OuterRef("pk"))))
        .order_by("id")
        .values_list("id", "task_id", "status", "workflow_run", "output", "error")
    )
    present = set(
        Execution.objects.filter(Q(workflow_run=workflow_run) | Q(pk=workflow_run)).values_list("task_id", flat=True)
    )
    # A map step's items are no ends of its task: the step's own end is (one that ended while paused).
    ends = [Ended(*row) for row in rows] + map_ends(workflow_run)
    followers: dict = {}
    links = TaskDependency.objects.filter(upstream_id__in={end.task_id for end in ends})
    for task_id, upstream_id in links.values_list("task_id", "upstream_id"):
        followers.setdefault(upstream_id, set()).add(task_id)
    return [end for end in ends if end.map_index is not None or followers.get(end.task_id, set()) - present]


def workflow_run_retry(
    *, workflow_run: int, execution_ids: list[int], actor: str, run_input: dict | None = None
) -> list[int | None]:
    """Retry the failed runs ``execution_ids`` of ``workflow_run`` within it (each as
    :func:`~executions.transitions.actions.execution_retry`, with ``run_input`` for its input
    when given); returns the new ids (None for one lost). A root that failed before starting any
    step is first marked as its own workflow run's (as its end would, had it started one), so its
    retry stays in it: what follows the retry's end starts in the same workflow run. Call in the
    caller's transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {EXECUTIONS} SET workflow_run = id WHERE id = %s AND workflow_run IS NULL",  # noqa: S608
            [workflow_run],
        )
    return [execution_retry(execution_id=pk, actor=actor, run_input=run_input) for pk in execution_ids]
