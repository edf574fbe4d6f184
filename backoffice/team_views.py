"""The back office's teams: the user's teams with their role, a new team, and each team's members.

Every write calls the services the API calls (:mod:`tasks_app.teams`), with the same rules: a team
the user is not in answers 404, a change by a member who is not an admin 403, and the services'
refusals (a taken slug, the last admin, a personal team's one member) are shown on the form.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from tasks_app.models import Membership, Team, TeamRole
from tasks_app.teams import (
    includes,
    member_remove,
    member_set,
    require,
    team_create,
    team_delete,
    team_rename,
    visible_teams,
)
from tms_core.form_errors import SERVICE_ERRORS, add_service_errors, exception_messages


class TeamForm(forms.Form):
    name = forms.CharField(max_length=100)
    slug = forms.SlugField(max_length=60, required=False, help_text="Empty: made from the name.")


class MemberForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=TeamRole.choices, initial=TeamRole.VIEWER)


class RenameForm(forms.Form):
    name = forms.CharField(max_length=100)


def _team(request: HttpRequest, pk: int) -> Team:
    return get_object_or_404(visible_teams(request.user), pk=pk)


def _admin(request: HttpRequest, team: Team) -> None:
    require(request.user, team.pk, TeamRole.ADMIN, "tasks_app.change_team", what="this team")


def _teams_context(request: HttpRequest, form: TeamForm) -> dict[str, Any]:
    teams = visible_teams(request.user).annotate(member_count=Count("memberships")).order_by("slug")
    return {"teams": teams, "form": form}


@login_required
@require_GET
def teams_page(request: HttpRequest) -> HttpResponse:
    return render(request, "backoffice/teams.html", _teams_context(request, TeamForm()))


@login_required
@require_POST
def team_create_view(request: HttpRequest) -> HttpResponse:
    form = TeamForm(request.POST)
    if form.is_valid():
        try:
            team = team_create(creator=request.user, **form.cleaned_data)
        except SERVICE_ERRORS as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"Team {team.name} created: you are its admin.")
            return redirect("backoffice:team", pk=team.pk)
    return render(request, "backoffice/teams.html", _teams_context(request, form), status=400)


def _team_context(request: HttpRequest, team: Team, **forms_: Any) -> dict[str, Any]:
    members = Membership.objects.filter(team=team).select_related("user").order_by("user__username")
    return {
        "team": team,
        "members": members,
        "roles": TeamRole.choices,
        "can_manage": includes(getattr(team, "caller_role", None), TeamRole.ADMIN)
        or request.user.has_perm("tasks_app.change_team"),
        "member_form": forms_.get("member_form") or MemberForm(),
        "rename_form": forms_.get("rename_form") or RenameForm(initial={"name": team.name}),
    }


@login_required
@require_GET
def team_page(request: HttpRequest, pk: int) -> HttpResponse:
    team = _team(request, pk)
    return render(request, "backoffice/team.html", _team_context(request, team))


@login_required
@require_POST
def team_member_set_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Add a member or change a member's role (the same form: username and role)."""
    team = _team(request, pk)
    _admin(request, team)
    form = MemberForm(request.POST)
    if form.is_valid():
        try:
            member_set(team=team, **form.cleaned_data)
        except SERVICE_ERRORS as exc:
            add_service_errors(form, exc)
        else:
            messages.success(request, f"{form.cleaned_data['username']} is {form.cleaned_data['role']} of {team.name}.")
            return redirect("backoffice:team", pk=team.pk)
    return render(request, "backoffice/team.html", _team_context(request, team, member_form=form), status=400)


@login_required
@require_POST
def team_member_remove_view(request: HttpRequest, pk: int, username: str) -> HttpResponse:
    team = _team(request, pk)
    if username != request.user.get_username():  # leaving a team needs no role
        _admin(request, team)
    try:
        member_remove(team=team, username=username)
    except SERVICE_ERRORS as exc:
        for message in exception_messages(exc):
            messages.error(request, message)
        return redirect("backoffice:team", pk=team.pk)
    messages.success(request, f"{username} removed from {team.name}.")
    if username == request.user.get_username():
        return redirect("backoffice:teams")
    return redirect("backoffice:team", pk=team.pk)


@login_required
@require_POST
def team_rename_view(request: HttpRequest, pk: int) -> HttpResponse:
    team = _team(request, pk)
    _admin(request, team)
    form = RenameForm(request.POST)
    if form.is_valid():
        team_rename(team=team, name=form.cleaned_data["name"])
        messages.success(request, f"Renamed to {team.name}.")
        return redirect("backoffice:team", pk=team.pk)
    return render(request, "backoffice/team.html", _team_context(request, team, rename_form=form), status=400)


@login_required
@require_POST
def team_delete_view(request: HttpRequest, pk: int) -> HttpResponse:
    team = _team(request, pk)
    _admin(request, team)
    try:
        team_delete(team=team)
    except SERVICE_ERRORS as exc:
        for message in exception_messages(exc):
            messages.error(request, message)
        return redirect("backoffice:team", pk=team.pk)
    messages.success(request, f"Team {team.name} deleted.")
    return redirect("backoffice:teams")
