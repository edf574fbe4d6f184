"""A workflow run as a whole, read: its steps (a node per task), the links between them, and how
it stands (running, succeeded, failed, cancelled).

A workflow run is named by its root's execution id (``workflow_run`` of every step). Its tasks
are the root's task and every task that follows it, transitively (:class:`TaskDependency`, as
the links are now); each task's run in it is found through the unique index on
``(task, workflow_run)`` (``execution_workflow_step``), never by a scan of the executions. A task
not run (yet) is a node too: *waiting* while the run may still reach it, *skipped* once it cannot
(an upstream ended the other way, was cancelled, or its task is paused or deleted).

The writes are elsewhere (:mod:`executions.transitions.follow`); this module only reads, for the
back office's workflow run page, "why", and the notifications about workflow runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from executions.models import ACTIVE_STATUSES, Execution
from executions.models import ExecutionStatus as S
from executions.transitions.follow import SATISFIES
from tasks_app.models import DependencyOn, Task, TaskDependency, TaskStatus

#: A workflow run reads at most this many tasks (a guard: ``after`` allows wide graphs).
MAX_STEPS = 200

#: Retries on request of retries read, at most (a step retried more often shows its latest of these).
MAX_RETRY_ROUNDS = 10

#: The state of a task that has no run in the workflow run.
WAITING = "WAITING"  #: it may still run: what it follows has not all ended
SKIPPED = "SKIPPED"  #: it will not run in this workflow run


class RunState:
    """How a workflow run stands, as a whole."""

    RUNNING = "running"  #: a step is still to run or running
    SUCCEEDED = "succeeded"  #: every step ended, none failed unhandled, none cancelled
    FAILED = "failed"  #: nothing more runs, and a step failed with nothing following its failure
    CANCELLED = "cancelled"  #: nothing more runs, and a step was cancelled (none failed unhandled)


@dataclass
class Step:
    """One task of a workflow run: its run in it (the latest, a retry on request included)."""

    task: Task
    depth: int = 0
    execution: Execution | None = None
    #: Runs of the task in this workflow run (more than one: it was retried on request).
    runs: int = 0
    #: The run's status, or :data:`WAITING` / :data:`SKIPPED`.
    state: str = WAITING
    #: Why a task without a run waits or was skipped, in words.
    note: str = ""


@dataclass(frozen=True)
class Link:
    """``task`` follows ``upstream`` on ``on``; ``taken``: the upstream's run ended that way (None:
    not ended, or not run)."""

    upstream: uuid.UUID
    task: uuid.UUID
    on: str
    taken: bool | None


@dataclass
class WorkflowRun:
    root: Execution
    steps: dict[uuid.UUID, Step] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    state: str = RunState.RUNNING
    #: Failed steps nothing follows on failure (what made the run fail).
    unhandled: list[Execution] = field(default_factory=list)
    #: Failed steps whose failure was followed: each with the tasks that follow it on failure.
    handled: list[tuple[Execution, list[Task]]] = field(default_factory=list)

    @property
    def state_words(self) -> str:
        """How the run stands, in words: its state, and for a run that succeeded though a step
        failed, which failed and what handled it ("succeeded; extract failed, handled by alert")."""
        if self.state != RunState.SUCCEEDED or not self.handled:
            return self.state
        return f"{self.state}; {self.handled_words}"

    @property
    def handled_words(self) -> str:
        """The failed steps whose failure was followed, in words ("" if none)."""
        return "; ".join(
            f"{execution.task} failed, handled by {', '.join(str(task) for task in handlers)}"
            for execution, handlers in self.handled
        )

    def link_words(self, link: Link) -> str:
        """Whether ``link`` was followed, in words, as it stands with the rest of the run: "taken"
        only when its step ran; an end that met it while the step will not run (a fan-in whose
        other upstream failed) says so; "not yet" only while the run goes on."""
        follower, upstream = self.steps[link.task], self.steps[link.upstream]
        if link.taken:
            if follower.execution is not None:
                return "taken"
            if follower.state == SKIPPED:
                return f"met, but {follower.task} will not run" + (f" ({follower.note})" if follower.note else "")
            return f"met; {follower.task} waits for the others"
        if link.taken is False:
            return "not taken"
        if self.state == RunState.RUNNING:
            return "not yet"
        if upstream.execution is not None and upstream.execution.status == S.CANCELLED:
            return f"not taken: {upstream.task} was cancelled"
        return f"not taken: {upstream.task} did not run"

    @property
    def id(self) -> int:
        return int(self.root.workflow_run or self.root.pk)

    def ordered(self) -> list[Step]:
        """Steps by depth, then task name: the order pages list them in."""
        return sorted(self.steps.values(), key=lambda s: (s.depth, str(s.task).lower(), str(s.task.pk)))


def workflow_tasks(root_task_id: uuid.UUID) -> tuple[list[uuid.UUID], list[tuple[uuid.UUID, uuid.UUID, str]]]:
    """The tasks reached from ``root_task_id`` by following ``after`` downstream (the root first),
    and the links among them ``(follower, upstream, on)``; one query per level."""
    seen = [root_task_id]
    frontier = {root_task_id}
    while frontier and len(seen) < MAX_STEPS:
        step = TaskDependency.objects.filter(upstream_id__in=frontier).values_list("task_id", flat=True)
        frontier = set(step) - set(seen)
        seen += sorted(frontier, key=str)[: MAX_STEPS - len(seen)]
    links = list(
        TaskDependency.objects.filter(task_id__in=seen, upstream_id__in=seen)
        .order_by("task_id", "upstream_id")
        .values_list("task_id", "upstream_id", "on")
    )
    return seen, links


def workflow_run_read(root: Execution) -> WorkflowRun:
    """The workflow run whose root is ``root`` (an execution that started one, or may: a root
    still running shows the steps that will follow it). See the module's description."""
    run = WorkflowRun(root)
    task_ids, links = workflow_tasks(root.task_id)
    tasks = Task.objects.in_bulk(task_ids)
    executions: list[Execution] = [root]
    if root.workflow_run is not None:
        # Each task's first run in the run through the unique (task, workflow_run) index, then
        # the retries on request of those, round by round, through the unique index on retry_of.
        executions += list(
            Execution.objects.filter(task_id__in=task_ids[1:], workflow_run=run.id, retry_of__isnull=True).order_by(
                "id"
            )
        )
        frontier = [execution.pk for execution in executions]
        for _ in range(MAX_RETRY_ROUNDS):
            retries = list(Execution.objects.filter(retry_of_id__in=frontier, workflow_run=run.id).order_by("id"))
            if not retries:
                break
            executions += retries
            frontier = [execution.pk for execution in retries]
        executions.sort(key=lambda execution: execution.pk)
    for task_id in task_ids:
        if task_id in tasks:
            run.steps[task_id] = Step(tasks[task_id])
    for execution in executions:  # latest last: a retry on request is the step's run now
        step = run.steps.get(execution.task_id)
        if step is None:
            continue
        step.execution, step.runs, step.state = execution, step.runs + 1, execution.status
    _depths(run, links)
    for follower, upstream, on in links:
        if follower in run.steps and upstream in run.steps:
            ran = run.steps[upstream].execution
            ended = ran is not None and ran.status in SATISFIES
            taken = (on in SATISFIES[ran.status]) if ended and ran is not None else None
            run.links.append(Link(upstream, follower, on, taken))
    _unrun(run)
    _standing(run)
    return run


def _depths(run: WorkflowRun, links: Iterable[tuple[uuid.UUID, uuid.UUID, str]]) -> None:
    """Each step's depth: the longest chain of links from the root (links form no cycle)."""
    pairs = [(upstream, follower) for follower, upstream, _ in links]
    for _ in range(len(run.steps)):
        changed = False
        for upstream, follower in pairs:
            if upstream in run.steps and follower in run.steps:
                depth = run.steps[upstream].depth + 1
                if depth > run.steps[follower].depth:
                    run.steps[follower].depth, changed = depth, True
        if not changed:
            break


def _unrun(run: WorkflowRun) -> None:
    """Waiting or skipped, for each step without a run, in depth order (an upstream first)."""
    incoming: dict[uuid.UUID, list[Link]] = {}
    for link in run.links:
        incoming.setdefault(link.task, []).append(link)
    for step in run.ordered():
        if step.execution is not None:
            continue
        if step.task.status != TaskStatus.ACTIVE:
            step.state, step.note = SKIPPED, f"its task is {step.task.status.lower()}"
            continue
        for link in incoming.get(step.task.pk, []):
            upstream = run.steps[link.upstream]
            if upstream.state == SKIPPED:
                step.state, step.note = SKIPPED, f"{upstream.task} does not run"
                break
            if upstream.state == S.CANCELLED:
                step.state, step.note = SKIPPED, f"{upstream.task} was cancelled"
                break
            if link.taken is False:
                step.state = SKIPPED
                step.note = f"{upstream.task} {upstream.state.lower()}; it runs on {link.on}"
                break
        else:
            waits = sorted(str(run.steps[link.upstream].task) for link in incoming.get(step.task.pk, []))
            step.note = f"after {', '.join(waits)}" if waits else ""


def _standing(run: WorkflowRun) -> None:
    handled = {link.upstream for link in run.links if link.on != DependencyOn.SUCCESS and link.taken}
    handled |= {
        link.upstream
        for link in run.links
        if link.on != DependencyOn.SUCCESS and run.steps[link.task].task.status == TaskStatus.ACTIVE
    }
    ran = [step.execution for step in run.steps.values() if step.execution is not None]
    run.unhandled = sorted((e for e in ran if e.status == S.FAILED and e.task_id not in handled), key=lambda e: e.pk)
    run.handled = [
        (
            e,
            sorted(
                (
                    run.steps[link.task].task
                    for link in run.links
                    if link.upstream == e.task_id and link.on != DependencyOn.SUCCESS
                ),
                key=lambda task: str(task).lower(),
            ),
        )
        for e in sorted(ran, key=lambda e: e.pk)
        if e.status == S.FAILED and e.task_id in handled
    ]
    if any(e.status in ACTIVE_STATUSES for e in ran):
        run.state = RunState.RUNNING
        return
    for step in run.steps.values():  # nothing runs any more: what still waits never will
        if step.state == WAITING:
            step.state, step.note = SKIPPED, (step.note + "; nothing more runs").lstrip("; ")
    if run.unhandled:
        run.state = RunState.FAILED
    elif any(e.status == S.CANCELLED for e in ran):
        run.state = RunState.CANCELLED
    else:
        run.state = RunState.SUCCEEDED


def upstream_runs(execution: Execution) -> list[Execution]:
    """The runs a workflow step followed (its ``upstream``), in id order."""
    ids = [int(pk) for pk in (execution.upstream or []) if isinstance(pk, int | str) and str(pk).isdigit()]
    if not ids:
        return []
    return list(Execution.objects.filter(pk__in=ids).select_related("task").order_by("id"))


def dependency_on(task_id: uuid.UUID, upstream_ids: Iterable[uuid.UUID]) -> Mapping[uuid.UUID, str]:
    """How ``task_id`` follows each of ``upstream_ids`` (its ``after`` entries' ``on``)."""
    return dict(
        TaskDependency.objects.filter(task_id=task_id, upstream_id__in=list(upstream_ids)).values_list(
            "upstream_id", "on"
        )
    )
