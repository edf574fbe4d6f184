"""A task's versions in the back office: the list, one version's settings with its diff to the
current one, and "Restore this version" through the API's restore service
(:func:`tasks_api.restore.task_version_restore`: an editor's change, audited, a new version)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from backoffice.keyset import BadCursor, keyset_page
from backoffice.scope import task_abilities, task_to_change, visible_tasks
from tasks_api.restore import task_version_restore
from tasks_app.models import TaskVersion
from tasks_app.teams import with_role
from tasks_app.versions import version_comparison, version_first_ensure
from tms_core.auth import actor_for, request_user
from tms_core.form_errors import SERVICE_ERRORS, flash_errors

#: Versions a page of the versions list shows.
VERSIONS_PAGE = 50


@login_required
def task_versions(request: HttpRequest, pk: Any) -> HttpResponse:
    """A task's versions, newest first: who made each, when, from where and what it changed."""
    task = get_object_or_404(with_role(visible_tasks(request.user), request.user), pk=pk)
    if task.version == 1:
        version_first_ensure(task.pk)  # written lazily (tasks_app.versions)
    rows = TaskVersion.objects.filter(task_id=task.pk).only(
        "number", "created_at", "actor_name", "source", "changed", "task_id"
    )
    try:
        page = keyset_page(rows, column="number", descending=True, cursor=request.GET.get("cursor"), size=VERSIONS_PAGE)
    except BadCursor as exc:
        messages.error(request, str(exc))
        page = keyset_page(rows, column="number", descending=True, cursor=None, size=VERSIONS_PAGE)
    context = {"task": task, "page": page, "versions": page.rows, "keep": "", "descending": True}
    context.update(task_abilities(request.user, task))
    return render(request, "backoffice/task_versions.html", context)


@login_required
def task_version_detail(request: HttpRequest, pk: Any, number: int) -> HttpResponse:
    """One version of a task: its settings and a diff to the current version, and "Restore this
    version" for an editor."""
    task = get_object_or_404(with_role(visible_tasks(request.user), request.user), pk=pk)
    version = version_comparison(task_id=task.pk, ran=number, current=task.version)
    if version is None:
        raise Http404("The task has no such version.")
    context = {"task": task, "version": version, **task_abilities(request.user, task)}
    return render(request, "backoffice/task_version.html", context)


@login_required
@require_POST
def task_version_restore_view(request: HttpRequest, pk: Any, number: int) -> HttpResponse:
    """Give the task this version's settings again: the API's restore service (an editor's
    change, audited, a new version)."""
    task = task_to_change(request.user, pk)
    try:
        report = task_version_restore(
            task=task,
            number=number,
            user=request_user(request),
            actor=actor_for(request_user(request)),
            request=request,
        )
    except SERVICE_ERRORS as exc:
        flash_errors(request, exc)
        return redirect("backoffice:task-versions", pk=task.pk)
    if report.changed:
        messages.success(
            request,
            f"Restored version {number}: changed {', '.join(report.changed)}; the task is at version {report.version}.",
        )
    else:
        messages.info(request, f"Version {number} has the task's current settings: nothing changed.")
    return redirect("backoffice:task", pk=task.pk)
