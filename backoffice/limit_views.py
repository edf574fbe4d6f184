"""The back office's named limits: the list, a new limit, a limit's edit form, its deletion.

Every write validates with the API's serializer (:class:`tasks_api.limits_api.LimitSerializer`,
the rules and messages of ``/api/v1/limits``) and calls the API's service
(:mod:`tasks_api.limits`); errors land on the form's fields. Who may act is the API's rule:
members of a team see its limits and the global ones, its editors create, change and delete
them; a global limit is staff's (with the model permission). The buttons show what the role
allows, and each POST checks it again (403).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from backoffice.team_objects import TeamObjectForm, editor_may, editor_required, list_context, parsed_field
from executions.limits import limit_usage, limits_in_use
from tasks_api.limits import limit_create, limit_delete, limit_update, limits_visible
from tasks_api.limits_api import LimitSerializer
from tasks_app.models import Limit, LimitScope, TaskStatus, TeamRole
from tasks_app.teams import member_team_ids, sees_all, with_role
from tms_core.auth import request_user
from tms_core.durations import format_duration, parse_duration
from tms_core.errors import RoleRequired
from tms_core.form_errors import flash_outcome, save_validated

#: Rows the list shows (teams hold a handful; a page never renders without bound).
LIST_MOST = 500
#: The team menu's value for a global limit (staff with the permission only).
GLOBAL = "__global__"
_WINDOW = re.compile(r"^\s*(\d+)\s*(?:per|/)\s*(\S.*?)\s*$")


def windows_text(windows: Any) -> str:
    """A limit's rate windows as the form shows them: ``10 per 1s, 1000 per 1h``."""
    return ", ".join(
        f"{window['count']} per {format_duration(timedelta(seconds=window['seconds']))}" for window in windows or ()
    )


def parse_windows(text: str) -> list[dict[str, Any]]:
    """``10 per 1s, 1000 per 1h`` (or ``10/1s``; commas or lines between) as the API's windows;
    ValueError in words when an item is neither."""
    windows = []
    for item in re.split(r"[,\n;]", text):
        if not item.strip():
            continue
        match = _WINDOW.match(item)
        if not match:
            raise ValueError(f'{item.strip()!r}: write each window as "<count> per <duration>", e.g. "10 per 1s".')
        try:
            seconds = parse_duration(match.group(2)).total_seconds()
        except ValueError as exc:
            raise ValueError(f"{item.strip()!r}: {exc}") from None
        windows.append({"count": int(match.group(1)), "seconds": seconds})
    return windows


class LimitForm(TeamObjectForm):
    """A named limit: the fields of ``POST /api/v1/limits`` (the team only on a new one)."""

    plural = "limits"

    team = forms.ChoiceField(help_text="Its tasks may name it; its editors change it. A limit stays in its team.")
    name = forms.CharField(max_length=100, help_text="What tasks name it by, e.g. api.example.com.")
    scope = forms.ChoiceField(
        choices=[
            (LimitScope.KEY, "key: one shared budget"),
            (LimitScope.RUNNER, "runner: one per runner"),
            (LimitScope.HOST, "host: one per target host"),
        ],
        initial=LimitScope.KEY,
        label="Budget",
        help_text="Who shares it: every run that names the limit, the runs of each runner, or of each target.",
    )
    key = forms.CharField(required=False, max_length=200, help_text="Scope key only: the budget's name (optional).")
    max_concurrency = forms.IntegerField(
        required=False, min_value=1, label="At most this many at once", help_text="Empty: no cap on running runs."
    )
    windows = forms.CharField(
        required=False,
        max_length=500,
        label="Rate windows",
        help_text='Starts per window, e.g. "10 per 1s, 1000 per 1h". Empty: no rate limit (then a cap is needed).',
    )

    def team_choices(self, user: Any) -> list[tuple[str, str]]:
        """The teams' menu, and a global limit for staff with the permission."""
        choices = super().team_choices(user)
        if sees_all(user) and user.has_perm("tasks_app.add_limit"):
            choices.append((GLOBAL, "Global: any team's task may name it"))
        return choices

    def clean_windows(self) -> list[dict[str, Any]]:
        return parsed_field(parse_windows, self.cleaned_data.get("windows"))

    @classmethod
    def initial_for(cls, limit: Limit) -> dict[str, Any]:
        return {
            "name": limit.name,
            "scope": limit.scope,
            "key": limit.key,
            "max_concurrency": limit.max_concurrency,
            "windows": windows_text(limit.windows),
        }

    def api_input(self) -> dict[str, Any]:
        """The API's input of every field (``team`` as its slug, or ``is_global``)."""
        data = self.cleaned_data
        result: dict[str, Any] = {
            "name": data["name"],
            "scope": data["scope"],
            "key": data.get("key") or "",
            "max_concurrency": data.get("max_concurrency"),
            "windows": data.get("windows") or [],
        }
        if "team" in self.fields:
            if data.get("team") == GLOBAL:
                result["is_global"] = True
            else:
                result["team"] = data.get("team")
        return result


def visible_limits(user: Any) -> QuerySet[Limit]:
    """The limits ``user`` reads (their teams' and the global ones; staff: all), each with the
    user's role in its team and how many tasks (not deleted) name it, in the one query."""
    using = Count("tasks", filter=~Q(tasks__status=TaskStatus.DELETED), distinct=True)
    return with_role(limits_visible(user=user), user).select_related("team").annotate(task_count=using)


def may_change(user: Any, limit: Limit, verb: str = "change") -> bool:
    """The API's rule: an editor of the limit's team (or the model permission); a global limit,
    staff with the permission."""
    if limit.team_id is None:
        return sees_all(user) and user.has_perm(f"tasks_app.{verb}_limit")
    return editor_may(user, limit, f"tasks_app.{verb}_limit")


def _limit_to_change(request: HttpRequest, pk: int, verb: str = "change") -> Limit:
    limit = get_object_or_404(visible_limits(request.user), pk=pk)
    if not may_change(request.user, limit, verb):
        if limit.team_id is None:
            held = getattr(limit, "caller_role", None)
            raise RoleRequired("Only staff may change a global limit.", role=TeamRole.EDITOR, held=held)
        raise editor_required(limit, "limit", "limits")
    return limit


def _shared_use_teams(user: Any) -> set[int] | None:
    """Whose runs a user sees counted in a global limit's use: every team's for staff, their own
    teams' for anyone else (the API's rule: another team's use of a shared budget never shows)."""
    return None if sees_all(user) else set(member_team_ids(user).values_list("team_id", flat=True))


def _in_use(user: Any, limits: list[Limit]) -> dict[int, dict[str, int]]:
    """Each limit's runs running and waiting (see :func:`executions.limits.limits_in_use`)."""
    shared = [limit.pk for limit in limits if limit.team_id is None]
    # The reader's teams are read even with no global limit on the page: a fixed number of queries.
    return limits_in_use(limit_ids=[limit.pk for limit in limits], shared=shared, team_ids=_shared_use_teams(user))


def _page(request: HttpRequest, form: LimitForm) -> dict[str, Any]:
    def rows(limits: list[Limit]) -> list[dict[str, Any]]:
        use = _in_use(request.user, limits)
        return [
            {
                "limit": limit,
                "windows": windows_text(limit.windows),
                "can_change": may_change(request.user, limit),
                "use": use[limit.pk],
            }
            for limit in limits
        ]

    return list_context(visible_limits(request.user), form, LIST_MOST, rows)


@login_required
@require_GET
def limits_page(request: HttpRequest) -> HttpResponse:
    return render(request, "backoffice/limits.html", _page(request, LimitForm(user=request.user)))


@login_required
@require_POST
def limit_create_view(request: HttpRequest) -> HttpResponse:
    form = LimitForm(request.POST, user=request.user)
    form.require_team()
    if form.is_valid():
        serializer = LimitSerializer(data=form.api_input(), context={"request": request})

        def create(validated: Any) -> Limit:
            data = dict(validated)
            is_global = data.pop("global_", False)
            team = data.pop("team", None)
            return limit_create(owner=None if is_global else request_user(request), team=team, **data)

        limit = save_validated(form, serializer, create, field_map={"is_global": "team"})
        if limit is not None:
            where = "global" if limit.team is None else f"of team {limit.team.name}"
            messages.success(request, f"Limit {limit.name} ({where}) defined: tasks may name it now.")
            return redirect("backoffice:limits")
    return render(request, "backoffice/limits.html", _page(request, form), status=400)


@login_required
@require_GET
def limit_page(request: HttpRequest, pk: int) -> HttpResponse:
    """A limit as everyone who may read it sees it: its budget, what each of its buckets holds now
    (runs running of the cap, runs waiting, starts in each rate window), and the tasks naming it."""
    limit = get_object_or_404(visible_limits(request.user), pk=pk)
    teams = _shared_use_teams(request.user) if limit.team_id is None else None
    buckets = limit_usage(limit=limit, team_ids=teams)
    for bucket in buckets:
        for window in bucket["windows"]:
            window["label"] = format_duration(timedelta(seconds=window["seconds"]))
    tasks = limit.tasks.exclude(status=TaskStatus.DELETED).select_related("team").order_by("name", "id")
    if teams is not None:  # a global limit: only the tasks of the user's teams
        tasks = tasks.filter(team_id__in=teams)
    named = list(tasks[: LIST_MOST + 1])
    context = {
        "limit": limit,
        "windows": windows_text(limit.windows),
        "buckets": buckets,
        "only_own_teams": teams is not None,
        "tasks": named[:LIST_MOST],
        "more_tasks": len(named) > LIST_MOST,
        "most": LIST_MOST,
        "can_change": may_change(request.user, limit),
    }
    return render(request, "backoffice/limit.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def limit_edit_view(request: HttpRequest, pk: int) -> HttpResponse:
    """A limit's form: only the fields changed are sent (a new scope or key resets its budgets)."""
    limit = _limit_to_change(request, pk)
    if request.method == "GET":
        form = LimitForm(initial=LimitForm.initial_for(limit), editing=True)
        return render(request, "backoffice/limit_edit.html", {"limit": limit, "form": form})
    initial = LimitForm.initial_for(limit)
    form = LimitForm(request.POST, initial=initial, editing=True)
    if form.is_valid():
        wanted = form.api_input()
        now = {**initial, "windows": limit.windows, "key": limit.key}
        changes = {name: value for name, value in wanted.items() if value != now.get(name)}
        if not changes:
            messages.info(request, f"Limit {limit.name}: nothing changed.")
            return redirect("backoffice:limits")
        serializer = LimitSerializer(limit, data=changes, partial=True, context={"request": request})
        saved = save_validated(
            form,
            serializer,
            lambda validated: limit_update(
                limit=limit, changes={name: value for name, value in validated.items() if name != "global_"}
            ),
        )
        if saved is not None:
            messages.success(
                request,
                f"Limit {limit.name} saved ({', '.join(sorted(changes))}): the next run to start counts by it.",
            )
            return redirect("backoffice:limits")
    return render(request, "backoffice/limit_edit.html", {"limit": limit, "form": form}, status=400)


@login_required
@require_POST
def limit_delete_view(request: HttpRequest, pk: int) -> HttpResponse:
    limit = _limit_to_change(request, pk, "delete")
    flash_outcome(request, lambda: limit_delete(limit=limit), lambda _: f"Limit {limit.name} deleted.")
    return redirect("backoffice:limits")
