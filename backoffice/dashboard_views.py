"""The dashboard at ``/``: what runs, what fails, what is late, at a glance.

Its numbers come from :func:`executions.dashboard.dashboard_snapshot` (a per-minute rollup and
the partial indexes of live states, a fixed number of queries whatever the table sizes), for the
user's teams or the one the switcher names (``?team=``); this module only lays them out and
draws the charts (:mod:`backoffice.charts`). The page refreshes
its body in place every ``TMS_DASHBOARD_REFRESH`` seconds from :func:`dashboard_fragment`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render

from backoffice import charts
from backoffice.views import switched_team
from executions.dashboard import OUTCOMES, DashboardSnapshot, dashboard_snapshot, lateness_point
from tasks_app.models import Team
from tasks_app.teams import visible_teams

#: Spans the per-minute charts can show (the snapshot holds the last 24 h), the default first:
#: minutes shown, minutes per bar, the span in words. A day is drawn in 5-minute bars: 1,440
#: one-minute bars with a tooltip each were 377 KiB of a 427 KiB page and most of its render.
WINDOWS = {"24h": (1440, 5, "24 hours"), "6h": (360, 1, "6 hours"), "1h": (60, 1, "hour")}


def chart_window(request: HttpRequest) -> str:
    window = request.GET.get("window", "")
    return window if window in WINDOWS else next(iter(WINDOWS))


def dashboard_context(snapshot: DashboardSnapshot, window: str = "24h") -> dict[str, Any]:
    """The snapshot, its totals and its charts (per-minute ones over ``window``), for the template."""
    minutes, per, words = WINDOWS[window]
    points = snapshot.points(minutes, per)
    failing = [
        {"task": task, "share": task.failures / task.runs if task.runs else 1.0} for task in snapshot.top_failing_tasks
    ]
    return {
        "s": snapshot,
        "outcomes": [(outcome, charts.OUTCOME_COLOURS[outcome]) for outcome in OUTCOMES],
        "runs_last_hour_total": sum(snapshot.runs_last_hour.values()),
        "skipped_total": sum(snapshot.skipped_by_reason.values()),
        "failing": failing,
        "runs_chart": charts.runs_per_minute(points, OUTCOMES, span=words, per_minutes=per),
        "lateness_chart": charts.lateness_per_minute(
            [lateness_point(point) for point in points], span=words, per_minutes=per
        ),
        "per": charts.per_words(per),
        "window": window,
        "windows": list(WINDOWS),
        "duration_chart": charts.duration_by_runner(snapshot.duration_by_runner),
        "upcoming_chart": charts.upcoming_strip(snapshot.upcoming, snapshot.now),
        "refresh_every": settings.TMS_DASHBOARD_REFRESH,
    }


def _switch(team: Team | None) -> dict[str, Any]:
    """What the page needs of the team switcher: the team shown (its slug, "" for all the user's
    teams) and the query string that keeps it in the page's links."""
    slug = team.slug if team is not None else ""
    return {"team": slug, "team_query": f"&{urlencode({'team': slug})}" if slug else ""}


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """The figures of the user's teams (staff: everyone's); ``?team=`` narrows them to one of
    those teams, as the lists' switcher does (a team not theirs: said so, 400, not narrowed)."""
    team, bad = switched_team(request)
    snapshot = dashboard_snapshot(user=request.user, team=team)
    context = dashboard_context(snapshot, chart_window(request)) | _switch(team)
    context["teams"] = visible_teams(request.user)
    return render(request, "backoffice/dashboard.html", context, status=400 if bad else 200)


@login_required
def dashboard_fragment(request: HttpRequest) -> HttpResponse:
    """The dashboard's body alone, for the in-place refresh (``?team=`` as the page's; a team
    not the user's is a 400 with the reason, which the page shows as a failed refresh)."""
    team, bad = switched_team(request, say=False)
    if bad:
        return HttpResponseBadRequest("No such team of yours.", content_type="text/plain")
    snapshot = dashboard_snapshot(user=request.user, team=team)
    context = dashboard_context(snapshot, chart_window(request)) | _switch(team)
    return render(request, "backoffice/_dashboard_body.html", context)
