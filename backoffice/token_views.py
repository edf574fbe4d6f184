"""The back office's personal access tokens: a user's own, created and revoked from one page.

Creating validates with the API's serializer (``POST /api/v1/tokens``: the same rules and
messages) and calls the same service (:mod:`accounts.tokens`). The new key is in the answer to
that POST only, rendered into the page rather than passed through the session's messages, so it
is stored nowhere. Tokens are personal: staff see their own here too (the admin lists everyone's).
A token may be scoped to one of the user's teams (the teams they are a member of, as the API
allows): the list shows each token's team.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from accounts.api import AccessTokenSerializer, token_create_validated
from accounts.models import AccessToken
from accounts.tokens import token_made, token_made_revoke, token_revoke
from backoffice.forms import AccessTokenForm
from tasks_app.models import Team
from tasks_app.teams import member_team_ids
from tms_core.auth import request_user
from tms_core.form_errors import add_errors


def _teams(request: HttpRequest) -> Any:
    """The teams a token may be scoped to: those the user is a member of (staff too)."""
    return Team.objects.filter(pk__in=member_team_ids(request_user(request))).order_by("slug")


def _form(request: HttpRequest, data: Any = None) -> AccessTokenForm:
    return AccessTokenForm(data, teams=_teams(request))


def token_rows(tokens: Iterable[AccessToken], revoke_url: Callable[[AccessToken], str]) -> list[dict[str, Any]]:
    """The rows of a token table (``backoffice/_tokens.html``): each token, its state in a word
    and where its revoke button posts."""
    now = timezone.now()
    return [
        {
            "token": token,
            "state": "revoked"
            if token.revoked_at is not None
            else ("expired" if token.expires_at is not None and token.expires_at <= now else "active"),
            "revoke_url": revoke_url(token),
        }
        for token in tokens
    ]


def revoke_with_message(request: HttpRequest, token: AccessToken) -> None:
    """Revoke ``token`` and say so (or that it was revoked already)."""
    if token_revoke(token=token):
        messages.success(request, f"Token {token.name} revoked: it stops working now.")
    else:
        messages.info(request, f"Token {token.name} was already revoked.")


def _page(request: HttpRequest, form: AccessTokenForm, **extra: Any) -> dict[str, Any]:
    tokens = AccessToken.objects.filter(user=request_user(request)).select_related("team").order_by("-id")
    rows = token_rows(tokens, lambda token: reverse("backoffice:token-revoke", args=[token.pk]))
    for row in rows:
        # What it made that outlives it (trigger URLs, memberships), to remove with a click.
        row["made"] = token_made(token=row["token"])
    return {"rows": rows, "form": form, **extra}


@login_required
@require_GET
def tokens_page(request: HttpRequest) -> HttpResponse:
    return render(request, "backoffice/tokens.html", _page(request, _form(request)))


@login_required
@require_POST
def token_create_view(request: HttpRequest) -> HttpResponse:
    form = _form(request, request.POST)
    if form.is_valid():
        serializer = AccessTokenSerializer(data=form.payload(), context={"user": request_user(request)})
        if serializer.is_valid():
            token, key = token_create_validated(user=request_user(request), data=serializer.validated_data)
            context = _page(request, _form(request), new_token=token, new_key=key)
            return render(request, "backoffice/tokens.html", context, status=201)
        add_errors(form, serializer.errors, field_map={"expires_at": "expires_in"})
    return render(request, "backoffice/tokens.html", _page(request, form), status=400)


@login_required
@require_POST
def token_revoke_view(request: HttpRequest, pk: int) -> HttpResponse:
    revoke_with_message(request, get_object_or_404(AccessToken, pk=pk, user=request_user(request)))
    return redirect("backoffice:tokens")


@login_required
@require_POST
def token_made_revoke_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Remove what one of the user's tokens made (:func:`accounts.tokens.token_made_revoke`)."""
    token = get_object_or_404(AccessToken, pk=pk, user=request_user(request))
    done = token_made_revoke(token=token)
    messages.success(
        request,
        f"Removed what token {token.name} made: {done.trigger_urls} trigger URL(s), {done.memberships} membership(s).",
    )
    for kept in done.kept:
        messages.warning(request, f"Kept {kept}")
    return redirect("backoffice:tokens")
