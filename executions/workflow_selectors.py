"""Workflows and workflow runs as objects, read (issue 48): the API's ``/api/v1/workflows`` and
``/api/v1/workflow-runs``.

A **workflow** is a task and the tasks reached from it by ``after`` (its followers, theirs, ...),
with the links between them: a graph of nodes and edges, derived from the links as they are now.
The list names each *root* (a task that others follow and that follows none); any task may be read
as the root of the workflow below it.

A **workflow run** is a run of a task that others follow, started otherwise than as a step (a
schedule, a trigger, a replay): its id is that execution's (the steps' ``workflow_run``). Its state
is computed in SQL, so a list can be filtered by it and read in a constant number of queries,
with the rules of :func:`executions.workflow_runs.workflow_run_read` (the page's), over each task's
latest run in it (a retry on request replaces the run it retries):

* ``cancelled`` when a user cancelled it (:class:`~executions.models.WorkflowRunControl`), else
  ``paused`` while paused; else
* ``running`` while a run of it is SCHEDULED, PENDING or RUNNING;
* ``failed`` when a step failed for good and nothing follows its task on ``failure`` or
  ``completion`` (an unhandled failure);
* ``cancelled`` when a step was cancelled; else ``succeeded``.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from executions.models import ACTIVE_STATUSES, Execution, WorkflowMap, WorkflowRunControl, WorkflowRunHold
from executions.models import ExecutionStatus as S
from executions.workflow_runs import MAX_STEPS
from tasks_app.models import DependencyOn, Task, TaskDependency, TaskStatus


class RunState:
    """A workflow run's state as the API shows it (:mod:`executions.workflow_runs` and a hold)."""

    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ALL = ("running", "paused", "succeeded", "failed", "cancelled")


#: The states as choices (the API's enum, ``WorkflowRunStateEnum``).
RUN_STATE_CHOICES = [(state, state) for state in RunState.ALL]


# -- Workflows: graphs of tasks ---------------------------------------------------------------


@dataclass
class Workflow:
    """A root task, the tasks reached from it and the links among them."""

    root: Task
    nodes: list[tuple[Task, int]] = field(default_factory=list)  #: each task and its depth
    edges: list[tuple[uuid.UUID, uuid.UUID, str]] = field(default_factory=list)  #: (upstream, task, on)


def workflow_roots(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """Of ``tasks``, the roots of workflows: followed by a task, following none; deleted left out."""
    return (
        tasks.exclude(status=TaskStatus.DELETED)
        .filter(Exists(TaskDependency.objects.filter(upstream_id=OuterRef("pk"))))
        .exclude(Exists(TaskDependency.objects.filter(task_id=OuterRef("pk"))))
    )


def workflows_read(roots: Sequence[Task]) -> list[Workflow]:
    """The workflow of each of ``roots``, in three queries whatever their number: the links of
    their teams' tasks, then the tasks reached (a workflow lies within one team)."""
    teams = {root.team_id for root in roots}
    links: defaultdict[uuid.UUID, list[tuple[uuid.UUID, str]]] = defaultdict(list)  # upstream -> (task, on)
    if teams:
        for task_id, upstream_id, on in (
            TaskDependency.objects.filter(task__team_id__in=teams)
            .order_by("task_id", "upstream_id")
            .values_list("task_id", "upstream_id", "on")
        ):
            links[upstream_id].append((task_id, on))
    reached: dict[uuid.UUID, dict[uuid.UUID, int]] = {}
    for root in roots:
        depths = {root.pk: 0}
        for _ in range(MAX_STEPS):  # the longest chain first sets each depth (links form no cycle)
            changed = False
            for upstream, depth in list(depths.items()):
                for task_id, _on in links.get(upstream, []):
                    if depths.get(task_id, -1) < depth + 1 and (task_id in depths or len(depths) < MAX_STEPS):
                        depths[task_id], changed = depth + 1, True
            if not changed:
                break
        reached[root.pk] = depths
    tasks = Task.objects.in_bulk({task_id for depths in reached.values() for task_id in depths})
    workflows = []
    for root in roots:
        depths = reached[root.pk]
        flow = Workflow(root)
        flow.nodes = sorted(
            ((tasks[task_id], depth) for task_id, depth in depths.items() if task_id in tasks),
            key=lambda node: (node[1], str(node[0]).lower(), str(node[0].pk)),
        )
        flow.edges = sorted(
            (upstream, task_id, on)
            for upstream in depths
            for task_id, on in links.get(upstream, [])
            if task_id in depths and task_id in tasks and upstream in tasks
        )
        workflows.append(flow)
    return workflows


# -- Workflow runs -----------------------------------------------------------------------------


def _latest(queryset: QuerySet[Execution]) -> QuerySet[Execution]:
    """Runs not retried on request (each task's latest in its workflow run)."""
    return queryset.exclude(Exists(Execution.objects.filter(retry_of_id=OuterRef("pk"))))


def _steps_of_outer() -> QuerySet[Execution]:
    """The runs of the workflow run of the outer row (its root): its steps, and the root itself
    (whose ``workflow_run`` is written when its end starts a step)."""
    return Execution.objects.filter(Q(workflow_run=OuterRef("pk")) | Q(pk=OuterRef("pk")))


def _unhandled() -> Q:
    """A failure nothing follows: no task follows the run's task on failure or completion."""
    return ~Q(Exists(TaskDependency.objects.filter(upstream_id=OuterRef("task_id")).exclude(on=DependencyOn.SUCCESS)))


def workflow_runs_annotated(executions: QuerySet[Execution]) -> QuerySet[Execution]:
    """The workflow runs among ``executions`` (see the module), each annotated with ``state``,
    ``hold`` (and its ``hold_reason``), ``step_count`` and ``ended_at`` (its latest end), in one query."""
    followed = TaskDependency.objects.filter(upstream_id=OuterRef("task_id"))
    steps = _steps_of_outer()
    hold = WorkflowRunControl.objects.filter(workflow_run=OuterRef("pk"))
    counted = (
        Execution.objects.filter(workflow_run=OuterRef("pk"), retry_of__isnull=True).order_by().values("workflow_run")
    )
    return (
        executions.filter(Exists(followed))
        .filter(Q(workflow_run__isnull=True) | Q(workflow_run=F("pk")))
        .annotate(
            hold=Coalesce(Subquery(hold.values("hold")[:1]), Value(WorkflowRunHold.ACTIVE)),
            hold_reason=Coalesce(Subquery(hold.values("reason")[:1]), Value("")),
            step_count=Coalesce(Subquery(counted.annotate(n=Count("id")).values("n")[:1]), Value(1)),
            ended_at=Subquery(counted.annotate(m=Max("finished_at")).values("m")[:1]),
            state=Case(
                When(hold=WorkflowRunHold.CANCELLED, then=Value(RunState.CANCELLED)),
                When(hold=WorkflowRunHold.PAUSED, then=Value(RunState.PAUSED)),
                When(Exists(steps.filter(status__in=ACTIVE_STATUSES)), then=Value(RunState.RUNNING)),
                When(Exists(_latest(steps.filter(status=S.FAILED)).filter(_unhandled())), then=Value(RunState.FAILED)),
                # A map step that failed without an item (no list to read) has its record only.
                When(
                    Exists(
                        WorkflowMap.objects.filter(workflow_run=OuterRef("pk"), status=S.FAILED).filter(_unhandled())
                    ),
                    then=Value(RunState.FAILED),
                ),
                When(Exists(_latest(steps.filter(status=S.CANCELLED))), then=Value(RunState.CANCELLED)),
                default=Value(RunState.SUCCEEDED),
            ),
        )
    )


def workflow_run_state(state: str, hold: str) -> str:
    """The API's state of a run read by :func:`executions.workflow_runs.workflow_run_read` (its
    ``state``) under ``hold``."""
    if hold == WorkflowRunHold.CANCELLED:
        return RunState.CANCELLED
    if hold == WorkflowRunHold.PAUSED:
        return RunState.PAUSED
    return state


def workflow_run_hold(workflow_run: int) -> WorkflowRunControl | None:
    """The hold row of ``workflow_run`` (None: never paused nor cancelled)."""
    return WorkflowRunControl.objects.filter(workflow_run=workflow_run).first()


def workflow_run_root(visible: QuerySet[Execution], workflow_run: Any) -> Execution | None:
    """The root of workflow run ``workflow_run`` among ``visible`` executions (None: no such run,
    or not one of the user's)."""
    return workflow_runs_annotated(visible).select_related("task").filter(pk=workflow_run).first()


def failed_steps(root: Execution) -> list[Execution]:
    """The latest runs of the workflow run of ``root`` that failed for good with nothing to follow
    their failure (what made it fail: a workflow run's retry runs them again)."""
    runs = Q(workflow_run=root.pk) | Q(pk=root.pk)
    return list(_latest(Execution.objects.filter(runs, status=S.FAILED)).filter(_unhandled()).order_by("id"))


def hold_words(hold: str, reason: str) -> str:
    """A run's hold, in words ("" while active)."""
    return "" if hold == WorkflowRunHold.ACTIVE else (reason or hold)
