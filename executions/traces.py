"""An execution's trace, as the engine sees it: which run, which moments (tms_core/tracing.py has
the ids and the spans). Every function returns at once when tracing is off.

Spans of one run, all children of its root ``tms.execution`` (due time -> end):
``tms.execution.taken`` (due -> taken by a monitor), ``tms.execution.publish`` (its message
published and confirmed), ``tms.execution.claim`` (a worker's claim), ``tms.runner.start`` (the
launch), ``tms.runner.poll`` (each poll), ``tms.execution.outcome`` (the outcome recorded).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from executions.models import ACTIVE_STATUSES, Execution
from tms_core import tracing
from tms_core.tracing import RunTrace

#: The first runs' traceparents of workflow runs seen by this process (a step's trace is its
#: workflow run's): a workflow run's first run never changes its traceparent.
_workflow_parents: dict[int, str] = {}


def _workflow_traceparents(roots: Iterable[int]) -> dict[int, str]:
    missing = {root for root in roots if root not in _workflow_parents}
    if missing:
        if len(_workflow_parents) > 10_000:
            _workflow_parents.clear()
        found = dict(Execution.objects.filter(pk__in=missing).values_list("id", "traceparent"))
        for root in missing:
            _workflow_parents[root] = found.get(root, "")
    return _workflow_parents


def trace_of(execution: Execution) -> RunTrace | None:
    """The run's trace ids (None when tracing is off)."""
    if not tracing.ON:
        return None
    workflow = execution.workflow_run if execution.workflow_run != execution.pk else None
    parents = _workflow_traceparents([workflow]) if workflow is not None else {}
    return tracing.run_trace(
        execution.pk,
        traceparent=execution.traceparent,
        workflow_run=workflow,
        workflow_traceparent=parents.get(workflow, "") if workflow is not None else "",
    )


def log_ids(execution: Execution) -> dict[str, str]:
    """The run's trace id for its log lines (``trace_id``; nothing when tracing is off)."""
    trace = trace_of(execution) if tracing.ON else None
    return {"trace_id": trace.trace_hex} if trace is not None else {}


def trace_page_url(execution: Execution) -> str:
    """The run's trace in the operator's trace viewer (``TMS_TRACE_URL``), '' when unset. Works
    in a process with tracing off (the ids are derived, not recorded)."""
    if not tracing.trace_url("0"):
        return ""
    workflow = execution.workflow_run if execution.workflow_run != execution.pk else None
    parents = _workflow_traceparents([workflow]) if workflow is not None else {}
    ids = tracing.run_ids(
        execution.pk,
        traceparent=execution.traceparent,
        workflow_run=workflow,
        workflow_traceparent=parents.get(workflow, "") if workflow is not None else "",
    )
    return tracing.trace_url(ids.trace_hex)


def traces_of(ids: Sequence[int]) -> dict[int, RunTrace]:
    """The trace ids of several runs, read in one query (two for workflow steps)."""
    if not tracing.ON or not ids:
        return {}
    rows = list(Execution.objects.filter(pk__in=list(ids)).values_list("id", "traceparent", "workflow_run"))
    parents = _workflow_traceparents(row[2] for row in rows if row[2] is not None and row[2] != row[0])
    traces: dict[int, RunTrace] = {}
    for execution_id, traceparent, workflow in rows:
        workflow = workflow if workflow != execution_id else None
        trace = tracing.run_trace(
            execution_id,
            traceparent=traceparent,
            workflow_run=workflow,
            workflow_traceparent=parents.get(workflow, "") if workflow is not None else "",
        )
        if trace is not None:
            traces[execution_id] = trace
    return traces


def _ns(moment: Any) -> int:
    return int(moment.timestamp() * 1e9)


def published(taken: Sequence[Any], *, taken_ns: int, start_ns: int, end_ns: int, span: Any = None) -> None:
    """The monitor took ``taken`` (Dispatch rows) at ``taken_ns`` and published them between
    ``start_ns`` and ``end_ns``: each run's ``taken`` (a run's) and ``publish`` spans; the monitor
    pass's ``span`` is linked to each run."""
    if not tracing.ON or not taken:
        return
    traces = traces_of([item.execution_id for item in taken])
    for item in taken:
        trace = traces.get(item.execution_id)
        ids = {"tms.execution_id": item.execution_id, "tms.attempt": item.attempt, "tms.dispatch": item.kind}
        if item.kind == "run" and item.due_at is not None:
            due_ns = _ns(item.due_at)
            tracing.record_run_span(
                "tms.execution.taken", trace, start_ns=min(due_ns, taken_ns), end_ns=taken_ns, attributes=ids
            )
        tracing.record_run_span(
            "tms.execution.publish",
            trace,
            start_ns=start_ns,
            end_ns=end_ns,
            attributes={**ids, "messaging.message.id": item.message_id},
        )
    tracing.add_links(span, [traces.get(item.execution_id) for item in taken])


def claimed(execution: Execution, *, start_ns: int, worker_id: str, resumed: bool = False) -> None:
    """A worker's claim of the run (``resumed``: its lease taken to poll or resume it), from
    ``start_ns`` to now."""
    if tracing.ON:
        tracing.record_run_span(
            "tms.execution.claim",
            trace_of(execution),
            start_ns=start_ns,
            attributes={
                "tms.execution_id": execution.pk,
                "tms.attempt": execution.attempt,
                "tms.worker": worker_id,
                "tms.resumed": resumed,
            },
        )


def ended(execution: Execution, task: Any, *, status: str, error: str = "") -> None:
    """The run ended (SUCCEEDED, FAILED or CANCELLED): its root span; and the workflow run's
    span when this was a step and nothing of its workflow run is left to run."""
    if not tracing.ON:
        return
    trace = trace_of(execution)
    links = []
    if not execution.traceparent and execution.workflow_run is None and task is not None:
        links.append(tracing.task_link(task.pk, task.tracing_id))
    attributes = {
        "tms.execution_id": execution.pk,
        "tms.task_id": str(execution.task_id),
        "tms.attempt": execution.attempt,
        "tms.status": status,
        "tms.origin": execution.origin,
        "tms.runner": getattr(task, "runner", ""),
        "tms.tracing_id": getattr(task, "tracing_id", ""),
        "tms.workflow_run": execution.workflow_run,
    }
    tracing.end_run(trace, start_ns=_ns(execution.scheduled_for), attributes=attributes, links=links, error=error)
    workflow = execution.workflow_run
    if workflow is not None and workflow != execution.pk:
        if Execution.objects.filter(workflow_run=workflow, status__in=ACTIVE_STATUSES).exists():
            return
        first = (
            Execution.objects.filter(pk=workflow)
            .only("id", "scheduled_for", "traceparent", "task_id", "workflow_run")
            .first()
        )
        if first is not None:
            tracing.end_workflow_run(
                trace_of(first),
                workflow_run=workflow,
                start_ns=_ns(first.scheduled_for),
                attributes={"tms.workflow_run": workflow, "tms.task_id": str(first.task_id)},
            )
