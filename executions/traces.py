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

#: The first runs' trace contexts (traceparent, tracestate) of workflow runs seen by this process
#: (a step's trace is its workflow run's): a workflow run's first run never changes them.
_workflow_parents: dict[int, tuple[str, str]] = {}


def _workflow_contexts(roots: Iterable[int]) -> dict[int, tuple[str, str]]:
    missing = {root for root in roots if root not in _workflow_parents}
    if missing:
        if len(_workflow_parents) > 10_000:
            _workflow_parents.clear()
        found = {
            pk: (traceparent, tracestate)
            for pk, traceparent, tracestate in Execution.objects.filter(pk__in=missing).values_list(
                "id", "traceparent", "tracestate"
            )
        }
        for root in missing:
            _workflow_parents[root] = found.get(root, ("", ""))
    return _workflow_parents


def _ids(
    ids: Any, execution_id: int, traceparent: str, tracestate: str, workflow: int | None, parents: dict
) -> RunTrace | None:
    """``ids`` (tracing.run_trace or run_ids) of a run, a workflow step's in its first run's trace."""
    workflow = workflow if workflow != execution_id else None
    first = parents.get(workflow, ("", "")) if workflow is not None else ("", "")
    return ids(
        execution_id,
        traceparent=traceparent,
        tracestate=tracestate,
        workflow_run=workflow,
        workflow_traceparent=first[0],
        workflow_tracestate=first[1],
    )


def trace_of(execution: Execution) -> RunTrace | None:
    """The run's trace ids (None when tracing is off): worked out once per loaded row (the claim,
    the launch, the outcome and the end of a run ask for them in turn)."""
    if not tracing.ON:
        return None
    key = (execution.traceparent, execution.tracestate, execution.workflow_run)
    cached = execution.__dict__.get("_tms_trace")
    if cached is not None and cached[0] == key:
        return cached[1]
    workflow = execution.workflow_run if execution.workflow_run != execution.pk else None
    if workflow is None:
        trace: RunTrace | None = tracing.own_run_ids(execution.pk, key[0], key[1])
    else:
        trace = _ids(tracing.run_trace, execution.pk, *key, _workflow_contexts([workflow]))
    execution.__dict__["_tms_trace"] = (key, trace)
    return trace


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
    parents = _workflow_contexts([workflow]) if workflow is not None else {}
    ids = _ids(tracing.run_ids, execution.pk, execution.traceparent, execution.tracestate, workflow, parents)
    assert ids is not None
    return tracing.trace_url(ids.trace_hex)


def traces_of(ids: Sequence[int]) -> dict[int, RunTrace]:
    """The trace ids of several runs, read in one query (two for workflow steps)."""
    if not tracing.ON or not ids:
        return {}
    rows = list(
        Execution.objects.filter(pk__in=list(ids)).values_list("id", "traceparent", "tracestate", "workflow_run")
    )
    return _traces_of_rows(rows)


def _traces_of_rows(
    rows: Sequence[tuple[int, str, str, int | None]], *, sampled_only: bool = False
) -> dict[int, RunTrace]:
    """The trace ids of ``rows`` (id, traceparent, tracestate, workflow run); ``sampled_only``:
    only the runs the sampler keeps (a run that is not a workflow step is tested first, without
    making its ids)."""
    parents = _workflow_contexts(row[3] for row in rows if row[3] is not None and row[3] != row[0])
    traces: dict[int, RunTrace] = {}
    for execution_id, traceparent, tracestate, workflow in rows:
        if workflow is None or workflow == execution_id:
            if not sampled_only or tracing.own_sampled(execution_id, traceparent):
                traces[execution_id] = tracing.own_run_ids(execution_id, traceparent, tracestate)
        elif (trace := _ids(tracing.run_trace, execution_id, traceparent, tracestate, workflow, parents)) is not None:
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
    # What the take read of each run (Dispatch.trace), else one query for the rest.
    known = [(item.execution_id, *item.trace) for item in taken if getattr(item, "trace", None) is not None]
    traces = _traces_of_rows(known, sampled_only=True)
    if len(known) < len(taken):
        traces.update(traces_of([item.execution_id for item in taken if getattr(item, "trace", None) is None]))
    for item in taken:
        trace = traces.get(item.execution_id)
        if not tracing.recorded(trace):
            continue
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
    trace = trace_of(execution) if tracing.ON else None
    if tracing.recorded(trace):
        tracing.record_run_span(
            "tms.execution.claim",
            trace,
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
    trace = trace_of(execution) if tracing.ON else None
    if not tracing.recorded(trace):
        return  # off, or an unsampled run (its workflow run, in its trace, is unsampled too)
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
            .only("id", "scheduled_for", "traceparent", "tracestate", "task_id", "workflow_run")
            .first()
        )
        if first is not None:
            tracing.end_workflow_run(
                trace_of(first),
                workflow_run=workflow,
                start_ns=_ns(first.scheduled_for),
                attributes={"tms.workflow_run": workflow, "tms.task_id": str(first.task_id)},
            )
