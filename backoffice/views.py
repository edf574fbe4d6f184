"""The back office's task and execution pages.

Reads go through :mod:`backoffice.scope` (another user's ids are a 404); every write validates
with the API's serializer and calls the API's service, so a page can do nothing the API would
refuse, and its events, cancellations and isolation are the API's. Errors land on the form.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from backoffice.approval_views import approval_panel
from backoffice.forms import BackfillForm, OccurrenceWindowForm, RuleForm, TaskForm, WhyForm, local_text
from backoffice.keyset import BadCursor, keyset_page
from backoffice.rules import rule_rows, task_rules
from backoffice.scope import (
    execution_or_404,
    execution_to_change,
    may_change_execution,
    task_abilities,
    task_to_change,
    task_to_operate,
    visible_executions,
    visible_tasks,
)
from backoffice.workflow_graph import state_word, workflow_graph
from backoffice.workflow_views import workflow_root_of
from executions.models import ACTIVE_STATUSES, TERMINAL_STATUSES, Execution, ExecutionStatus, WorkflowRunHold
from executions.runs import run_spec
from executions.serializers import masked_input, masked_run_config
from executions.services import execution_cancel_by_user, execution_retry_by_user
from executions.traces import trace_page_url
from executions.transitions import RETRYABLE_STATUSES
from executions.workflow_runs import workflow_run_read
from executions.workflow_selectors import workflow_run_hold, workflow_run_state
from runners.base import RunHandle, idempotency_key
from runners.registry import get_runner
from tasks_api.backfill import task_backfill
from tasks_api.creation import task_create
from tasks_api.editing import task_update
from tasks_api.hooks import hook_url, task_hook_delete, task_hook_set
from tasks_api.lifecycle import task_delete, task_pause, task_resume
from tasks_api.moving import task_move
from tasks_api.selector_serializers import (
    OccurrencesQuerySerializer,
    WhyQuerySerializer,
)
from tasks_api.selectors import task_occurrences, task_preview, task_why
from tasks_api.selectors.resume import resume_preview
from tasks_api.serializers import (
    BackfillSerializer,
    TaskCreateSerializer,
    TaskUpdateSerializer,
)
from tasks_api.states import task_next_run, task_state, with_state
from tasks_api.task_config import task_config_masked
from tasks_api.workflows import follower_words, task_neighbours
from tasks_app.masking import mask_config
from tasks_app.models import AuditEntry, TaskHook, TaskStatus, Team, TeamRole
from tasks_app.schedule_words import runs_only_after, schedule_words, short_duration
from tasks_app.schedules import dst_rules, parse_cron
from tasks_app.teams import includes, may, team_resolve, teams_with_role, visible_teams, with_role
from tasks_app.teams.services import default_team_of
from tasks_app.versions import version_comparison
from tms_core.auth import actor_for, request_user
from tms_core.errors import InvalidInput
from tms_core.form_errors import (
    SERVICE_ERRORS,
    add_errors,
    add_service_errors,
    flash_errors,
    flash_outcome,
    save_validated,
)

logger = logging.getLogger(__name__)

RECENT_RUNS = 25
#: Rows per page of the execution list.
PAGE_SIZE = 50
NEXT_FIRE_TIMES = 8


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else delta.total_seconds()


def run_row(execution: Execution) -> dict[str, Any]:
    """What the run tables show of an execution: status, duration and lateness in words."""
    duration = lateness = None
    if execution.started_at:
        lateness = _seconds(execution.started_at - execution.due_at)
        if execution.finished_at:
            duration = _seconds(execution.finished_at - execution.started_at)
    return {
        "execution": execution,
        "duration": short_duration(duration) if duration is not None else "",
        "lateness": short_duration(lateness) if lateness is not None else "",
    }


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


# --- tasks --------------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def task_list(request: HttpRequest) -> HttpResponse:
    """Tasks the user may see (searchable, by status) and the "New task" form."""
    form = TaskForm(request.POST or None, initial={"timezone": "UTC", "runner": "noop"}, user=request.user)
    if request.method == "POST" and form.is_valid():
        task = _create_from_form(request, form)
        if task is not None:
            messages.success(request, f"Task {task} created in team {task.team.name}.")
            return redirect("backoffice:task", pk=task.pk)
    # with_state: what each task is doing and when it next runs (its earliest waiting run, else
    # the materialisation cursor), as the task page and the API say; the cursor alone ran ahead.
    tasks = with_state(visible_tasks(request.user).select_related("owner", "team"))
    query = request.GET.get("q", "").strip().replace("\x00", "")
    status = request.GET.get("status", "")
    tasks, team, bad_team = team_switch(request, tasks)
    if query:
        tasks = tasks.filter(Q(name__icontains=query) | Q(runner=query))
    if status in TaskStatus.values:
        tasks = tasks.filter(status=status)
    # Keyset pages on (created_at, id), newest first: task_created_idx for staff,
    # task_owner_live_idx for an owner; no count of the matching tasks, no OFFSET.
    try:
        page = keyset_page(tasks, column="created_at", descending=True, cursor=request.GET.get("cursor"), size=50)
    except BadCursor as exc:
        messages.error(request, str(exc))
        page = keyset_page(tasks, column="created_at", descending=True, cursor=None, size=50)
    rows = [
        {"task": task, "schedule": schedule_words(task), "state": task_state(task), "next_run": task_next_run(task)}
        for task in page.rows
    ]
    code = 400 if request.method == "POST" or bad_team else 200
    context = {
        "form": form,
        "page": page,
        "rows": rows,
        "query": query,
        "status": status,
        "team": team,
        "teams": visible_teams(request.user),
        "keep": urlencode({key: value for key, value in (("q", query), ("status", status), ("team", team)) if value}),
        "descending": True,
        "statuses": [s for s in TaskStatus.values if s != TaskStatus.DELETED],
    }
    return render(request, "backoffice/task_list.html", context, status=code)


def _form_team(request: HttpRequest, form: TaskForm, default: Team) -> Team | None:
    """The team the form's menu names (``default`` when it names none); None, with the error on
    ``team``, when it is not one of the user's."""
    slug = form.team_slug()
    if not slug or slug == default.slug:
        return default
    try:
        return team_resolve(request.user, slug)
    except InvalidInput as exc:
        add_service_errors(form, exc)
        return None


def _create_from_form(request: HttpRequest, form: TaskForm) -> Any:
    """The task the "New task" form describes, made by the API's serializer and service (its
    ``after`` rows read in the chosen team); None, with the errors on the form, when refused."""
    team = _form_team(request, form, default_team_of(request_user(request)))
    after = form.after_entries(team.pk) if team is not None else None
    if team is None or after is None:
        return None
    payload = form.payload()
    if after:
        payload["after"] = after
    serializer = TaskCreateSerializer(data=payload, context={"request": request})
    return save_validated(form, serializer, lambda data: task_create(owner=request_user(request), **data))


#: Rows of the task page's occurrence timeline: its default window holds at most this many fire
#: times, and a longer window asked for shows this many with a link to the rest.
OCCURRENCES_PAGE = 100


def _ceil_second(when: datetime) -> datetime:
    return when + timedelta(microseconds=1_000_000 - when.microsecond) if when.microsecond else when


def occurrence_pages(task: Any, window: Any) -> dict[str, Any]:
    """One page of the occurrence timeline and the windows before and after it, as the form's
    ``from``/``to`` text in the task's zone (to the second: a page's ``to`` is rounded up, its
    ``from`` down, so a fire time at a fraction of a second is on one page or both, never lost)."""
    zone, span = task.timezone, window.end - window.start
    items = window.items
    page: dict[str, Any] = {"items": items[:OCCURRENCES_PAGE], "more": None}
    if len(items) > OCCURRENCES_PAGE:
        rest = items[OCCURRENCES_PAGE].scheduled_for
        page["more"] = {"from": local_text(rest, zone), "to": local_text(_ceil_second(window.end), zone)}
        page["hidden"] = len(items) - OCCURRENCES_PAGE
    page["earlier"] = {
        "from": local_text(window.start - span, zone),
        "to": local_text(_ceil_second(window.start), zone),
    }
    page["later"] = {"from": local_text(window.end, zone), "to": local_text(_ceil_second(window.end + span), zone)}
    return page


def _occurrences(request: HttpRequest, task: Any) -> tuple[Any, OccurrenceWindowForm]:
    """The occurrence timeline over the window the person asked for (default: around now,
    holding at most :data:`OCCURRENCES_PAGE` fire times)."""
    data = {key: request.GET[key] for key in ("from", "to") if request.GET.get(key)}
    form = OccurrenceWindowForm(data or None, zone=task.timezone)
    start = end = None
    if data and form.is_valid():
        query = OccurrencesQuerySerializer(data=form.payload())
        if query.is_valid():
            start, end = query.validated_data.get("from"), query.validated_data.get("to")
        else:
            add_errors(form, query.errors)
    try:
        window = task_occurrences(task=task, start=start, end=end, most=OCCURRENCES_PAGE)
    except SERVICE_ERRORS as exc:
        add_service_errors(form, exc)
        window = task_occurrences(task=task, most=OCCURRENCES_PAGE)
    if not form.is_bound:  # show the window it is, so moving it starts from there
        shown = {"from": local_text(window.start, task.timezone), "to": local_text(window.end, task.timezone)}
        form = OccurrenceWindowForm(initial=shown, zone=task.timezone)
    return window, form


def _why(request: HttpRequest, task: Any) -> tuple[Any, WhyForm]:
    if "at" not in request.GET:
        return None, WhyForm(zone=task.timezone)
    form = WhyForm({"at": request.GET["at"]}, zone=task.timezone)
    if not form.is_valid():
        return None, form
    query = WhyQuerySerializer(data=form.payload())
    if not query.is_valid():
        add_errors(form, query.errors)
        return None, form
    return task_why(task=task, at=query.validated_data["at"]), form


def task_context(request: HttpRequest, task: Any, **forms: Any) -> dict[str, Any]:
    """Everything the task page shows."""
    executions = Execution.objects.filter(task=task)
    recent = executions.exclude(status=ExecutionStatus.SCHEDULED).order_by("-id")[:RECENT_RUNS]
    waiting = executions.filter(status=ExecutionStatus.SCHEDULED).order_by("due_at", "id")[:10]
    occurrences, window_form = _occurrences(request, task)
    why, why_form = _why(request, task)
    try:
        # A paused task has no next fire times: they pass without runs until it is resumed (the
        # page says "No runs while paused"; listing them beside it contradicted it).
        listed = task.status not in (TaskStatus.COMPLETED, TaskStatus.PAUSED)
        fire_times = task_preview(task=task, count=NEXT_FIRE_TIMES) if listed else []
    except SERVICE_ERRORS:
        fire_times = []
    rules, default_rules = task_rules(task)
    # A rule for this task is added by an editor of its team, over the team's channels.
    # The page's task carries the caller's role (with_role, read with the task): no query more.
    editor_here = (
        includes(task.caller_role, TeamRole.EDITOR) or request.user.has_perm("notifications.add_rule")
        if hasattr(task, "caller_role")
        else may(request.user, task.team_id, TeamRole.EDITOR, "notifications.add_rule")
    )
    upstream, downstream = task_neighbours(task)
    abilities = task_abilities(request.user, task)
    # "Move to team": the other teams where the user is an editor (the move needs editor in both).
    move_teams = (
        teams_with_role(request.user, TeamRole.EDITOR).exclude(pk=task.team_id).order_by("slug")
        if abilities["can_change"]
        else []
    )
    rule_form = forms.get("rule_form") or (RuleForm(team_ids=[task.team_id], fixed_task=task) if editor_here else None)
    return {
        "task": task,
        "state": task_state(task),
        "next_run": task_next_run(task),
        "upstream": upstream,
        "downstream": downstream,
        "follower_words": follower_words(task, upstream),
        "workflow_root": workflow_root_of(task) if upstream or downstream else None,
        "resume": resume_preview(task),
        "rules": rule_rows(rules, request.user),
        "default_rules": default_rules,
        "rule_form": rule_form,
        "has_channels": rule_form is not None and rule_form.has_channels(),
        "schedule": schedule_words(task),
        "config": pretty_json(task_config_masked(task)),
        "changes": recent_changes(task),
        "fire_times": fire_times,
        "recent": [run_row(execution) for execution in recent],
        "waiting": list(waiting),
        "occurrences": occurrences,
        "occurrence_page": occurrence_pages(task, occurrences),
        "window_form": window_form,
        "why": why,
        "why_form": why_form,
        "backfill_form": forms.get("backfill_form") or BackfillForm(zone=task.timezone),
        "settings_rows": _settings_rows(task),
        "hook": (hook := _hook_of(task)),
        "hook_url": hook_url(hook, request=request) if hook is not None else "",
        "move_teams": move_teams,
        **abilities,
    }


#: Audit entries the task page lists.
RECENT_CHANGES = 10


def _change_text(change: Any) -> str:
    if isinstance(change, dict) and set(change) == {"from", "to"}:
        return f"{json.dumps(change['from'], default=str)} \u2192 {json.dumps(change['to'], default=str)}"
    return json.dumps(change, default=str)


def recent_changes(task: Any) -> list[dict[str, Any]]:
    """The task's latest audit entries (its executions' cancels and retries included), newest first."""
    entries = AuditEntry.objects.filter(task_id=task.pk).order_by("-id")[:RECENT_CHANGES]
    return [
        {
            "at": entry.at,
            "actor_name": entry.actor_name,
            "source": entry.source,
            "remote_addr": entry.remote_addr,
            "action": entry.action,
            "object_type": entry.object_type,
            "object_id": entry.object_id,
            "detail": entry.detail,
            "diff": [(name, _change_text(change)) for name, change in sorted((entry.changes or {}).items())],
        }
        for entry in entries
    ]


def _dst_text(task: Any) -> str:
    """The DST rules a cron task follows, its own or the hour field's (tasks_app.schedules.dst_rules)."""
    gap, fold = dst_rules(parse_cron(task.cron), task.dst_gap, task.dst_fold)
    chosen = "" if task.dst_gap or task.dst_fold else " (by the hour field)"
    return f"clock set forward: {gap}; set back: {fold}{chosen}"


def _hook_of(task: Any) -> TaskHook | None:
    """The task's trigger URL (read with the task where the page selects it), or None."""
    try:
        hook: TaskHook = task.hook
    except TaskHook.DoesNotExist:
        return None
    return hook


def _settings_rows(task: Any) -> list[tuple[str, Any]]:
    return [
        ("Runner", task.runner),
        ("Time zone", task.timezone),
        *([("Daylight saving", _dst_text(task))] if task.cron else []),
        *([("Business calendar", f"{task.calendar.name}: {task.calendar_policy}")] if task.calendar_id else []),
        # A workflow step without a schedule of its own: its start_at (its creation) means nothing.
        *(
            [("Schedule", "none of its own: it runs after the tasks it follows (see Workflow)")]
            if runs_only_after(task)
            else [("Start", task.start_at), ("End", task.end_at or "\u2013"), ("Max runs", task.max_runs or "\u2013")]
        ),
        ("Attempts", task.max_attempts),
        (
            "Retry backoff",
            f"{short_duration(_seconds(task.retry_backoff))} up to {short_duration(_seconds(task.retry_backoff_max))}",
        ),
        ("Timeout", short_duration(_seconds(task.timeout))),
        ("Priority", task.priority),
        ("Misfire", f"{task.misfire_policy} (grace {short_duration(_seconds(task.misfire_grace))})"),
        ("Overlap", task.overlap_policy),
        *([("Named events", _events_text(task.on_events))] if task.on_events else []),
        ("Version", task.version),
        ("Team", task.team.name),
        ("Owner", task.owner.get_username()),
    ]


def _events_text(on_events: Any) -> str:
    """A task's subscriptions in words: ``order.paid, cart.changed (debounce 1m by $.customer, at most 5m)``."""
    parts = []
    for item in on_events:
        text = item.get("name", "")
        if item.get("debounce"):
            text += f" (debounce {short_duration(item['debounce'])}"
            if item.get("debounce_key"):
                text += f" by {item['debounce_key']}"
            if item.get("debounce_max_wait"):
                text += f", at most {short_duration(item['debounce_max_wait'])}"
            text += ")"
        parts.append(text)
    return ", ".join(parts)


@login_required
def task_detail(request: HttpRequest, pk: Any) -> HttpResponse:
    # The task with its state columns and owner in the one query that finds it (they were two more).
    tasks = with_role(visible_tasks(request.user), request.user)
    task = get_object_or_404(with_state(tasks.select_related("owner", "hook", "team")), pk=pk)
    return render(request, "backoffice/task_detail.html", task_context(request, task))


def _task_action(request: HttpRequest, pk: Any, action: Any, done: str) -> HttpResponse:
    task = task_to_operate(request.user, pk)
    flash_outcome(request, lambda: action(task=task, actor=actor_for(request_user(request))), lambda _: done)
    return redirect("backoffice:task", pk=task.pk)


@login_required
@require_POST
def task_pause_view(request: HttpRequest, pk: Any) -> HttpResponse:
    task = task_to_operate(request.user, pk)
    return _task_action(
        request,
        pk,
        task_pause,
        "Paused: no new runs until it is resumed. The task page then says what resuming will do with the fire "
        f"times that pass meanwhile (its misfire policy is {task.misfire_policy}).",
    )


@login_required
@require_POST
def task_resume_view(request: HttpRequest, pk: Any) -> HttpResponse:
    task = task_to_operate(request.user, pk)
    preview = resume_preview(task)
    return _task_action(request, pk, task_resume, f"Resumed. {preview.words}" if preview else "Resumed.")


@login_required
@require_POST
def task_hook_view(request: HttpRequest, pk: Any) -> HttpResponse:
    """Make or rotate (``action=make``) or remove (``action=remove``) the task's trigger URL. A new
    secret is shown in this answer only, never put in the session (messages are stored there)."""
    task = task_to_change(request.user, pk)
    if request.POST.get("action") == "remove":
        removed = task_hook_delete(task=task)
        messages.success(request, "Trigger URL removed." if removed else "The task had no trigger URL.")
        return redirect("backoffice:task", pk=task.pk)
    made = task_hook_set(task=task)
    task = get_object_or_404(with_state(visible_tasks(request.user).select_related("owner", "hook")), pk=pk)
    context = task_context(request, task)
    context["hook_secret"] = made.secret
    return render(request, "backoffice/task_detail.html", context)


@login_required
@require_POST
def task_delete_view(request: HttpRequest, pk: Any) -> HttpResponse:
    task = task_to_change(request.user, pk, delete=True)

    def says(report: Any) -> str:
        note = " An external run may go on." if report.may_still_run else ""
        return f"Task {task} deleted; {len(report.executions)} active execution(s) cancelled.{note}"

    if not flash_outcome(request, lambda: task_delete(task=task, actor=actor_for(request_user(request))), says):
        return redirect("backoffice:task", pk=task.pk)
    return redirect("backoffice:tasks")


@login_required
@require_POST
def task_backfill_view(request: HttpRequest, pk: Any) -> HttpResponse:
    task = task_to_operate(request.user, pk)
    form = BackfillForm(request.POST, zone=task.timezone)
    if form.is_valid():
        serializer = BackfillSerializer(data=form.payload())
        report = save_validated(
            form, serializer, lambda data: task_backfill(task=task, actor=actor_for(request_user(request)), **data)
        )
        if report is not None:
            # A range with no fire time says so, not "0 execution(s) created" as if it had some.
            notify = messages.success if report.fire_times else messages.warning
            notify(request, f"Backfill: {report.detail}")
            return redirect("backoffice:task", pk=task.pk)
    context = task_context(request, task, backfill_form=form)
    return render(request, "backoffice/task_detail.html", context, status=400)


@login_required
@require_http_methods(["GET", "POST"])
def task_edit(request: HttpRequest, pk: Any) -> HttpResponse:
    """Change a task: only the fields whose text changed are sent to the update service."""
    task = task_to_change(request.user, pk)
    initial = TaskForm.initial_for(task)
    form = TaskForm(request.POST or None, initial=initial, zone=task.timezone, user=request.user, task=task)
    if request.method == "POST" and form.is_valid():
        saved = _update_from_form(request, task, form)
        if saved is not None:
            if saved:
                messages.success(request, f"Saved: {', '.join(sorted(saved))}.")
            else:
                messages.info(request, "Nothing changed.")
            return redirect("backoffice:task", pk=task.pk)
    code = 400 if request.method == "POST" else 200
    return render(request, "backoffice/task_edit.html", {"task": task, "form": form}, status=code)


def _update_from_form(request: HttpRequest, task: Any, form: TaskForm) -> list[str] | None:
    """Apply an edit as the API's PATCH does (a team change is a move, then the other changes,
    in one transaction): the names of the fields changed; None, with the errors on the form,
    when refused."""
    changes = form.changes()
    target = _form_team(request, form, task.team)
    if target is None:
        return None
    if target.pk != task.team_id:
        changes["team"] = target.slug
    entries = form.after_entries(target.pk)
    if entries is None:
        return None
    if form.after_changed(entries):
        changes["after"] = entries
    if not changes:
        return []
    serializer = TaskUpdateSerializer(task, data=changes, context={"request": request})
    if not serializer.is_valid():
        add_errors(form, serializer.errors)
        return None
    validated = dict(serializer.validated_data)
    team = validated.pop("team", None)
    user = request_user(request)
    try:
        with transaction.atomic():  # a move and the other changes, or neither
            if team is not None:
                task = task_move(task=task, team=team, user=user, replacing=set(validated))
            if validated:
                task_update(task=task, actor=actor_for(user), changes=validated)
    except SERVICE_ERRORS as exc:
        add_service_errors(form, exc)
        return None
    return sorted(changes)


@login_required
@require_POST
def task_move_view(request: HttpRequest, pk: Any) -> HttpResponse:
    """Move the task to another team (``team``: its slug), by the API's service: editor in both
    teams; what keeps it in its team (its calendar, limits, followers, ...) is said in messages."""
    task = task_to_change(request.user, pk)
    try:
        team = team_resolve(request.user, request.POST.get("team", ""))
        if team.pk == task.team_id:
            messages.info(request, f"{task} is in team {team.name} already.")
            return redirect("backoffice:task", pk=task.pk)
        task_move(task=task, team=team, user=request_user(request))
    except SERVICE_ERRORS as exc:
        messages.error(request, f"{task} was not moved:")
        flash_errors(request, exc)
        return redirect("backoffice:task", pk=task.pk)
    messages.success(
        request, f"Moved {task} to team {team.name}: its runs, past and waiting, moved with it; its members see it now."
    )
    return redirect("backoffice:task", pk=task.pk)


# --- executions ---------------------------------------------------------------------------------


def attempt_chain(execution: Execution, user: Any) -> tuple[list[Execution], list[Execution]]:
    """The executions this one runs again (oldest first) and those that ran it again (in order)."""
    scope = visible_executions(user)
    before: list[Execution] = []
    seen, current = {execution.pk}, execution
    while current.retry_of_id and current.retry_of_id not in seen and len(before) < 20:
        earlier = scope.filter(pk=current.retry_of_id).first()
        if earlier is None:
            break
        current = earlier
        seen.add(current.pk)
        before.append(current)
    after: list[Execution] = []
    current = execution
    while len(after) < 20:
        later = scope.filter(retry_of=current).first()
        if later is None or later.pk in seen:
            break
        current = later
        seen.add(current.pk)
        after.append(current)
    return list(reversed(before)), after


def live_output(execution: Execution) -> str | None:
    """A RUNNING execution's output so far, from its runner (None when it cannot say)."""
    if execution.status != ExecutionStatus.RUNNING or not execution.external_run_id:
        return None
    try:
        runner = get_runner(execution.task.runner)
        handle = RunHandle(execution.external_run_id, dict(execution.run_handle or {}))
        return runner.output_so_far(run_spec(execution, execution.task), handle)
    except Exception as exc:  # noqa: BLE001 - a page never fails on a runner's trouble
        logger.info("output so far of execution %s unavailable: %s", execution.pk, exc)
        return None


def flower_task_url(message_id: str) -> str:
    """Flower's page of the Celery task that carried the execution (its message id), without a
    trailing slash (Flower's route is ``/task/(.+)``: a slash becomes part of the id, a 404);
    empty for a run never sent to Celery. Its context name is ``flower_task_url``: ``flower_url``
    is the top bar's link to Flower's home (context_processors.py), which it must not shadow."""
    return f"{settings.TMS_FLOWER_URL}/task/{message_id}" if message_id else ""


def execution_context(request: HttpRequest, execution: Execution) -> dict[str, Any]:
    before, after = attempt_chain(execution, request.user)
    events = list(execution.events.order_by("id"))
    row = run_row(execution)
    may_act = may_change_execution(request.user, execution)
    return {
        "execution": execution,
        "task": execution.task,
        "events": events,
        "row": row,
        "retry_of_chain": before,
        "retried_by": after,
        "live_output": live_output(execution),
        "run_handle": pretty_json(mask_config(execution.run_handle or {})),
        "run_input": None if execution.input is None else pretty_json(masked_input(execution.input)),
        "run_config": (
            None if execution.config_override is None else pretty_json(masked_run_config(execution.config_override))
        ),
        "idempotency_key": idempotency_key(execution.pk, execution.attempt),
        "flower_task_url": flower_task_url(execution.message_id),
        "trace_url": trace_page_url(execution),
        "can_cancel": may_act and execution.status in ACTIVE_STATUSES,
        "can_retry": may_act and execution.status in RETRYABLE_STATUSES and not after,
        "can_replay": may_act and execution.status in TERMINAL_STATUSES,
        "active": execution.status in ACTIVE_STATUSES,
    }


@login_required
def execution_detail(request: HttpRequest, pk: int) -> HttpResponse:
    execution = execution_or_404(request.user, pk)
    if request.GET.get("fragment"):
        return render(request, "backoffice/_execution_live.html", execution_context(request, execution))
    context = execution_context(request, execution)
    # The settings it ran with, and what changed since (not refreshed: they do not change).
    context["version"] = version_comparison(
        task_id=execution.task_id, ran=execution.task_version, current=execution.task.version
    )
    context["approval"] = approval_panel(request.user, execution)
    return render(request, "backoffice/execution_detail.html", context)


@login_required
def workflow_run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A workflow run (named by its root's execution id): its graph, drawn server-side, and its
    steps in a table. A step's id leads to its workflow run's page."""
    execution = execution_or_404(request.user, pk)
    if execution.workflow_run is not None and execution.workflow_run != execution.pk:
        return redirect("backoffice:workflow-run", pk=execution.workflow_run)
    run = workflow_run_read(execution)
    control = workflow_run_hold(execution.pk)
    hold = control.hold if control is not None else WorkflowRunHold.ACTIVE
    state = workflow_run_state(run.state, hold)
    steps = [{"step": step, "word": state_word(step)} for step in run.ordered()]
    names = {step.task.pk: str(step.task) for step in run.steps.values()}
    return render(
        request,
        "backoffice/workflow_run.html",
        {
            "run": run,
            "root": execution,
            "state": state,
            "hold_reason": control.reason if control is not None and hold != WorkflowRunHold.ACTIVE else "",
            "can_control": may_change_execution(request.user, execution),
            "graph": workflow_graph(run),
            "steps": steps,
            "links": sorted(
                (
                    {
                        "link": link,
                        "upstream": names[link.upstream],
                        "task": names[link.task],
                        "words": run.link_words(link),
                    }
                    for link in run.links
                ),
                key=lambda row: (run.steps[row["link"].task].depth, row["task"].lower(), row["upstream"].lower()),
            ),
        },
    )


@login_required
@require_POST
def execution_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    execution = execution_to_change(request.user, pk)
    flash_outcome(
        request,
        lambda: execution_cancel_by_user(execution=execution, actor=actor_for(request_user(request))),
        lambda report: f"Execution {execution.pk} cancelled. {report.detail}".strip(),
    )
    return redirect("backoffice:execution", pk=execution.pk)


@login_required
@require_POST
def execution_retry_view(request: HttpRequest, pk: int) -> HttpResponse:
    execution = execution_to_change(request.user, pk)
    try:
        retry = execution_retry_by_user(execution=execution, actor=actor_for(request_user(request)))
    except SERVICE_ERRORS as exc:
        flash_errors(request, exc)
        return redirect("backoffice:execution", pk=execution.pk)
    messages.success(request, f"Execution {retry.pk} retries execution {execution.pk}.")
    return redirect("backoffice:execution", pk=retry.pk)


@login_required
def execution_list(request: HttpRequest) -> HttpResponse:
    """Executions the user may see: what ran (and runs), newest scheduled time first; waiting ones
    (SCHEDULED, many of them future occurrences) only when asked for, soonest due first.

    Keyset pages ("Older" continues after the last row shown) on ``(scheduled_for, id)``, served
    by the ``execution_ran_idx`` index, or ``(due_at, id)`` for waiting runs (the monitor's
    ``execution_due_idx``): no count of the table, so a page costs the same at any size.
    """
    executions = visible_executions(request.user).select_related("task")
    executions, team, bad_team = team_switch(request, executions)
    status = request.GET.get("status", "")
    time_field, descending = "scheduled_for", True
    if status == ExecutionStatus.SCHEDULED:
        # In fire-time order (execution_waiting_idx): a run held back by a limit keeps its place
        # and says why; its due time is only its next re-check.
        executions = executions.filter(status=status)
        time_field, descending = "scheduled_for", False
    elif status in ExecutionStatus.values:
        executions = executions.filter(status=status)
    else:
        status = ""
        executions = executions.exclude(status=ExecutionStatus.SCHEDULED)
    # ?workflow_run=<root id>: the runs of one workflow run, as the API's filter of that name.
    workflow_run = request.GET.get("workflow_run", "").strip()
    bad_workflow_run = bool(workflow_run) and not (workflow_run.isdigit() and 0 < int(workflow_run) < 2**63)
    if bad_workflow_run:
        messages.error(request, f"workflow_run: {workflow_run[:40]!r} is not an execution id (a whole number).")
        workflow_run = ""
    elif workflow_run:
        executions = executions.filter(workflow_run=int(workflow_run))
    kept = (("status", status), ("team", team), ("workflow_run", workflow_run))
    context: dict[str, Any] = {
        "status": status,
        "team": team,
        "teams": visible_teams(request.user),
        "keep": urlencode({key: value for key, value in kept if value}),
        "workflow_run": workflow_run,
        "statuses": ExecutionStatus.values,
        "descending": descending,
        "waiting_runs": status == ExecutionStatus.SCHEDULED,
    }
    try:
        page = keyset_page(
            executions, column=time_field, descending=descending, cursor=request.GET.get("cursor"), size=PAGE_SIZE
        )
    except BadCursor as exc:
        messages.error(request, str(exc))
        context.update(page=None, rows=[])
        return render(request, "backoffice/execution_list.html", context, status=400)
    rows = [run_row(execution) for execution in page.rows]
    finished = [row for row in rows if row["execution"].status in TERMINAL_STATUSES]
    if finished:
        # Replay is an operator's act in each run's team (the service checks it again): a box
        # only where it would be allowed, so a viewer sees none.
        anywhere = request.user.has_perm("executions.change_execution")
        operated = (
            set() if anywhere else set(teams_with_role(request.user, TeamRole.OPERATOR).values_list("pk", flat=True))
        )
        for row in finished:
            row["replayable"] = anywhere or row["execution"].team_id in operated
    context.update(page=page, rows=rows, can_replay=any(row.get("replayable") for row in rows))
    bad = bad_team or bad_workflow_run
    return render(request, "backoffice/execution_list.html", context, status=400 if bad else 200)


def switched_team(request: HttpRequest, *, say: bool = True) -> tuple[Team | None, bool]:
    """The team the switcher names (``?team=<slug>``, or an id) among the user's teams (any team
    for staff): (None, False) when it names none; (None, True) when it names one that is not
    theirs, which is said in a message (unless ``say`` is False)."""
    value = request.GET.get("team", "").strip().replace("\x00", "")
    if not value:
        return None, False
    try:
        return team_resolve(request.user, value), False
    except InvalidInput as exc:
        if say:
            flash_errors(request, exc)
        return None, True


def team_switch(request: HttpRequest, rows: QuerySet) -> tuple[QuerySet, str, bool]:
    """The team switcher of the lists (``?team=<slug>``): ``rows`` of that one of the user's
    teams; a team that is not theirs is said so (and the list is not narrowed)."""
    team, bad = switched_team(request)
    if team is None:
        return rows, "", bad
    return rows.filter(team_id=team.pk), team.slug, False
