"""A workflow's page, per root task: its tasks and links (a graph drawn server-side and a list),
its recent workflow runs, and "Start workflow with input" for an operator
(:mod:`backoffice.run_views`). Reads only."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from backoffice.scope import task_abilities, visible_executions, visible_tasks
from backoffice.workflow_graph import workflow_shape_graph
from executions.models import ACTIVE_STATUSES, Execution, ExecutionStatus
from executions.workflow_control import workflow_run_cancel, workflow_run_pause, workflow_run_resume
from executions.workflow_runs import workflow_tasks
from executions.workflow_selectors import workflow_runs_annotated
from tasks_app.models import Task, TaskStatus
from tasks_app.teams import with_role
from tms_core.auth import actor_for, request_user
from tms_core.form_errors import flash_outcome

#: Workflow runs the workflow page lists.
RECENT_WORKFLOW_RUNS = 10
#: Levels walked up from a task to find the root of its workflow (links form no cycle).
MAX_WORKFLOW_LEVELS = 20


def workflow_root_of(task: Any) -> Any:
    """The root of the workflow ``task`` is in: walking up its first upstream (by name) until a
    task that follows none; one query per level (none for a task that follows nothing)."""
    current = task
    for _ in range(MAX_WORKFLOW_LEVELS):
        if not current.has_after:
            return current
        upstream = (
            Task.objects.filter(follower_links__task_id=current.pk)
            .exclude(status=TaskStatus.DELETED)
            .order_by("name", "id")
            .first()
        )
        if upstream is None:
            return current
        current = upstream
    return current


@login_required
def workflow_detail(request: HttpRequest, pk: Any) -> HttpResponse:
    """A workflow, named by its root task: its tasks and links (a graph and a list), its recent
    workflow runs, and "Start workflow with input" for an operator."""
    tasks = with_role(visible_tasks(request.user), request.user)
    root = get_object_or_404(tasks, pk=pk)
    task_ids, links = workflow_tasks(root.pk)
    members = visible_tasks(request.user).filter(pk__in=task_ids)
    by_id = {task.pk: task for task in members}
    by_id[root.pk] = root
    shown = [(follower, upstream, on) for follower, upstream, on in links if follower in by_id and upstream in by_id]
    root_runs = list(
        Execution.objects.filter(task_id=root.pk)
        .exclude(status=ExecutionStatus.SCHEDULED)
        .order_by("-id")[:RECENT_WORKFLOW_RUNS]
    )
    counts: dict[int, dict[str, int]] = {}
    if root_runs:
        steps = (
            Execution.objects.filter(workflow_run__in=[run.pk for run in root_runs])
            .values_list("workflow_run", "status")
            .annotate(n=Count("id"))
        )
        for workflow_run, status, n in steps:
            counts.setdefault(workflow_run, {})[status] = n
    runs = [
        {
            "root": run,
            "steps": ", ".join(f"{n} {status.lower()}" for status, n in sorted(counts.get(run.pk, {}).items())),
            "active": run.status in ACTIVE_STATUSES,
        }
        for run in root_runs
    ]
    rows = sorted(
        ({"task": by_id[follower], "upstream": by_id[upstream], "on": on} for follower, upstream, on in shown),
        key=lambda row: (str(row["upstream"]).lower(), str(row["task"]).lower()),
    )
    context = {
        "root": root,
        "task": root,
        "is_root": not root.has_after,
        "graph": workflow_shape_graph(root, by_id, shown),
        "links": rows,
        "task_count": len(by_id),
        "runs": runs,
        **task_abilities(request.user, root),
    }
    return render(request, "backoffice/workflow.html", context)


#: The workflow run page's buttons: the service each calls, and what it says once done.
WORKFLOW_RUN_ACTIONS: dict[str, tuple[Any, str]] = {
    "pause": (workflow_run_pause, "paused: no further step starts until it is resumed"),
    "resume": (workflow_run_resume, "resumed"),
    "cancel": (workflow_run_cancel, "cancelled"),
}


@login_required
@require_POST
def workflow_run_control(request: HttpRequest, pk: int, verb: str) -> HttpResponse:
    """Pause, resume or cancel a workflow run from its page, through the API's services."""
    if verb not in WORKFLOW_RUN_ACTIONS:
        raise Http404
    root = workflow_runs_annotated(visible_executions(request.user)).filter(pk=pk).first()
    if root is None:
        raise Http404
    act, words = WORKFLOW_RUN_ACTIONS[verb]
    user = request_user(request)
    flash_outcome(
        request, lambda: act(user=user, root=root, actor=actor_for(user)), lambda _: f"Workflow run {pk} {words}."
    )
    return redirect("backoffice:workflow-run", pk=pk)
