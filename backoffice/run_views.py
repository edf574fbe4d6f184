"""The back office's ways to start runs with an input: "Run now" (and "Start workflow with
input" on a workflow's root) and replay, from an execution's page or the execution list.

Each calls the API's service (:func:`tasks_api.triggers.task_trigger`,
:func:`executions.replay.executions_replay_picked`) with the API's role rule: an operator's act;
the input is typed in a form built from the task's ``input_schema``
(:mod:`backoffice.run_input`) and checked by the service, its problems put on the fields. A
replay here takes no config: changing what a run does is an editor's edit of the task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from backoffice.run_input import RunInputForm
from backoffice.scope import execution_to_change, task_to_operate
from backoffice.views import pretty_json
from executions.models import TERMINAL_STATUSES
from executions.replay import executions_replay_picked
from executions.serializers import masked_input
from tasks_api.triggers import task_trigger, trigger_words
from tasks_api.workflows import task_neighbours
from tasks_app.masking import unmask_config
from tms_core.auth import actor_for, request_user
from tms_core.form_errors import SERVICE_ERRORS, flash_errors

T = TypeVar("T")


def is_workflow_root(task: Any, upstream: Any, downstream: Any) -> bool:
    """Whether a run of ``task`` starts a workflow run: tasks follow it and it follows none."""
    return bool(downstream) and not upstream


def _started(form: RunInputForm, start: Callable[[Any], T]) -> tuple[T, Any] | None:
    """``start(the form's run input)`` and that input, once the form is valid; None, with the
    errors on the form (on the input's fields where they name one), when the form or the
    service refuses."""
    if not form.is_valid():
        return None
    run_input: Any = None
    try:
        run_input = form.run_input()
        return start(run_input), run_input
    except SERVICE_ERRORS as exc:
        form.add_input_errors(exc, run_input)
        return None


@login_required
@require_http_methods(["GET", "POST"])
def task_trigger_view(request: HttpRequest, pk: Any) -> HttpResponse:
    """Run the task now (the API's trigger service), with an input typed in a form built from its
    ``input_schema`` (:mod:`backoffice.run_input`). The task page's one-click "Run now" (a task
    without a schema) posts no input; a refusal of the input shows the form with the errors on
    its fields. A workflow's root starts a workflow run this way ("Start workflow with input")."""
    task = task_to_operate(request.user, pk)
    upstream, downstream = task_neighbours(task)
    workflow = is_workflow_root(task, upstream, downstream)
    form = RunInputForm(request.POST if request.method == "POST" else None, schema=task.input_schema)
    code = 200
    if request.method == "POST":
        code = 400
        started = _started(
            form, lambda run_input: task_trigger(task=task, actor=actor_for(request_user(request)), run_input=run_input)
        )
        if started is not None:
            trigger, run_input = started
            words = trigger_words(trigger)
            given = " with the input given" if run_input is not None else ""
            if workflow:
                messages.success(request, f"Workflow started{given}: {words}.")
                return redirect("backoffice:workflow-run", pk=trigger.execution.pk)
            messages.success(request, words[0].upper() + words[1:] + given + ".")
            return redirect("backoffice:execution", pk=trigger.execution.pk)
    context = {"task": task, "form": form, "workflow": workflow, "downstream": downstream}
    return render(request, "backoffice/task_run.html", context, status=code)


def _replay_words(report: Any) -> str:
    count = len(report.created)
    runs = ", ".join(f"#{pk}" for pk in report.created[:10]) + (" ..." if count > 10 else "")
    return f"{count} execution{'s' if count != 1 else ''} replayed: new run{'s' if count != 1 else ''} {runs}."


def _unmasked(run_input: Any, stored: Any) -> Any:
    """An input edited from its masked form with each value still reading the mask given back
    its stored value (the form shows secrets masked, and a secret left alone is kept, not
    replaced by the mask)."""
    return run_input if run_input is None or stored is None else unmask_config(run_input, stored)


@login_required
@require_http_methods(["GET", "POST"])
def execution_replay_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Replay one finished execution (the API's replay service and its role checks: an operator's
    act), with its own input again or an input edited in a form built from the task's
    ``input_schema``. No config: changing what a run does is an editor's edit of the task."""
    execution = execution_to_change(request.user, pk)
    task = execution.task
    shown_input = None if execution.input is None else masked_input(execution.input)
    form = RunInputForm(
        request.POST if request.method == "POST" else None,
        schema=task.input_schema,
        initial_input=shown_input,
        keep_choice=True,
    )
    code = 200
    if request.method == "POST":
        code = 400
        started = _started(
            form,
            lambda run_input: executions_replay_picked(
                user=request_user(request),
                execution_ids=[execution.pk],
                actor=actor_for(request_user(request)),
                run_input=_unmasked(run_input, execution.input),
            ),
        )
        if started is not None:
            report, run_input = started
            given = " with the input given" if run_input is not None else " with its own input"
            messages.success(request, _replay_words(report)[:-1] + given + ".")
            return redirect("backoffice:execution", pk=report.created[0])
    context = {
        "execution": execution,
        "task": task,
        "form": form,
        "finished": execution.status in TERMINAL_STATUSES,
        "run_input": None if shown_input is None else pretty_json(shown_input),
    }
    return render(request, "backoffice/execution_replay.html", context, status=code)


@login_required
@require_POST
def executions_replay_view(request: HttpRequest) -> HttpResponse:
    """Replay the executions ticked on the list (``execution`` ids), each with its own input,
    through the API's replay service and its role checks; back to the list it came from."""
    back = request.POST.get("next", "")
    target = back if back.startswith("/ui/executions/") else reverse("backoffice:executions")
    raw = request.POST.getlist("execution")
    ids = [int(value) for value in raw if value.isdigit() and 0 < int(value) < 2**63]
    if len(ids) != len(raw):
        messages.error(request, "executions: pick executions from the list (an id is a whole number).")
        return redirect(target)
    try:
        report = executions_replay_picked(
            user=request_user(request), execution_ids=ids, actor=actor_for(request_user(request))
        )
    except SERVICE_ERRORS as exc:
        flash_errors(request, exc)
        return redirect(target)
    messages.success(request, _replay_words(report))
    return redirect(target)
