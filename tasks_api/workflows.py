"""Dependencies between tasks (a task's ``after``): the services that check and write them.

A task may follow others: ``after = [{"task": "<id>", "on": "success" | "failure" |
"completion"}]``. When a run of an upstream ends that way, the engine creates the follower's run
in the transaction that records the end (:mod:`executions.transitions.follow`); this module only
decides which links a task may have. Every upstream is a task of the same team, not deleted (a
workflow runs within one team, as its runs are that team's to see and operate), and the links
never form a cycle (a task that would, even through others, is refused with 400 on
``after``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Q

from tasks_app.models import MAX_AFTER, DependencyOn, JoinRule, Task, TaskDependency, TaskStatus
from tasks_app.schedule_words import AFTER_ENDS, runs_only_after
from tasks_app.workflow_rules import ConditionError, condition_check, join_check, path_parse
from tms_core.errors import InvalidInput

#: Namespace of the transaction-level advisory lock (two-key form) under which a team's links
#: are changed, so that two concurrent updates cannot each add half of a cycle.
AFTER_LOCK_NAMESPACE = 0x7A5D


@dataclass(frozen=True)
class After:
    """One checked entry of a task's ``after``."""

    upstream_id: uuid.UUID
    on: str
    #: A condition on the upstream's output (:mod:`tasks_app.workflow_rules`), or None.
    condition: Any = None

    def entry(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"task": str(self.upstream_id), "on": self.on}
        if self.condition is not None:
            shown["condition"] = self.condition
        return shown

    def key(self) -> tuple[uuid.UUID, str, str]:
        return (self.upstream_id, self.on, json.dumps(self.condition, sort_keys=True))


def task_after_entries(task: Task) -> list[dict[str, Any]]:
    """A task's ``after`` as the API shows it (no query for a task that follows nothing)."""
    if not task.has_after:
        return []
    links = (
        TaskDependency.objects.filter(task_id=task.pk)
        .order_by("upstream_id")
        .values_list("upstream_id", "on", "condition")
    )
    return [After(upstream, on, condition).entry() for upstream, on, condition in links]


def condition_parse(condition: Any, *, index: int | None = None, field: str = "after") -> Any:
    """``condition`` checked (None: none); an :class:`InvalidInput` on ``field`` naming the entry."""
    if condition is None:
        return None
    try:
        condition_check(condition)
    except ConditionError as exc:
        where = f"Entry {index}: " if index is not None else ""
        raise InvalidInput.on(field, f"{where}condition: {exc}") from None
    return condition


def join_parse(join: Any) -> str:
    """A join rule, checked (an :class:`InvalidInput` on ``join``)."""
    if join not in JoinRule.values:
        raise InvalidInput.on("join", f"{join!r} is not one of {', '.join(JoinRule.values)}.")
    return str(join)


def join_check_links(*, join: str, after: Sequence[After], field: str) -> None:
    """Refuse links whose ``on`` or condition ``join`` would ignore (a 400 on ``field``)."""
    problem = join_check(join, [(str(link.upstream_id), link.on, link.condition) for link in after])
    if problem:
        raise InvalidInput.on(field, problem[0].upper() + problem[1:])


def map_check(*, map_over: str, after: Sequence[After], field: str) -> None:
    """A map step's path is one, and it follows exactly one task (a 400 on ``field``, or on
    ``map_over`` for its path)."""
    if not map_over:
        return
    try:
        path_parse(map_over)
    except ConditionError as exc:
        raise InvalidInput.on("map_over", str(exc)) from None
    if len(after) != 1:
        raise InvalidInput.on(
            field,
            f"A map step (map_over) follows exactly one task, whose output lists its items: it follows {len(after)}.",
        )


def task_links(task: Task) -> list[After]:
    """A task's links as they are stored."""
    if not task.has_after:
        return []
    rows = TaskDependency.objects.filter(task_id=task.pk).values_list("upstream_id", "on", "condition")
    return [After(upstream, on, condition) for upstream, on, condition in rows]


def after_parse(entries: Any) -> list[After]:
    """``entries`` as the services take them (the API's serializer or the admin's JSON), checked
    for shape only: a list of ``{"task": id, "on": ...}``, no task twice. Errors are on ``after``."""
    if entries in (None, ""):
        return []
    if not isinstance(entries, list):
        raise InvalidInput.on("after", 'Expected a list of {"task": "<id>", "on": "success"}.')
    if len(entries) > MAX_AFTER:
        raise InvalidInput.on("after", f"A task follows at most {MAX_AFTER} tasks.")
    parsed: list[After] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or "task" not in entry or set(entry) - {"task", "on", "condition"}:
            raise InvalidInput.on("after", f'Entry {index}: expected {{"task": "<id>", "on": "success"}}.')
        on = entry.get("on") or DependencyOn.SUCCESS
        if on not in DependencyOn.values:
            raise InvalidInput.on("after", f"Entry {index}: on must be one of {', '.join(DependencyOn.values)}.")
        try:
            upstream = entry["task"] if isinstance(entry["task"], uuid.UUID) else uuid.UUID(str(entry["task"]))
        except ValueError:
            raise InvalidInput.on("after", f"Entry {index}: {entry['task']!r} is not a task id.") from None
        parsed.append(After(upstream, str(on), condition_parse(entry.get("condition"), index=index)))
    if len({after.upstream_id for after in parsed}) != len(parsed):
        raise InvalidInput.on("after", "A task is named twice.")
    return parsed


def after_resolve(*, team_id: int, entries: Any, task_id: uuid.UUID | None = None) -> list[After]:
    """Check ``entries`` for a task of team ``team_id`` (``task_id``: the task being changed, None
    for a new one): each upstream exists, is of the team and is not deleted; the task does not
    follow itself, nor anything that follows it. Every refusal is an :class:`InvalidInput` on
    ``after``.

    Call it in the transaction that writes the links: on PostgreSQL it takes the team's advisory
    lock, so concurrent changes of one team's links take turns and the cycle check sees the links
    as they will be (links never cross teams, so no cycle can pass through another team's)."""
    after = after_parse(entries)
    if not after:
        return []
    wanted = {link.upstream_id for link in after}
    if task_id is not None and task_id in wanted:
        raise InvalidInput.on("after", "A task cannot follow itself.")
    _lock_team(team_id)
    found = set(
        Task.objects.filter(pk__in=wanted, team_id=team_id)
        .exclude(status=TaskStatus.DELETED)
        .values_list("pk", flat=True)
    )
    missing = sorted(str(pk) for pk in wanted - found)
    if missing:  # another team's task is as unknown as one that does not exist
        raise InvalidInput.on("after", f"No task {', '.join(missing)} (of this task's team, not deleted) to follow.")
    if task_id is not None:
        loop = _path_to(task_id, wanted)
        if loop:
            raise InvalidInput.on("after", f"A cycle: {' -> '.join(_cycle_names([task_id, *loop]))}.")
    return after


def _cycle_names(chain: Sequence[uuid.UUID]) -> list[str]:
    """The tasks of a cycle as people know them: each by its name, quoted, with its id beside it
    where two tasks of the chain share that name; by its id when it has none."""
    names = dict(Task.objects.filter(pk__in=set(chain)).values_list("pk", "name"))
    counts: dict[str, int] = {}
    for pk in set(chain):
        counts[names.get(pk, "")] = counts.get(names.get(pk, ""), 0) + 1
    shown = []
    for pk in chain:
        name = names.get(pk, "")
        if not name:
            shown.append(str(pk))
        elif counts[name] > 1:
            shown.append(f"{name!r} ({pk})")
        else:
            shown.append(repr(name))
    return shown


def _lock_team(team_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [AFTER_LOCK_NAMESPACE, team_id])


def _path_to(task_id: uuid.UUID, starts: Iterable[uuid.UUID]) -> list[uuid.UUID]:
    """A chain of ``after`` links from one of ``starts`` back to ``task_id`` (the tasks in it,
    ``task_id`` last), or [] if none: ``task_id`` following ``starts`` would close it into a
    cycle. Walked breadth first, one query per level."""
    came_from: dict[uuid.UUID, uuid.UUID | None] = dict.fromkeys(starts)
    frontier = set(came_from)
    while frontier:
        if task_id in frontier:
            chain = [task_id]
            while (previous := came_from[chain[-1]]) is not None:
                chain.append(previous)
            return list(reversed(chain))
        step = TaskDependency.objects.filter(task_id__in=frontier).values_list("task_id", "upstream_id")
        frontier = set()
        for follower, upstream in step:
            if upstream not in came_from:
                came_from[upstream] = follower
                frontier.add(upstream)
    return []


def task_set_after(*, task: Task, after: Sequence[After]) -> bool:
    """Make ``task`` follow exactly ``after`` (checked by :func:`after_resolve`, in the caller's
    transaction); sets the denormalised ``has_after``. Returns whether anything changed."""
    rows = TaskDependency.objects.filter(task=task).values_list("upstream_id", "on", "condition")
    current = {After(upstream, on, condition).key() for upstream, on, condition in rows}
    wanted = {link.key() for link in after}
    if current == wanted:
        return False
    TaskDependency.objects.filter(task=task).delete()
    TaskDependency.objects.bulk_create(
        [
            TaskDependency(task=task, upstream_id=link.upstream_id, on=link.on, condition=link.condition)
            for link in after
        ]
    )
    has = bool(after)
    if task.has_after != has:
        task.has_after = has
        Task.objects.filter(pk=task.pk).update(has_after=has)
    return True


def after_links(tasks: Sequence[Task], chosen: Sequence[Sequence[After]]) -> list[TaskDependency]:
    """The link rows of new ``tasks`` (each with its checked entries), for one bulk insert."""
    return [
        TaskDependency(task_id=task.pk, upstream_id=link.upstream_id, on=link.on, condition=link.condition)
        for task, links in zip(tasks, chosen, strict=True)
        for link in links
    ]


@dataclass(frozen=True)
class Neighbour:
    """A task ``task`` follows (an upstream) or that follows it (a downstream), and how (``on``)."""

    task: Task
    on: str


def task_neighbours(task: Task) -> tuple[list[Neighbour], list[Neighbour]]:
    """The tasks ``task`` follows and the tasks that follow it (deleted ones left out), each by
    name: what its page and its admin page show. One query."""
    links = TaskDependency.objects.filter(Q(task_id=task.pk) | Q(upstream_id=task.pk)).select_related(
        "task", "upstream"
    )
    upstream: list[Neighbour] = []
    downstream: list[Neighbour] = []
    for link in links:
        if link.task_id == task.pk and link.upstream.status != TaskStatus.DELETED:
            upstream.append(Neighbour(link.upstream, link.on))
        elif link.upstream_id == task.pk and link.task.status != TaskStatus.DELETED:
            downstream.append(Neighbour(link.task, link.on))

    def by_name(item: Neighbour) -> tuple[str, str]:
        return (str(item.task).lower(), str(item.task.pk))

    return sorted(upstream, key=by_name), sorted(downstream, key=by_name)


def follower_words(task: Task, upstream: Sequence[Neighbour] | None = None) -> str:
    """Why a task with ``after`` and no schedule of its own has no next run, in words ("" for any
    other task)."""
    if not runs_only_after(task):
        return ""
    if upstream is None:
        upstream = task_neighbours(task)[0]
    parts = [f"{item.task} {AFTER_ENDS.get(item.on, item.on)} (on {item.on})" for item in upstream]
    if not parts:
        return "It has no schedule of its own and follows no task any more: nothing runs it but a run on request."
    joined = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    within = " within one workflow run" if len(parts) > 1 else ""
    return (
        f"No next run of its own: it has no schedule and runs only after other tasks, when {joined}{within}"
        " (or when run on request)."
    )
