"""Workflows: the runs that follow a run's end (``'' → SCHEDULED``), created in the transaction
that records the end.

A task may follow others (its ``after``, :class:`~tasks_app.models.TaskDependency`). The writes
that end a run for good (:mod:`.worker`: SUCCEEDED, FAILED) first try the end alone, on the
condition that no task follows the run's task (:func:`unfollowed`: the common case, one
statement, nothing more). A run whose task is followed ends in a transaction of its own that
also calls :func:`follow_ended`, which creates each follower's run, due now, with:

* ``workflow_run``: the id of the run that started it all (the root's own, written on the root
  when its end starts a follower), so that every step of one workflow run has it;
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
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q

from executions.models import Execution, ExecutionOrigin
from executions.models import ExecutionStatus as S
from executions.notify import notify_due
from executions.transitions.sql import EXECUTIONS, Event, key_share, postgresql, with_events
from tasks_app.models import DependencyOn, OverlapPolicy, Task, TaskDependency, TaskStatus

# The longest output (characters) read as a follower's input: a longer one is cut and given as text.
from tasks_app.run_input import INPUT_MAX_CHARS
from tms_core import metrics
from tms_core.clock import db_now

#: The actor of a follower's creation event.
WORKFLOW_ACTOR = "workflow"
#: Namespace of the advisory lock (two-key form) a fan-in's check holds on its workflow run.
FAN_IN_LOCK_NAMESPACE = 0x7A5E
#: What an ending write returns for :func:`ended_rows` (``id, attempt`` first, as every write).
ENDED_RETURNING = "id, attempt, task_id, workflow_run, output, error, status"
#: For each end, the ``on`` values of ``after`` it satisfies.
SATISFIES: Mapping[str, frozenset[str]] = {
    S.SUCCEEDED: frozenset({DependencyOn.SUCCESS, DependencyOn.COMPLETION}),
    S.FAILED: frozenset({DependencyOn.FAILURE, DependencyOn.COMPLETION}),
}


def unfollowed() -> Q:
    """The condition of an end written alone: no task follows the run's task."""
    return Q(~Exists(TaskDependency.objects.filter(upstream_id=OuterRef("task_id"))))


#: :func:`unfollowed` in raw SQL, for a statement over rows aliased ``e``.
UNFOLLOWED_SQL = f"NOT EXISTS (SELECT 1 FROM {TaskDependency._meta.db_table} d WHERE d.upstream_id = e.task_id)"  # noqa: S608


@dataclass(frozen=True)
class Ended:
    """A run that has just ended for good, as its ending write returned it."""

    execution_id: int
    task_id: uuid.UUID
    status: str
    workflow_run: int | None
    output: str
    error: str


def ended_rows(rows: Sequence[Sequence[Any]]) -> list[Ended]:
    """The rows an ending write returned with :data:`ENDED_RETURNING`."""
    return [
        Ended(
            row[0], row[2] if isinstance(row[2], uuid.UUID) else uuid.UUID(str(row[2])), row[6], row[3], row[4], row[5]
        )
        for row in rows
    ]


def input_from(ended: Ended | Mapping[str, Any]) -> dict[str, Any]:
    """A follower's input from its upstream's end: the output if it is a JSON object within
    :data:`INPUT_MAX_CHARS`, else ``{"output": <text, cut to the bound>}``; a failed upstream's
    error is added as ``error`` to the latter."""
    output, error, status = (
        (ended.output, ended.error, ended.status)
        if isinstance(ended, Ended)
        else (ended["output"], ended["error"], ended["status"])
    )
    text = output or ""
    if len(text) <= INPUT_MAX_CHARS and text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
    shown: dict[str, Any] = {"output": text[:INPUT_MAX_CHARS]}
    if status == S.FAILED:
        shown["error"] = (error or "")[:INPUT_MAX_CHARS]
    return shown


def follow_ended(ended: Sequence[Ended]) -> list[int]:
    """Create the runs that ``ended`` start (in the caller's transaction, the one that wrote the
    ends); return their ids. See the module's description."""
    upstreams = {run.task_id for run in ended}
    # In one query: every link of each live follower of the ended runs' tasks (what a fan-in
    # needs), of which those from an ended task are the links to follow now.
    following = TaskDependency.objects.filter(upstream_id__in=upstreams).values("task_id")
    rows = TaskDependency.objects.filter(task_id__in=following, task__status=TaskStatus.ACTIVE).values_list(
        "task_id", "upstream_id", "on"
    )
    needs: defaultdict[uuid.UUID, dict[uuid.UUID, str]] = defaultdict(dict)
    links = []
    for follower, upstream, on in rows:
        needs[follower][upstream] = on
        if upstream in upstreams:
            links.append((follower, upstream, on))
    if not links:
        return []
    created: list[int] = []
    by_on: defaultdict[str, int] = defaultdict(int)  # the steps created, by the ``on`` the end met
    # In the order of their workflow runs: a fan-in's check locks its workflow run, and two
    # transactions that end several runs each (a worker's batch) then take those locks in one
    # order, so they wait for each other and never deadlock.
    for run in sorted(ended, key=lambda run: (run.workflow_run or run.execution_id, run.execution_id)):
        followers = sorted(
            {follower for follower, upstream, on in links if upstream == run.task_id and on in SATISFIES[run.status]}
        )
        if not followers:
            continue
        workflow_run = run.workflow_run or run.execution_id
        if run.workflow_run is None:  # a root: its workflow run is its own id from now on
            with connection.cursor() as cursor:  # one statement, without the ORM's compile per end
                cursor.execute(
                    f"UPDATE {EXECUTIONS} SET workflow_run = id WHERE id = %s AND workflow_run IS NULL",  # noqa: S608
                    [run.execution_id],
                )
        for follower in followers:
            required = needs[follower]
            if len(required) == 1:
                arrived: dict[uuid.UUID, Any] = {run.task_id: run}
            else:
                _lock_workflow_run(workflow_run)
                arrived = _arrived(workflow_run, required)
                if len(arrived) < len(required):
                    continue  # the last upstream to end creates it
            new = _create_step(follower, workflow_run, arrived)
            if new is not None:
                created.append(new)
                by_on[required[run.task_id]] += 1
    if created:
        notify_due()  # delivered when the end commits
        transaction.on_commit(lambda: _count(by_on))  # counted if the end commits, not before
    return created


def _count(by_on: Mapping[str, int]) -> None:
    for on, count in by_on.items():
        metrics.WORKFLOW_STEPS_CREATED.labels(on).inc(count)


def _lock_workflow_run(workflow_run: int) -> None:
    if postgresql():
        with connection.cursor() as cursor:
            # Two int4 keys; a clash of two runs' keys only makes them take turns.
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", [FAN_IN_LOCK_NAMESPACE, workflow_run % 2_147_483_647]
            )


def _arrived(workflow_run: int, required: Mapping[uuid.UUID, str]) -> dict[uuid.UUID, Any]:
    """The runs of ``required``'s tasks in ``workflow_run`` that ended as each is required to."""
    rows = Execution.objects.filter(workflow_run=workflow_run, task_id__in=list(required)).values(
        "id", "task_id", "status", "output", "error"
    )
    return {
        row["task_id"]: row
        for row in rows
        if row["status"] in SATISFIES and required[row["task_id"]] in SATISFIES[row["status"]]
    }


#: The columns a follower's insert sets; the others take their database defaults.
_COLUMNS = (
    "task_id, scheduled_for, due_at, priority, exclusive, origin, status, attempt, retry_of_id,"
    " lease_owner, external_run_id, run_handle, message_id, output, error, owner_id, team_id, workflow_run, upstream,"
    " input"
)


def _create_step(follower: uuid.UUID, workflow_run: int, arrived: Mapping[uuid.UUID, Any]) -> int | None:
    """Insert ``follower``'s run of ``workflow_run`` (SCHEDULED, due now) unless it exists; an
    ACTIVE task only (a paused or deleted one does not run). Returns its id, or None."""
    ids = sorted(run.execution_id if isinstance(run, Ended) else run["id"] for run in arrived.values())
    if len(arrived) == 1:
        (only,) = arrived.values()
        given = input_from(only)
    else:
        given = {
            str(task_id): input_from(run) for task_id, run in sorted(arrived.items(), key=lambda item: str(item[0]))
        }
    json_field = Execution._meta.get_field("input")
    task_pk = Task._meta.pk.get_db_prep_value(follower, connection)
    detail = f"after execution{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))} (workflow run {workflow_run})"
    for _ in range(3):  # another run of the task at this very microsecond: try the next one
        # Due now, by the database's clock: read in the statement itself on PostgreSQL (a query
        # less per step), from the host on the embedded default.
        at = "statement_timestamp()" if postgresql() else "%s"
        now = (
            [] if postgresql() else [Execution._meta.get_field("scheduled_for").get_db_prep_value(db_now(), connection)]
        )
        select_sql = (
            f"SELECT t.id, {at}, {at}, t.priority,"  # noqa: S608 - our table names; every value is a parameter
            " (t.overlap_policy <> %s OR t.max_concurrency IS NOT NULL OR t.has_limits),"
            " %s, %s, 1, NULL, '', '', '{}', '', '', '', t.owner_id, t.team_id, %s, %s, %s"
            f" FROM {Task._meta.db_table} t WHERE t.id = %s AND t.status = %s{key_share('t')}"
        )
        params = [*now, *now, OverlapPolicy.ALLOW, ExecutionOrigin.WORKFLOW, S.SCHEDULED, workflow_run]
        params += [json_field.get_db_prep_value(ids, connection), json_field.get_db_prep_value(given, connection)]
        params += [task_pk, TaskStatus.ACTIVE]
        statement = f"INSERT INTO {EXECUTIONS} ({_COLUMNS}) {select_sql} ON CONFLICT DO NOTHING"
        rows = with_events(statement, params, Event("", S.SCHEDULED, WORKFLOW_ACTOR, detail))
        if rows:
            return int(rows[0][0])
        if Execution.objects.filter(task_id=follower, workflow_run=workflow_run).exists():
            return None  # created already: exactly once
        if not Task.objects.filter(pk=follower, status=TaskStatus.ACTIVE).exists():
            return None
    return None
