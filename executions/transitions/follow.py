"""Workflows: the runs that follow a run's end (``'' → SCHEDULED``), created in the transaction
that records the end.

A task may follow others (its ``after``, :class:`~tasks_app.models.TaskDependency`). The writes
that end a run for good (:mod:`.worker`: SUCCEEDED, FAILED) first try the end alone, on the
condition that no task follows the run's task (:func:`unfollowed`: the common case, one
statement, nothing more). A run whose task is followed ends in a transaction of its own that
also calls :func:`follow_ended`, which creates each follower's run, due now, with:

* ``workflow_run``: the id of the run that started it all (the root's own, written on the root
  when its end is followed: it starts or skips a follower), so that every step of one workflow
  run has it;
* ``upstream``: the execution ids whose ends started it;
* ``input``: its upstream's output, bounded (:func:`input_from`).

Exactly once: the end is a conditional write (a second recording of the same end, a
redelivered message, loses and creates nothing), and a task has one run per workflow run
(the unique ``execution_workflow_step``; inserts are ``ON CONFLICT DO NOTHING``).

Fan-in (a task that follows several): its run is created by the end of the last of its
upstreams, within the same workflow run, to end as asked. Two upstreams ending at once take
turns on a transaction-level advisory lock on the workflow run, and each looks for the others'
ends only once it holds it: the later one sees the earlier one's committed end, so one of them
always creates the run.

Conditions and joins (:mod:`tasks_app.workflow_rules`): each follower is decided by its join
rule over its links (a link met: its upstream ended as its ``on`` asks and its condition holds on
the upstream's input document): run now, skip, or wait. A follower with one upstream is decided
from the end alone; one with several under the workflow run's lock, from its upstreams' states
read then (their latest runs' ends and the skip records). A skipped step is recorded once
(:class:`~executions.models.WorkflowSkip`, unique per task and workflow run, never beside a run
of the task in it), and its followers are decided in turn in the same transaction, transitively:
a skipped upstream is done, neither a success nor a failure. Each workflow run is decided whole
(its skips' followers included) before the next, in their order, so locks are taken in one order.

Map steps (a follower with ``map_over``): see the section below :func:`_map_start`. A map step's
items are runs of its task with a ``map_index`` (unique per task, workflow run and index, beside
``execution_workflow_step`` for the other steps); an item's end is never its task's end (it is
never written alone: :func:`unfollowed`), it creates the next items and the last one ends the
step as a whole, whose followers are then decided as after any end.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q

from executions.models import Execution, ExecutionOrigin, WorkflowMap, WorkflowSkip
from executions.models import ExecutionStatus as S
from executions.notify import notify_due
from executions.transitions.dispatch import Dispatch, executions_take_steps
from executions.transitions.hold import halted_runs
from executions.transitions.sql import EXECUTIONS, TASKS, Event, key_share, pg_array, with_events
from tasks_app.models import MAX_MAP_ITEMS, DependencyOn, OverlapPolicy, Task, TaskDependency, TaskStatus

# The longest output (characters) read as a follower's input: a longer one is cut and given as text.
from tasks_app.run_input import INPUT_MAX_CHARS
from tasks_app.workflow_rules import ConditionError, Decision, Upstream, join_decide, path_read
from tms_core import metrics

DEPENDENCIES = TaskDependency._meta.db_table
SKIPS = WorkflowSkip._meta.db_table
MAPS = WorkflowMap._meta.db_table

#: The actor of a follower's creation event.
WORKFLOW_ACTOR = "workflow"
#: Namespace of the advisory lock (two-key form) a fan-in's check holds on its workflow run.
FAN_IN_LOCK_NAMESPACE = 0x7A5E
#: What an ending write returns for :func:`ended_rows` (``id, attempt`` first, as every write).
ENDED_RETURNING = "id, attempt, task_id, workflow_run, output, error, status, map_index"
#: For each end, the ``on`` values of ``after`` it satisfies.
SATISFIES: Mapping[str, frozenset[str]] = {
    S.SUCCEEDED: frozenset({DependencyOn.SUCCESS, DependencyOn.COMPLETION}),
    S.FAILED: frozenset({DependencyOn.FAILURE, DependencyOn.COMPLETION}),
}


def unfollowed() -> Q:
    """The condition of an end written alone: no task follows the run's task, and it is no map
    step's item (whose end may start the next items and ends the step)."""
    return Q(map_index__isnull=True) & Q(~Exists(TaskDependency.objects.filter(upstream_id=OuterRef("task_id"))))


#: :func:`unfollowed` in raw SQL, for a statement over rows aliased ``e``.
UNFOLLOWED_SQL = (
    "(e.map_index IS NULL AND NOT EXISTS"  # noqa: S608
    f" (SELECT 1 FROM {TaskDependency._meta.db_table} d WHERE d.upstream_id = e.task_id))"
)


@dataclass(frozen=True)
class Ended:
    """A run that has just ended for good, as its ending write returned it."""

    execution_id: int
    task_id: uuid.UUID
    status: str
    workflow_run: int | None
    output: str
    error: str
    #: A map step's item: its index (see :func:`_items_ended`).
    map_index: int | None = None
    #: A map step's end as a whole (not a run's): what its followers get, its items' documents.
    items: list[Any] | None = None


def ended_rows(rows: Sequence[Sequence[Any]]) -> list[Ended]:
    """The rows an ending write returned with :data:`ENDED_RETURNING`."""
    return [
        Ended(
            row[0],
            row[2] if isinstance(row[2], uuid.UUID) else uuid.UUID(str(row[2])),
            row[6],
            row[3],
            row[4],
            row[5],
            row[7] if len(row) > 7 else None,
        )
        for row in rows
    ]


def input_from(ended: Ended | Mapping[str, Any]) -> Any:
    """A follower's input from its upstream's end: the output if it is a JSON object within
    :data:`INPUT_MAX_CHARS`, else ``{"output": <text, cut to the bound>}``; a failed upstream's
    error is added to either as ``error`` (an ``on: failure`` step is told why, whatever the
    output's shape; a key ``error`` of the output's own gives way to it)."""
    items = ended.items if isinstance(ended, Ended) else ended.get("items")
    if items is not None:
        return items  # a map step's end: its items' documents, in order (bounded: _map_result)
    output, error, status = (
        (ended.output, ended.error, ended.status)
        if isinstance(ended, Ended)
        else (ended["output"], ended["error"], ended["status"])
    )
    text = output or ""
    shown: dict[str, Any] | None = None
    if len(text) <= INPUT_MAX_CHARS and text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict):
            shown = value
    if shown is None:
        shown = {"output": text[:INPUT_MAX_CHARS]}
    if status == S.FAILED:
        shown["error"] = (error or "")[:INPUT_MAX_CHARS]
    return shown


@dataclass
class _Follower:
    """A task that follows others: its join rule, its status, and its links (upstream -> on, condition)."""

    join: str
    status: str
    links: dict[uuid.UUID, tuple[str, Any]] = field(default_factory=dict)
    #: A map step's path (``Task.map_over``) and how many of its items run at once; "" for a step.
    map_over: str = ""
    map_concurrency: int = 1


class _Graph:
    """The followers of some tasks, with every link of each (what a fan-in needs), grown as skips
    reach further tasks."""

    def __init__(self) -> None:
        self.followers: dict[uuid.UUID, _Follower] = {}
        self.downstream: defaultdict[uuid.UUID, set[uuid.UUID]] = defaultdict(set)
        self.read: set[uuid.UUID] = set()

    def grow(self, upstreams: Collection[uuid.UUID]) -> None:
        new = set(upstreams) - self.read
        if not new:
            return
        self.read |= new
        for follower, upstream, on, condition, join, status, map_over, concurrency in _links_of_followers(new):
            node = self.followers.setdefault(
                follower, _Follower(join, status, map_over=map_over, map_concurrency=concurrency)
            )
            node.links[upstream] = (on, condition)
            self.downstream[upstream].add(follower)


def follow_ended(ended: Sequence[Ended]) -> list[int]:
    """Create the runs that ``ended`` start (in the caller's transaction, the one that wrote the
    ends), and record the steps they rule out (:class:`~executions.models.WorkflowSkip`), their
    followers' in turn; return the created runs' ids. See the module's description."""
    graph = _Graph()
    # A map step's items (map_index) are no ends of their task: each may start the next items,
    # and the last one ends the step as a whole (_items_ended), whose followers follow then.
    items: defaultdict[int, list[Ended]] = defaultdict(list)
    for run in ended:
        if run.map_index is not None and run.workflow_run is not None:
            items[run.workflow_run].append(run)
    ended = [run for run in ended if run.map_index is None or run.workflow_run is None]
    graph.grow({run.task_id for run in ended})
    followed = [run for run in ended if graph.downstream.get(run.task_id)]
    if not followed and not items:
        return []
    # In the order of their workflow runs, each one whole (its skips' followers included) before
    # the next: a fan-in's check locks its workflow run, and two transactions that end several
    # runs each (a worker's batch) then take those locks in one order and never deadlock.
    by_run: defaultdict[int, list[Ended]] = defaultdict(list)
    for run in followed:
        by_run[run.workflow_run or run.execution_id].append(run)
    # A paused or cancelled workflow run starts nothing and rules nothing out (issue 48; .hold:
    # a resume decides its steps then, through here): nor a map step's next items, nor its end
    # (a resume goes on with each map step that has not ended, through here too).
    for run_id in halted_runs(set(by_run) | set(items)):
        by_run.pop(run_id, None)
        items.pop(run_id, None)
    if not by_run and not items:
        return []
    # A root's workflow run is its own id from now on (before a fan-in's check reads it).
    _mark_roots([run.execution_id for runs in by_run.values() for run in runs if run.workflow_run is None])
    wanted: dict[tuple[uuid.UUID, int], _Wanted] = {}
    more: list[tuple[int, int]] = []  # map items created (id, team id)
    for workflow_run in sorted(set(by_run) | set(items)):
        runs = by_run.get(workflow_run, [])
        if workflow_run in items:
            _lock_workflow_run(workflow_run)
            finished = _items_ended(workflow_run, items[workflow_run], more)
            if finished:
                graph.grow({run.task_id for run in finished})
                runs = runs + finished
        runs = [run for run in runs if graph.downstream.get(run.task_id)]
        if runs:
            _follow_in(workflow_run, sorted(runs, key=lambda run: run.execution_id), graph, wanted, more)
    made = _create_steps(wanted)
    created = [execution_id for execution_id, _ in made.values()] + [execution_id for execution_id, _ in more]
    by_on: defaultdict[str, int] = defaultdict(int)  # the steps created, by the ``on`` the end met
    for key in made:
        by_on[wanted[key].on] += 1
    if created:
        publish = _step_publisher.get()
        teams = {team for _, team in made.values()} | {team for _, team in more}
        taken = executions_take_steps(created, teams=teams, actor=WORKFLOW_ACTOR) if publish is not None else []
        if publish is not None and taken:
            transaction.on_commit(partial(publish, taken))  # published once the end is committed
        if len(taken) < len(created):
            notify_due()  # the monitor takes them; delivered when the end commits
        transaction.on_commit(lambda: _count(by_on))  # counted if the end commits, not before
    return created


@dataclass(frozen=True)
class _Wanted:
    """A step to create: the upstream runs it follows (task -> run), the ``on`` the end met, and
    whether its input is keyed by upstream task (it follows several)."""

    arrived: Mapping[uuid.UUID, Any]
    on: str
    keyed: bool


def _ended_state(run: Ended) -> tuple[str, Any, Any]:
    """How an upstream that ended in this transaction stands (its status, the document its links'
    conditions read, the run), before anything is read."""
    return run.status, input_from(run), run


def _follow_in(
    workflow_run: int,
    runs: Sequence[Ended],
    graph: _Graph,
    wanted: dict[tuple[uuid.UUID, int], _Wanted],
    more: list[tuple[int, int]],
) -> None:
    """Decide, for ``workflow_run``, each follower of ``runs`` by its join rule (run, skip or wait),
    then each follower of what that skipped (or of a map step that ended at once: no items, or
    no list to map), until nothing more is decided. A map step due starts its first items
    (``more``)."""
    known: dict[uuid.UUID, tuple[str, Any, Any]] = {run.task_id: _ended_state(run) for run in runs}
    frontier = sorted({f for run in runs for f in graph.downstream[run.task_id]}, key=str)
    locked = False
    names: dict[uuid.UUID, str] = {}
    while frontier:
        several = [f for f in frontier if len(graph.followers[f].links) > 1]
        states: dict[uuid.UUID, tuple[str, Any, Any]] = {}
        if several:
            if not locked:
                _lock_workflow_run(workflow_run)
                locked = True
            states = _states(workflow_run, {u for f in several for u in graph.followers[f].links})
        decided: list[tuple[uuid.UUID, Decision, _Follower]] = []
        for follower in frontier:
            node = graph.followers[follower]
            seen = states if len(node.links) > 1 else known
            decided.append((follower, _decide(node, seen, names), node))
        skips: dict[uuid.UUID, str] = {}
        mapped: list[Ended] = []  # map steps that ended as they started
        for follower, decision, node in decided:
            if (follower, workflow_run) in wanted:
                continue
            if decision.run and node.status == TaskStatus.ACTIVE and node.map_over:
                if not locked:
                    _lock_workflow_run(workflow_run)
                    locked = True
                at_once = _map_start(follower, workflow_run, node, decision, more)
                if at_once is not None:
                    mapped.append(at_once)
            elif decision.run and node.status == TaskStatus.ACTIVE:
                arrived = {upstream.task: upstream.run for upstream in decision.sources}
                on = decision.sources[0].on if decision.sources else DependencyOn.COMPLETION
                wanted[(follower, workflow_run)] = _Wanted(arrived, on, len(node.links) > 1)
            elif decision.run:
                skips[follower] = f"its task is {node.status.lower()}"
            elif decision.skip:
                skips[follower] = decision.reason
        if not skips and not mapped:
            return
        skipped = _record_skips(workflow_run, skips) if skips else []
        for task in skipped:
            known[task] = ("skipped", None, None)
        for run in mapped:
            known[run.task_id] = _ended_state(run)
        reached = [*skipped, *(run.task_id for run in mapped)]
        graph.grow(reached)
        frontier = sorted({f for task in reached for f in graph.downstream.get(task, ())}, key=str)


def _decide(node: _Follower, states: Mapping[uuid.UUID, tuple[str, Any, Any]], names: dict[uuid.UUID, str]) -> Decision:
    """``node``'s join rule over its links, its upstreams as ``states`` has them (else pending)."""
    upstreams = []
    for task, (on, condition) in sorted(node.links.items(), key=lambda item: str(item[0])):
        state, document, run = states.get(task, ("pending", None, None))
        upstreams.append(Upstream(task, "", on, condition, state, document, run))
    decision = join_decide(node.join, upstreams)
    if decision.skip:
        # Words for the record: the upstreams by name (read only when something is skipped).
        missing = [upstream.task for upstream in upstreams if upstream.task not in names]
        if missing:
            names.update(
                {pk: name or str(pk) for pk, name in Task.objects.filter(pk__in=missing).values_list("pk", "name")}
            )
        named = [replace(upstream, name=names.get(upstream.task, str(upstream.task))) for upstream in upstreams]
        decision = join_decide(node.join, named)
    return decision


def _states(workflow_run: int, tasks: Collection[uuid.UUID]) -> dict[uuid.UUID, tuple[str, Any, Any]]:
    """How each of ``tasks`` stands in ``workflow_run``: its latest run's end (status, the
    document its links' conditions read, the run), ``skipped``, or ``pending``; one query."""
    listed = pg_array(map(str, sorted(tasks, key=str)))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT task_id, id, status, output, error, NULL::jsonb FROM {EXECUTIONS}"  # noqa: S608
            " WHERE workflow_run = %s AND task_id = ANY(%s::uuid[]) AND map_index IS NULL"
            f" UNION ALL SELECT task_id, NULL, NULL, NULL, NULL, NULL FROM {SKIPS}"
            " WHERE workflow_run = %s AND task_id = ANY(%s::uuid[])"
            # A map step stands as its record says (its items are not its ends): ended, or pending.
            f" UNION ALL SELECT task_id, ended_by, status, '', error, result FROM {MAPS}"
            " WHERE workflow_run = %s AND task_id = ANY(%s::uuid[]) AND status <> ''"
            " ORDER BY 2 NULLS FIRST",
            [workflow_run, listed, workflow_run, listed, workflow_run, listed],
        )
        rows = cursor.fetchall()
    states: dict[uuid.UUID, tuple[str, Any, Any]] = {}
    for task_id, execution_id, status, output, error, result in rows:  # a skip first, then runs by id
        task = task_id if isinstance(task_id, uuid.UUID) else uuid.UUID(str(task_id))
        if execution_id is None:
            states[task] = ("skipped", None, None)
        elif status in SATISFIES:
            row = {"id": execution_id, "status": status, "output": output, "error": error}
            if result is not None:
                row["items"] = json.loads(result) if isinstance(result, str) else result
            states[task] = (status, input_from(row), row)
        else:
            states[task] = ("pending", None, None)  # to run, running, or cancelled: no end
    return states


def _record_skips(workflow_run: int, skips: Mapping[uuid.UUID, str]) -> list[uuid.UUID]:
    """Record each of ``skips`` (task -> reason) as skipped in ``workflow_run``, unless it is already,
    or has a run in it; return the tasks recorded now (one statement)."""
    tasks = sorted(skips, key=str)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {SKIPS} (task_id, workflow_run, reason) SELECT u.task_id, %s, u.reason"  # noqa: S608
            " FROM unnest(%s::uuid[], %s::text[]) AS u(task_id, reason)"
            f" WHERE NOT EXISTS (SELECT 1 FROM {EXECUTIONS} e WHERE e.task_id = u.task_id AND e.workflow_run = %s)"
            " ORDER BY u.task_id ON CONFLICT DO NOTHING RETURNING task_id",
            [workflow_run, pg_array(map(str, tasks)), pg_array(skips[task] for task in tasks), workflow_run],
        )
        return [row[0] if isinstance(row[0], uuid.UUID) else uuid.UUID(str(row[0])) for row in cursor.fetchall()]


#: :func:`_links_of_followers` on PostgreSQL: the ended tasks by primary key, each one's followers
#: by the upstream index, then each follower's task and links by primary key, in subqueries that
#: are not flattened (``OFFSET 0``) and so run per row, whatever the tables' statistics say. The
#: ORM's form (an ``IN`` subquery and a join) left the plan to them: right after a bulk import of
#: workflows, before autovacuum analyzed the tables, PostgreSQL expected a handful of rows and
#: hashed or looped over every active task and every link for each end (16 ends over 10,000
#: chained tasks: 10.4 ms; 11-29 s with the statistics of empty tables; 0.2 ms once analyzed).
#: This form took 0.1-0.3 ms in each case, 2.6 ms in the worst plan seen.
_LINKS_SQL = (
    f'SELECT links.task_id, links.upstream_id, links."on", links.condition, live."join", live.status,'  # noqa: S608
    " live.map_over, live.map_concurrency"
    f" FROM {TASKS} ended"
    f" CROSS JOIN LATERAL (SELECT f.task_id FROM {DEPENDENCIES} f WHERE f.upstream_id = ended.id"
    " OFFSET 0) followers"
    f' CROSS JOIN LATERAL (SELECT t."join", t.status, t.map_over, t.map_concurrency FROM {TASKS} t'
    " WHERE t.id = followers.task_id OFFSET 0) live"
    f' CROSS JOIN LATERAL (SELECT d.task_id, d.upstream_id, d."on", d.condition FROM {DEPENDENCIES} d'
    " WHERE d.task_id = followers.task_id OFFSET 0) links"
    " WHERE ended.id = ANY(%s::uuid[])"
)


def _links_of_followers(
    upstreams: Collection[uuid.UUID],
) -> list[tuple[uuid.UUID, uuid.UUID, str, Any, str, str, str, int]]:
    """(task, upstream, on, condition, the task's join, its status, its map_over and map_concurrency)
    of every link of each task that follows one of ``upstreams`` (a task that is not active is
    there too: it is skipped)."""
    with connection.cursor() as cursor:
        cursor.execute(_LINKS_SQL, [pg_array(str(task_id) for task_id in sorted(upstreams))])
        rows = cursor.fetchall()
    return [
        (
            uuid.UUID(str(task)),
            uuid.UUID(str(upstream)),
            on,
            json.loads(condition) if isinstance(condition, str) else condition,
            join,
            status,
            map_over or "",
            int(concurrency or 1),
        )
        for task, upstream, on, condition, join, status, map_over, concurrency in rows
    ]


#: Publishes the steps this context's ending writes took (see :func:`publishing_steps`).
StepPublisher = Callable[[list[Dispatch]], None]
_step_publisher: ContextVar[StepPublisher | None] = ContextVar("tms_step_publisher", default=None)


@contextmanager
def publishing_steps(publish: StepPublisher) -> Iterator[None]:
    """Within this block, the steps an ending write creates are taken (PENDING) in its own
    transaction and handed to ``publish`` once it commits, instead of waiting SCHEDULED for the
    monitor: a worker wraps its message handling in it. A chain's next step then costs no monitor
    pass, no fair-share hold and no extra commit; the steps a chunk's ends create go out together,
    as a herd's runs do. Only while no other team's run is due and waiting, and the queue is not
    deep (:func:`~executions.transitions.dispatch.executions_take_steps`): fair share is the
    monitor's.

    ``publish`` must not raise: a step it cannot publish it gives back
    (:func:`~executions.transitions.dispatch.executions_untake`); one it never publishes (its
    process died) is published again by the monitor once PENDING for too long, as any message
    lost between a take and its publish. Outside such a block (the callback API, a page, a
    command) the monitor takes the steps, woken by the end's ``NOTIFY``.
    """
    token = _step_publisher.set(publish)
    try:
        yield
    finally:
        _step_publisher.reset(token)


def _count(by_on: Mapping[str, int]) -> None:
    for on, count in by_on.items():
        metrics.WORKFLOW_STEPS_CREATED.labels(on).inc(count)


def _lock_workflow_run(workflow_run: int) -> None:
    with connection.cursor() as cursor:
        # Two int4 keys; a clash of two runs' keys only makes them take turns.
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [FAN_IN_LOCK_NAMESPACE, workflow_run % 2_147_483_647])


#: The columns a follower's insert sets; the others take their database defaults.
_COLUMNS = (
    "task_id, scheduled_for, due_at, priority, exclusive, origin, status, attempt, retry_of_id,"
    " lease_owner, external_run_id, run_handle, message_id, output, error, owner_id, team_id, workflow_run, upstream,"
    " input"
)


def _mark_roots(roots: list[int]) -> None:
    """Write each root's own id as its workflow run, in one statement (without the ORM's compile)."""
    if roots:
        marks = ", ".join(["%s"] * len(roots))
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {EXECUTIONS} SET workflow_run = id WHERE id IN ({marks}) AND workflow_run IS NULL",  # noqa: S608
                roots,
            )


def _step_input(arrived: Mapping[uuid.UUID, Any], keyed: bool) -> dict[str, Any]:
    """A step's input: its upstream's (:func:`input_from`), or for a step that follows several,
    an object keyed by each upstream task whose run it follows."""
    if len(arrived) == 1 and not keyed:
        (only,) = arrived.values()
        return input_from(only)
    return {str(task_id): input_from(run) for task_id, run in sorted(arrived.items(), key=lambda item: str(item[0]))}


def _upstream_ids(arrived: Mapping[uuid.UUID, Any]) -> list[int]:
    return sorted(run.execution_id if isinstance(run, Ended) else run["id"] for run in arrived.values())


#: Every step a transaction's ends start, in one statement with their events (PostgreSQL): each
#: due now by the statement's clock, a microsecond apart among runs of one task (the occurrence
#: of a task is unique by its time), each event saying which runs it follows.
_STEPS_SQL = (
    f"INSERT INTO {EXECUTIONS} ({{columns}}) "  # noqa: S608 - our table names; every value is a parameter
    "SELECT t.id, v.at, v.at, t.priority,"
    " (t.overlap_policy <> %s OR t.max_concurrency IS NOT NULL OR t.has_limits),"
    " %s, %s, 1, NULL, '', '', '{{}}', '', '', '', t.owner_id, t.team_id, v.workflow_run, v.upstream::jsonb,"
    " v.input::jsonb"
    " FROM (SELECT u.*, statement_timestamp()"
    " + (row_number() OVER (PARTITION BY u.task_id ORDER BY u.workflow_run) - 1) * interval '1 microsecond' AS at"
    " FROM unnest(%s::uuid[], %s::bigint[], %s::text[], %s::text[]) AS u(task_id, workflow_run, upstream, input)) v"
    f" JOIN {TASKS} t ON t.id = v.task_id WHERE t.status = %s FOR KEY SHARE OF t ON CONFLICT DO NOTHING"
)
#: Each step's event detail, from its row: "after execution(s) 1, 2 (workflow run 1)".
_STEP_DETAIL_SQL = (
    "COALESCE("
    "'after execution' || CASE WHEN jsonb_array_length(upstream) > 1 THEN 's ' ELSE ' ' END"
    " || (SELECT string_agg(x, ', ' ORDER BY x::bigint) FROM jsonb_array_elements_text(upstream) AS x)"
    " || ' (workflow run ' || workflow_run || ')'"
    ", 'after steps that did not run (workflow run ' || workflow_run || ')')"
)


def _create_steps(
    wanted: Mapping[tuple[uuid.UUID, int], _Wanted],
) -> dict[tuple[uuid.UUID, int], tuple[int, int]]:
    """Create the steps ``wanted`` (follower, workflow run) unless they exist, for ACTIVE tasks
    only; return the created ones' ``(id, team id)``. In one statement, a step it could not insert
    (another run of its task at that very microsecond) then alone."""
    made: dict[tuple[uuid.UUID, int], tuple[int, int]] = {}
    rest = list(wanted)
    if wanted:
        keys = sorted(wanted, key=lambda key: (key[1], str(key[0])))
        params: list[Any] = [OverlapPolicy.ALLOW, ExecutionOrigin.WORKFLOW, S.SCHEDULED]
        params += [
            pg_array(str(follower) for follower, _ in keys),
            pg_array(workflow_run for _, workflow_run in keys),
            pg_array(json.dumps(_upstream_ids(wanted[key].arrived)) for key in keys),
            pg_array(json.dumps(_step_input(wanted[key].arrived, wanted[key].keyed)) for key in keys),
            TaskStatus.ACTIVE,
        ]
        rows = with_events(
            _STEPS_SQL.format(columns=_COLUMNS),
            params,
            Event("", S.SCHEDULED, WORKFLOW_ACTOR),
            returning="id, attempt, task_id, workflow_run, team_id, upstream",
            select="SELECT id, task_id, workflow_run, team_id FROM done",
            detail_sql=_STEP_DETAIL_SQL,
        )
        for execution_id, task_id, workflow_run, team_id in rows:
            made[(task_id if isinstance(task_id, uuid.UUID) else uuid.UUID(str(task_id)), workflow_run)] = (
                int(execution_id),
                int(team_id),
            )
        rest = [key for key in keys if key not in made]
    for follower, workflow_run in rest:
        step = _create_step(follower, workflow_run, wanted[(follower, workflow_run)])
        if step is not None:
            made[(follower, workflow_run)] = step
    return made


def _create_step(follower: uuid.UUID, workflow_run: int, wanted: _Wanted) -> tuple[int, int] | None:
    """Insert ``follower``'s run of ``workflow_run`` (SCHEDULED, due now) unless it exists; an
    ACTIVE task only (a paused or deleted one does not run). Returns its id and team id, or None."""
    ids = _upstream_ids(wanted.arrived)
    given = _step_input(wanted.arrived, wanted.keyed)
    json_field = Execution._meta.get_field("input")
    task_pk = Task._meta.pk.get_db_prep_value(follower, connection)
    detail = (
        f"after execution{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))} (workflow run {workflow_run})"
        if ids
        else f"after steps that did not run (workflow run {workflow_run})"
    )
    for _ in range(3):  # another run of the task at this very microsecond: try the next one
        # Due now, by the database's clock: read in the statement itself (a query less per step).
        select_sql = (
            "SELECT t.id, statement_timestamp(), statement_timestamp(), t.priority,"  # noqa: S608 - every value is a parameter
            " (t.overlap_policy <> %s OR t.max_concurrency IS NOT NULL OR t.has_limits),"
            " %s, %s, 1, NULL, '', '', '{}', '', '', '', t.owner_id, t.team_id, %s, %s, %s"
            f" FROM {Task._meta.db_table} t WHERE t.id = %s AND t.status = %s{key_share('t')}"
        )
        params = [OverlapPolicy.ALLOW, ExecutionOrigin.WORKFLOW, S.SCHEDULED, workflow_run]
        params += [json_field.get_db_prep_value(ids, connection), json_field.get_db_prep_value(given, connection)]
        params += [task_pk, TaskStatus.ACTIVE]
        statement = f"INSERT INTO {EXECUTIONS} ({_COLUMNS}) {select_sql} ON CONFLICT DO NOTHING"
        rows = with_events(
            statement, params, Event("", S.SCHEDULED, WORKFLOW_ACTOR, detail), returning="id, attempt, team_id"
        )
        if rows:
            return int(rows[0][0]), int(rows[0][2])
        if Execution.objects.filter(task_id=follower, workflow_run=workflow_run).exists():
            return None  # created already: exactly once
        if not Task.objects.filter(pk=follower, status=TaskStatus.ACTIVE).exists():
            return None
    return None


# Map steps (issue 48): a task with ``map_over`` runs once per item of a list in its upstream's
# output. When it is due (its join rule says run), :func:`_map_start` records the step
# (:class:`~executions.models.WorkflowMap`: its items, its concurrency) and creates its first
# ``map_concurrency`` items' runs (``map_index`` 0, 1, ...); each item's end (:func:`_items_ended`,
# under the workflow run's lock) creates the next ones while fewer than that many are to run or
# running, and the end of the last one ends the step as a whole: its record says how (SUCCEEDED
# when every item did, else FAILED) and holds its result (the items' documents in order), and its
# followers are decided as after any end, once (the record's status changes once).

#: The statuses of an item still to run or running (it holds one of the step's places).
_ACTIVE = (S.SCHEDULED, S.PENDING, S.RUNNING)
#: A map's item runs: as a step's (:data:`_COLUMNS`), with its index.
_ITEMS_SQL = (
    f"INSERT INTO {EXECUTIONS} ({_COLUMNS}, map_index) "  # noqa: S608 - our table names; every value is a parameter
    "SELECT t.id, v.at, v.at, t.priority,"
    " (t.overlap_policy <> %s OR t.max_concurrency IS NOT NULL OR t.has_limits),"
    " %s, %s, 1, NULL, '', '', '{}', '', '', '', t.owner_id, t.team_id, %s, %s::jsonb, v.input::jsonb, v.idx"
    " FROM (SELECT u.*, statement_timestamp() + (u.ord + %s) * interval '1 microsecond' AS at"
    " FROM unnest(%s::integer[], %s::text[]) WITH ORDINALITY AS u(idx, input, ord)) v"
    f" JOIN {TASKS} t ON t.id = %s WHERE t.status <> %s FOR KEY SHARE OF t ON CONFLICT DO NOTHING"
)
_ITEM_DETAIL_SQL = (
    "'item ' || map_index || ' of the map over execution ' || (upstream->>0)"
    " || ' (workflow run ' || workflow_run || ')'"
)


def item_input(item: Any) -> Any:
    """An item's run's input: the item if it is a JSON object, else ``{"item": <the item>}`` (a
    task's ``input_fills`` read an object)."""
    return item if isinstance(item, dict) else {"item": item}


def _map_items(node: _Follower, decision: Decision) -> tuple[int, list[Any] | None, str]:
    """The upstream run a map step reads, the list at its path in that run's output, or why there
    is none (an error that fails the step)."""
    if len(decision.sources) != 1:
        return 0, None, f"a map step follows one task; {len(decision.sources)} of its upstreams ended as asked"
    run = decision.sources[0].run
    upstream = run.execution_id if isinstance(run, Ended) else int(run["id"])
    listed = run.items if isinstance(run, Ended) else run.get("items")
    if listed is not None:
        document: Any = listed
    else:
        text = (run.output if isinstance(run, Ended) else run["output"]) or ""
        try:
            document = json.loads(text)
        except ValueError:
            return upstream, None, f"map_over {node.map_over}: the output of execution {upstream} is not JSON"
    try:
        found, value = path_read(document, node.map_over)
    except ConditionError as exc:
        return upstream, None, f"map_over: {exc}"
    if not found:
        return upstream, None, f"map_over {node.map_over}: nothing there in the output of execution {upstream}"
    if not isinstance(value, list):
        kind = type(value).__name__.replace("dict", "object").replace("str", "text")
        return upstream, None, f"map_over {node.map_over}: a {kind}, not a list, in the output of execution {upstream}"
    if len(value) > MAX_MAP_ITEMS:
        return (
            upstream,
            None,
            (
                f"map_over {node.map_over}: {len(value)} items in the output of execution {upstream};"
                f" a map step runs at most {MAX_MAP_ITEMS:,}"
            ),
        )
    return upstream, value, ""


def _map_start(
    task: uuid.UUID, workflow_run: int, node: _Follower, decision: Decision, more: list[tuple[int, int]]
) -> Ended | None:
    """Start ``task``'s map step in ``workflow_run`` (under its lock), unless it started already:
    its record and first items (into ``more``). Returns its end when it ends at once (an empty
    list: SUCCEEDED with ``[]``; no list to read: FAILED with why), else None."""
    upstream, items, error = _map_items(node, decision)
    status = S.FAILED if items is None else (S.SUCCEEDED if not items else "")
    ended_by = upstream or workflow_run
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {MAPS} (task_id, workflow_run, upstream, items, concurrency, status, result, error,"  # noqa: S608
            " ended_by, finished_at) VALUES (%s, %s, %s, %s::jsonb, %s, %s, %s::jsonb, %s, %s,"
            " CASE WHEN %s <> '' THEN statement_timestamp() END) ON CONFLICT DO NOTHING RETURNING id",
            [
                str(task),
                workflow_run,
                ended_by,
                json.dumps(items or []),
                node.map_concurrency,
                status,
                "[]" if status == S.SUCCEEDED else None,
                error,
                ended_by if status else None,
                status,
            ],
        )
        if cursor.fetchone() is None:
            return None  # started already (an upstream's end recorded again, a retried upstream): once
    if status:
        return Ended(ended_by, task, status, workflow_run, "", error, items=[] if status == S.SUCCEEDED else None)
    assert items is not None
    first = range(min(node.map_concurrency, len(items)))
    _create_items(task, workflow_run, upstream, {index: items[index] for index in first}, more)
    return None


def _create_items(
    task: uuid.UUID, workflow_run: int, upstream: int, items: Mapping[int, Any], more: list[tuple[int, int]]
) -> None:
    """Create ``items`` (index -> item) of ``task``'s map step in ``workflow_run`` unless they exist
    (SCHEDULED, due now), a microsecond apart; add the created ``(id, team id)`` to ``more``. An
    item that another run of the task took the time of (the occurrence is unique by its time) is
    tried again a little later."""
    wanted = dict(items)
    for shift in (0, 100_003, 200_009):
        if not wanted:
            return
        indexes = sorted(wanted)
        rows = with_events(
            _ITEMS_SQL,
            [
                OverlapPolicy.ALLOW,
                ExecutionOrigin.WORKFLOW,
                S.SCHEDULED,
                workflow_run,
                json.dumps([upstream]),
                shift,
                pg_array(indexes),
                pg_array(json.dumps(item_input(wanted[index])) for index in indexes),
                str(task),
                TaskStatus.DELETED,
            ],
            Event("", S.SCHEDULED, WORKFLOW_ACTOR),
            returning="id, attempt, team_id, map_index, upstream, workflow_run",
            select="SELECT id, team_id, map_index FROM done",
            detail_sql=_ITEM_DETAIL_SQL,
        )
        for execution_id, team_id, index in rows:
            more.append((int(execution_id), int(team_id)))
            wanted.pop(int(index), None)
        if wanted:
            present = Execution.objects.filter(
                task_id=task, workflow_run=workflow_run, map_index__in=list(wanted)
            ).values_list("map_index", flat=True)
            for index in present:
                wanted.pop(int(index or 0), None)


def _map_result(latest: Sequence[tuple[int, int, str, str, str]]) -> tuple[list[Any], str]:
    """A map step's result from its items' latest runs (index, id, status, output, error) in
    order: each item's document (as :func:`input_from` reads a run: its output's JSON object, or
    ``{"output": text}``, with ``error`` after a failure), bounded: once the documents so far take
    :data:`INPUT_MAX_CHARS`, each further one is ``{"truncated": true}`` (with a failed item's
    error, cut to 200 characters), so the list keeps one entry per item, in order. Also the
    step's error: its first failed item's, and how many failed ("" when none did)."""
    documents: list[Any] = []
    used = 0
    failed = [(index, error) for index, _, status, _, error in latest if status == S.FAILED]
    for _, execution_id, status, output, error in latest:
        document = input_from({"id": execution_id, "status": status, "output": output, "error": error})
        size = len(json.dumps(document))
        if used + size > INPUT_MAX_CHARS:
            document = {"truncated": True} | ({"error": (error or "")[:200]} if status == S.FAILED else {})
            size = len(json.dumps(document))
        used += size
        documents.append(document)
    if not failed:
        return documents, ""
    index, error = failed[0]
    return documents, f"{len(failed)} of {len(latest)} items failed; item {index}: {(error or '')[:500]}"


def _items_ended(workflow_run: int, ends: Sequence[Ended], more: list[tuple[int, int]]) -> list[Ended]:
    """For the items ``ends`` of map steps of ``workflow_run`` (under its lock): create each step's
    next items while fewer than its concurrency are to run or running (into ``more``), and end
    each step whose items all ended (each index's latest run, a retry's included). Returns the
    steps that ended now (their record's status changed: once)."""
    finished: list[Ended] = []
    for task in sorted({run.task_id for run in ends}, key=str):
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, upstream, items, concurrency, status FROM {MAPS}"  # noqa: S608
                " WHERE workflow_run = %s AND task_id = %s FOR UPDATE",
                [workflow_run, str(task)],
            )
            record = cursor.fetchone()
            if record is None:
                continue
            cursor.execute(
                f"SELECT DISTINCT ON (map_index) map_index, id, status, output, error FROM {EXECUTIONS}"  # noqa: S608
                " WHERE workflow_run = %s AND task_id = %s AND map_index IS NOT NULL ORDER BY map_index, id DESC",
                [workflow_run, str(task)],
            )
            latest = cursor.fetchall()
        map_id, upstream, items, concurrency, _ = record
        items = json.loads(items) if isinstance(items, str) else items
        started = (latest[-1][0] + 1) if latest else 0
        if started < len(items):
            room = min(concurrency - sum(1 for row in latest if row[2] in _ACTIVE), len(items) - started)
            if room > 0:
                following = range(started, started + room)
                _create_items(task, workflow_run, upstream, {index: items[index] for index in following}, more)
            continue
        if any(row[2] not in SATISFIES for row in latest):
            continue  # an item still runs, or was cancelled: the step has not ended
        documents, error = _map_result(latest)
        ended_as = S.FAILED if error else S.SUCCEEDED
        # The end that ended it (a resume's has none: its latest item's run).
        ended_by = max(run.execution_id for run in ends if run.task_id == task) or max(row[1] for row in latest)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {MAPS} SET status = %s, result = %s::jsonb, error = %s, ended_by = %s,"  # noqa: S608
                " finished_at = statement_timestamp() WHERE id = %s AND status <> %s RETURNING id",
                [ended_as, json.dumps(documents), error, ended_by, map_id, ended_as],
            )
            if cursor.fetchone() is not None:
                finished.append(Ended(ended_by, task, ended_as, workflow_run, "", error, items=documents))
    return finished


def map_ends(workflow_run: int) -> list[Ended]:
    """For a resume of ``workflow_run``: each map step that ended, as its end (what follows it may
    be missing), and each one that has not, as an item's end (``map_index`` -1, no run): its
    next items are created, or it ends, as a real item's end would have done."""
    rows = WorkflowMap.objects.filter(workflow_run=workflow_run).order_by("id")
    return [
        Ended(
            row.ended_by or workflow_run,
            row.task_id,
            row.status,
            workflow_run,
            "",
            row.error,
            items=row.result if row.result is not None else None,
        )
        if row.status
        else Ended(0, row.task_id, "", workflow_run, "", "", map_index=-1)
        for row in rows
    ]
