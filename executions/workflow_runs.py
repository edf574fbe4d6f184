"""A workflow run as a whole, read: its steps (a node per task), the links between them, and how
it stands (running, succeeded, failed, cancelled).

A workflow run is named by its root's execution id (``workflow_run`` of every step). Its tasks
are the root's task and every task that follows it, transitively (:class:`TaskDependency`, as
the links are now); each task's run in it is found through the unique index on
``(task, workflow_run)`` (``execution_workflow_step``), never by a scan of the executions. A task
not run (yet) is a node too: *waiting* while the run may still reach it, *skipped* once it cannot:
recorded so by the end that decided it (:class:`~executions.models.WorkflowSkip`, with its
reason: its join rule, a condition, a skipped upstream, its task paused), or read so here (an
upstream cancelled, its task paused since, or nothing runs any more).

The writes are elsewhere (:mod:`executions.transitions.follow`); this module only reads, for the
back office's workflow run page, "why", and the notifications about workflow runs.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import Q

from executions.models import ACTIVE_STATUSES, Execution, WorkflowMap, WorkflowSkip
from executions.models import ExecutionStatus as S
from executions.transitions.follow import SATISFIES, input_from
from tasks_app.models import DependencyOn, JoinRule, Task, TaskDependency, TaskStatus
from tasks_app.workflow_rules import Upstream, condition_holds, condition_words, join_decide

#: Joins under which a step runs on an upstream's failure whatever its link's ``on``.
FAILURE_JOINS = frozenset({JoinRule.ALL_DONE, JoinRule.ONE_FAILED})

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
    #: A map step's: how many items its list has (None: no map step), and its items' latest runs
    #: counted by status (the items not started yet are not counted).
    map_total: int | None = None
    items: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Link:
    """``task`` follows ``upstream`` on ``on`` (and ``condition``); ``taken``: the upstream's run
    ended that way and the condition held (None: not ended, or not run)."""

    upstream: uuid.UUID
    task: uuid.UUID
    on: str
    taken: bool | None
    condition: Any = None

    @property
    def label(self) -> str:
        """Its ``on``, with its condition in words if it has one: what an arrow is labelled."""
        return f"{self.on} if {condition_words(self.condition)}" if self.condition else self.on


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
            ran = upstream.execution
            if link.condition and ran is not None and link.on in SATISFIES.get(ran.status, ()):
                return f"not taken: the condition ({condition_words(link.condition)}) is false"
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
            Execution.objects.filter(
                task_id__in=task_ids[1:], workflow_run=run.id, retry_of__isnull=True, map_index__isnull=True
            ).order_by("id")
        )
        frontier = [execution.pk for execution in executions]
        for _ in range(MAX_RETRY_ROUNDS):
            items = Q(map_index__isnull=False)
            retries = list(
                Execution.objects.filter(retry_of_id__in=frontier, workflow_run=run.id).exclude(items).order_by("id")
            )
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
    if root.workflow_run is not None:
        _maps(run)
    _depths(run, links)
    conditions = _conditions(run, links)
    for follower, upstream, on in links:
        if follower in run.steps and upstream in run.steps:
            ran = run.steps[upstream].execution
            ended = ran is not None and ran.status in SATISFIES
            condition = conditions.get((follower, upstream))
            taken = None
            if ended and ran is not None:
                taken = on in SATISFIES[ran.status] and condition_holds(condition, input_from(_ended_of(ran)))
            run.links.append(Link(upstream, follower, on, taken, condition))
    if root.workflow_run is not None:
        skips = WorkflowSkip.objects.filter(workflow_run=run.id, task_id__in=list(run.steps)).values_list(
            "task_id", "reason"
        )
        for task_id, reason in skips:
            step = run.steps[task_id]
            if step.execution is None:  # a run created later (a retry upstream) takes precedence
                step.state, step.note = SKIPPED, reason
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


def _conditions(
    run: WorkflowRun, links: Iterable[tuple[uuid.UUID, uuid.UUID, str]]
) -> dict[tuple[uuid.UUID, uuid.UUID], Any]:
    """The conditions of ``links`` that have one, by (follower, upstream); one query (none without links)."""
    followers = {follower for follower, _, _ in links if follower in run.steps}
    if not followers:
        return {}
    rows = TaskDependency.objects.filter(task_id__in=followers, condition__isnull=False).values_list(
        "task_id", "upstream_id", "condition"
    )
    return {(task, upstream): condition for task, upstream, condition in rows}


def _ended_of(execution: Execution) -> dict[str, Any]:
    ended = {"output": execution.output, "error": execution.error, "status": execution.status}
    result = getattr(execution, "map_result", None)  # a map step's: its items' documents
    return ended | {"items": result} if result is not None else ended


def _maps(run: WorkflowRun) -> None:
    """The map steps of ``run`` (:class:`~executions.models.WorkflowMap`): each stands as its record
    says (running while its items run, then SUCCEEDED or FAILED as a whole), its items counted by
    their latest runs' status; its ``execution`` is the run whose end ended it (an item's; the
    upstream's for a step that ended without items), else its latest item, shown with the step's
    status and result. Three queries whatever the number of items, none without a map step."""
    records = list(WorkflowMap.objects.filter(workflow_run=run.id, task_id__in=list(run.steps)))
    if not records:
        return
    counts: dict[uuid.UUID, dict[str, int]] = {}
    last: dict[uuid.UUID, int] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT task_id, status, count(*), max(id) FROM (SELECT DISTINCT ON (task_id, map_index)"  # noqa: S608
            f" task_id, map_index, status, id FROM {Execution._meta.db_table}"
            " WHERE workflow_run = %s AND map_index IS NOT NULL AND task_id = ANY(%s::uuid[])"
            " ORDER BY task_id, map_index, id DESC) latest GROUP BY 1, 2",
            [run.id, [str(record.task_id) for record in records]],
        )
        for task_id, status, count, newest in cursor.fetchall():
            task = task_id if isinstance(task_id, uuid.UUID) else uuid.UUID(str(task_id))
            counts.setdefault(task, {})[status] = int(count)
            last[task] = max(last.get(task, 0), int(newest))
    shown_ids = {record.ended_by if record.status else last.get(record.task_id) for record in records}
    runs = Execution.objects.in_bulk([pk for pk in shown_ids if pk is not None])
    for record in records:
        step = run.steps[record.task_id]
        step.map_total, step.items = len(record.items or []), counts.get(record.task_id, {})
        base = runs.get((record.ended_by if record.status else last.get(record.task_id)) or 0)
        shown = copy.copy(base) if base is not None else Execution(workflow_run=run.id, attempt=1, team_id=0)
        shown.task = step.task
        status = record.status
        if not status:
            started = sum(step.items.values())
            active = any(state in ACTIVE_STATUSES for state in step.items)
            status = S.CANCELLED if step.items.get(S.CANCELLED) and not active else S.RUNNING
            shown.finished_at = None
            step.note = f"{started} of {step.map_total} items started"
        elif record.error:
            step.note = record.error
        shown.status, shown.output, shown.error, shown.input = status, "", record.error, None
        shown.map_result = record.result  # type: ignore[attr-defined]
        step.execution, step.state, step.runs = shown, status, sum(step.items.values())


def _unrun(run: WorkflowRun) -> None:
    """Waiting or skipped, for each step without a run (nor a skip recorded), in depth order (an
    upstream first): its join rule over how its upstreams stand."""
    incoming: dict[uuid.UUID, list[Link]] = {}
    for link in run.links:
        incoming.setdefault(link.task, []).append(link)
    for step in run.ordered():
        if step.execution is not None or step.state == SKIPPED:
            continue
        if step.task.status != TaskStatus.ACTIVE:
            step.state, step.note = SKIPPED, f"its task is {step.task.status.lower()}"
            continue
        links = incoming.get(step.task.pk, [])
        upstreams = []
        for link in links:
            upstream = run.steps[link.upstream]
            ran = upstream.execution
            if upstream.state == SKIPPED:
                state, document = "skipped", None
            elif ran is not None and ran.status in SATISFIES:
                state, document = ran.status, input_from(_ended_of(ran))
            else:
                state, document = "pending", None
            upstreams.append(Upstream(link.upstream, str(upstream.task), link.on, link.condition, state, document))
        decision = join_decide(step.task.join, upstreams) if upstreams else None
        cancelled = [link for link in links if run.steps[link.upstream].state == S.CANCELLED]
        if decision is not None and decision.skip:
            step.state, step.note = SKIPPED, decision.reason
        elif cancelled and not (decision is not None and decision.run):
            step.state, step.note = SKIPPED, f"{run.steps[cancelled[0].upstream].task} was cancelled"
        else:
            waits = sorted(str(run.steps[link.upstream].task) for link in links)
            step.note = f"after {', '.join(waits)}" if waits else ""


def _handles_failure(run: WorkflowRun, link: Link) -> bool:
    """Whether ``link``'s follower may run on its upstream's failure (its ``on``, or its join)."""
    return link.on != DependencyOn.SUCCESS or run.steps[link.task].task.join in FAILURE_JOINS


def _standing(run: WorkflowRun) -> None:
    handled = {link.upstream for link in run.links if _handles_failure(run, link) and link.taken}
    handled |= {
        link.upstream
        for link in run.links
        if _handles_failure(run, link) and run.steps[link.task].task.status == TaskStatus.ACTIVE
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
                    if link.upstream == e.task_id and _handles_failure(run, link)
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
    """How ``task_id`` follows each of ``upstream_ids`` (its ``after`` entries' ``on``, with the
    entry's condition in words when it has one: ``success if $.rows > 0``)."""
    rows = TaskDependency.objects.filter(task_id=task_id, upstream_id__in=list(upstream_ids)).values_list(
        "upstream_id", "on", "condition"
    )
    return {upstream: f"{on} if {condition_words(condition)}" if condition else on for upstream, on, condition in rows}
