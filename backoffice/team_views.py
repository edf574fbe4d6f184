"""The back office's teams: the user's teams with their role, a new team, and each team's members.

Every write calls the services the API calls (:mod:`tasks_app.teams.services`), with the same rules: a team
the user is not in answers 404, a change by a member who is not an admin 403, and the services'
refusals (a taken slug, the last admin, a personal team's one member) are shown on the form.

A team's page lists its service accounts too (its members see them); its admins make and delete
them there, and each account's page (admins only, as its tokens are in the API) creates and
revokes its tokens, through :mod:`accounts.service_accounts`. A new key is rendered into the
answer to the POST that made it, and stored nowhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from accounts.api import AccessTokenSerializer
from accounts.models import AccessToken, ServiceAccount
from accounts.service_accounts import (
    ROLE_CHOICES,
    live_accounts,
    service_account_create,
    service_account_delete,
    service_account_token_create,
)
from backoffice.forms import AccessTokenForm
from backoffice.token_views import revoke_with_message, token_rows
from tasks_app.models import Membership, Team, TeamRole
from tasks_app.teams import SERVICE_ACCOUNT, includes, people, require, visible_teams
from tasks_app.teams.services import member_remove, member_set, team_create, team_delete, team_rename
from tms_core.auth import request_user
from tms_core.form_errors import (
    add_errors,
    flash_outcome,
    save_cleaned,
)


class TeamForm(forms.Form):
    name = forms.CharField(max_length=100)
    slug = forms.SlugField(max_length=60, required=False, help_text="Empty: made from the name.")


class MemberForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=TeamRole.choices, initial=TeamRole.VIEWER)


class RenameForm(forms.Form):
    name = forms.CharField(max_length=100)


class ServiceAccountForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What it is for, e.g. deploy-ci.")
    role = forms.ChoiceField(
        choices=ROLE_CHOICES,
        initial=TeamRole.OPERATOR,
        help_text="Its role in this team (never admin).",
    )


def _team(request: HttpRequest, pk: int) -> Team:
    return get_object_or_404(visible_teams(request.user), pk=pk)


#: Where :func:`_team_context` takes each admin form of the team page (shown again when refused).
_FORM_SLOTS: dict[type[forms.Form], str] = {
    MemberForm: "member_form",
    RenameForm: "rename_form",
    ServiceAccountForm: "account_form",
}


def _admin(request: HttpRequest, team: Team) -> None:
    require(request.user, team.pk, TeamRole.ADMIN, "tasks_app.change_team", what="this team")


def _teams_context(request: HttpRequest, form: TeamForm) -> dict[str, Any]:
    # People only: a team's service accounts are on its own page, not counted as members.
    humans = Count("memberships", filter=Q(**{f"memberships__user__{SERVICE_ACCOUNT}__isnull": True}))
    teams = visible_teams(request.user).annotate(member_count=humans).order_by("slug")
    return {"teams": teams, "form": form}


@login_required
@require_GET
def teams_page(request: HttpRequest) -> HttpResponse:
    return render(request, "backoffice/teams.html", _teams_context(request, TeamForm()))


@login_required
@require_POST
def team_create_view(request: HttpRequest) -> HttpResponse:
    form = TeamForm(request.POST)
    team = save_cleaned(form, lambda data: team_create(creator=request.user, **data))
    if team is not None:
        messages.success(request, f"Team {team.name} created: you are its admin.")
        return redirect("backoffice:team", pk=team.pk)
    return render(request, "backoffice/teams.html", _teams_context(request, form), status=400)


def _team_context(request: HttpRequest, team: Team, **forms_: Any) -> dict[str, Any]:
    members = people(Membership.objects.filter(team=team)).select_related("user").order_by("user__username")
    return {
        "team": team,
        "members": members,
        "roles": TeamRole.choices,
        "can_manage": _can_manage(request, team),
        "member_form": forms_.get("member_form") or MemberForm(),
        "rename_form": forms_.get("rename_form") or RenameForm(initial={"name": team.name}),
        "service_accounts": live_accounts(team),
        "account_form": forms_.get("account_form") or ServiceAccountForm(),
    }


def _can_manage(request: HttpRequest, team: Team) -> bool:
    """Whether the page shows the admin's buttons (the POSTs check again, by :func:`_admin`)."""
    return includes(getattr(team, "caller_role", None), TeamRole.ADMIN) or request.user.has_perm(
        "tasks_app.change_team"
    )


def _admin_form_post(
    request: HttpRequest,
    pk: int,
    form_class: type[forms.Form],
    save: Callable[[Team, dict[str, Any]], Any],
    said: Callable[[Team, Any], str],
    then: Callable[[Team, Any], HttpResponse] | None = None,
) -> HttpResponse:
    """A team admin's form POST from the team page: the team (404 unless the user sees it), the
    admin role in it (403), the form saved through the service ``save(team, cleaned data)``, then
    the message ``said(team, what it returned)`` and ``then`` (default: back to the team page). A
    refused form (by itself or by the service, its errors on its fields) is the team page again
    with it, 400."""
    team = _team(request, pk)
    _admin(request, team)
    form = form_class(request.POST)
    made = save_cleaned(form, lambda data: save(team, data))
    if made is None:
        slot = _FORM_SLOTS[form_class]
        return render(request, "backoffice/team.html", _team_context(request, team, **{slot: form}), status=400)
    messages.success(request, said(team, made))
    return then(team, made) if then is not None else redirect("backoffice:team", pk=team.pk)


@login_required
@require_GET
def team_page(request: HttpRequest, pk: int) -> HttpResponse:
    team = _team(request, pk)
    return render(request, "backoffice/team.html", _team_context(request, team))


@login_required
@require_POST
def team_member_set_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Add a member or change a member's role (the same form: username and role)."""
    return _admin_form_post(
        request,
        pk,
        MemberForm,
        lambda team, data: member_set(team=team, **data),
        lambda team, member: f"{member.user.get_username()} is {member.role} of {team.name}.",
    )


@login_required
@require_POST
def team_member_remove_view(request: HttpRequest, pk: int, username: str) -> HttpResponse:
    team = _team(request, pk)
    if username != request.user.get_username():  # leaving a team needs no role
        _admin(request, team)
    removed = flash_outcome(
        request, lambda: member_remove(team=team, username=username), lambda _: f"{username} removed from {team.name}."
    )
    if removed and username == request.user.get_username():
        return redirect("backoffice:teams")
    return redirect("backoffice:team", pk=team.pk)


@login_required
@require_POST
def team_rename_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _admin_form_post(
        request,
        pk,
        RenameForm,
        lambda team, data: team_rename(team=team, **data),
        lambda _, team: f"Renamed to {team.name}.",
    )


@login_required
@require_POST
def team_delete_view(request: HttpRequest, pk: int) -> HttpResponse:
    team = _team(request, pk)
    _admin(request, team)
    if not flash_outcome(request, lambda: team_delete(team=team), lambda _: f"Team {team.name} deleted."):
        return redirect("backoffice:team", pk=team.pk)
    return redirect("backoffice:teams")


# -- Service accounts ----------------------------------------------------------------------------


@login_required
@require_POST
def service_account_create_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _admin_form_post(
        request,
        pk,
        ServiceAccountForm,
        lambda team, data: service_account_create(team=team, creator=request_user(request), **data),
        lambda _, account: f"Service account {account.name} created: give it a token below.",
        lambda team, account: redirect("backoffice:service-account", pk=team.pk, account=account.pk),
    )


def _account(request: HttpRequest, pk: int, account: int) -> tuple[Team, ServiceAccount]:
    """The team (404 unless the user sees it), the user's admin role in it (403), its live account (404)."""
    team = _team(request, pk)
    _admin(request, team)
    return team, get_object_or_404(live_accounts(team), pk=account)


def _account_page(team: Team, account: ServiceAccount, form: AccessTokenForm, **extra: Any) -> dict[str, Any]:
    rows = token_rows(
        AccessToken.objects.filter(user_id=account.user_id).order_by("-id"),
        lambda token: reverse("backoffice:service-account-token-revoke", args=[team.pk, account.pk, token.pk]),
    )
    return {"team": team, "account": account, "rows": rows, "form": form, **extra}


@login_required
@require_GET
def service_account_page(request: HttpRequest, pk: int, account: int) -> HttpResponse:
    team, found = _account(request, pk, account)
    return render(request, "backoffice/service_account.html", _account_page(team, found, AccessTokenForm()))


@login_required
@require_POST
def service_account_delete_view(request: HttpRequest, pk: int, account: int) -> HttpResponse:
    team, found = _account(request, pk, account)
    service_account_delete(account=found, actor=request_user(request))
    messages.success(request, f"Service account {found.name} deleted: its tokens stopped working.")
    return redirect("backoffice:team", pk=team.pk)


@login_required
@require_POST
def service_account_token_create_view(request: HttpRequest, pk: int, account: int) -> HttpResponse:
    team, found = _account(request, pk, account)
    form = AccessTokenForm(request.POST)
    if form.is_valid():
        # The API's serializer: the same rules and messages as POST .../service-accounts/{id}/tokens.
        serializer = AccessTokenSerializer(data=form.payload(), context={"user": request_user(request)})
        if serializer.is_valid():
            data = serializer.validated_data
            token, key = service_account_token_create(
                account=found, name=data["name"], scopes=data["scopes"], expires_at=data["expires_at"]
            )
            context = _account_page(team, found, AccessTokenForm(), new_token=token, new_key=key)
            return render(request, "backoffice/service_account.html", context, status=201)
        add_errors(form, serializer.errors, field_map={"expires_at": "expires_in"})
    return render(request, "backoffice/service_account.html", _account_page(team, found, form), status=400)


@login_required
@require_POST
def service_account_token_revoke_view(request: HttpRequest, pk: int, account: int, token: int) -> HttpResponse:
    team, found = _account(request, pk, account)
    revoke_with_message(request, get_object_or_404(AccessToken, pk=token, user_id=found.user_id))
    return redirect("backoffice:service-account", pk=team.pk, account=found.pk)
