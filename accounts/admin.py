"""Access tokens in the admin: everyone's, to find and revoke, with the team each is scoped to;
never their keys. Service accounts: every team's, to find and delete (through the same service as
the API: its tokens are revoked, it leaves its team); they are made by a team's admins, on the
team's page or through the API, where the admin role is checked. Teams and their members: made,
renamed, deleted, added, changed and removed through the team services the API calls
(:mod:`tasks_app.teams`), with its rules and its messages on the forms."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from accounts.models import AccessToken, OidcIdentity, ServiceAccount
from accounts.service_accounts import service_account_delete
from accounts.tokens import token_revoke
from executions.admin import error_text, run_for_each
from tasks_app.models import Membership, Team, TeamRole
from tasks_app.teams import people, require
from tasks_app.teams.services import member_remove, member_set, team_create, team_delete, team_rename
from tms_core.auth import request_user
from tms_core.form_errors import SERVICE_ERRORS
from tms_core.service_forms import ServiceFormAdmin, ServiceModelForm


@admin.register(AccessToken)
class AccessTokenAdmin(admin.ModelAdmin):
    """Tokens are created through the API (the key is shown to its owner only) and revoked here or there."""

    list_display = (
        "name", "user", "team", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at",
    )  # fmt: skip
    list_filter = ("revoked_at", ("team", admin.RelatedOnlyFieldListFilter))
    search_fields = ("name", "user__username", "lookup", "team__slug")
    list_select_related = ("user", "team")
    fields = readonly_fields = (
        "user", "name", "team", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at",
    )  # fmt: skip
    actions = ["revoke_selected"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoked, not deleted: the row names the token in the audit log

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        revoked = sum(token_revoke(token=token) for token in queryset)
        self.message_user(request, f"{revoked} token(s) revoked; {queryset.count() - revoked} were already revoked.")
        if not revoked:
            self.message_user(request, "Nothing to revoke.", level=messages.WARNING)


@admin.register(OidcIdentity)
class OidcIdentityAdmin(admin.ModelAdmin):
    """Who signs in through SSO as whom. Adding a row links a local account to the provider's
    subject (its next SSO sign-in then lands in that account); deleting one unlinks it."""

    list_display = ("user", "subject", "issuer", "created_at", "last_login_at", "groups")
    search_fields = ("user__username", "subject", "issuer")
    list_select_related = ("user",)
    raw_id_fields = ("user",)
    readonly_fields = ("created_at", "last_login_at", "groups")


@admin.register(ServiceAccount)
class ServiceAccountAdmin(admin.ModelAdmin):
    """Every team's service accounts, read-only; deleted only through the service (the row stays,
    marked deleted, its tokens revoked), never by removing the row, which would leave its tokens
    and its membership behind."""

    list_display = ("name", "team", "user", "role", "created_by", "created_at", "deleted_at")
    list_filter = (("deleted_at", admin.EmptyFieldListFilter), ("team", admin.RelatedOnlyFieldListFilter))
    search_fields = ("name", "user__username", "team__slug")
    list_select_related = ("user", "team", "created_by")
    fields = readonly_fields = ("name", "team", "user", "role", "created_by", "created_at", "deleted_at")
    actions = ["delete_accounts"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        held = Membership.objects.filter(user_id=OuterRef("user_id"), team_id=OuterRef("team_id")).values("role")
        return super().get_queryset(request).annotate(held_role=Subquery(held[:1]))

    @admin.display(description="role in its team")
    def role(self, account: ServiceAccount) -> str:
        return getattr(account, "held_role", None) or "-"  # none once deleted

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a team's admins make them (the team page, the API): the admin role is checked there

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the action below deletes through the service

    @admin.action(description="Delete selected service accounts (revokes their tokens)", permissions=["change"])
    def delete_accounts(self, request: HttpRequest, queryset: QuerySet) -> None:
        deleted = sum(service_account_delete(account=account, actor=request.user) for account in queryset)
        self.message_user(request, f"{deleted} service account(s) deleted; {queryset.count() - deleted} were already.")


# -- Teams and their members, through the team services (tasks_app.teams) ------------------------


class _Refused(Exception):
    """A service refused a delete confirmed on the admin's delete page; carries its words."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class _ServiceDeleteMixin(admin.ModelAdmin):
    """The delete page and the bulk action call a service, whose refusal is an error message
    on the object's page, never Django's "deleted successfully" (nor a 500)."""

    def remove(self, request: HttpRequest, obj: Any) -> str:
        """Delete ``obj`` through its service; returns what was done (raises its refusal)."""
        raise NotImplementedError

    def describe(self, obj: Any) -> str:
        """``obj`` in the messages."""
        return str(obj)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        try:
            self.remove(request, obj)
        except (*SERVICE_ERRORS, PermissionDenied) as exc:
            # Raised through Django's delete view, whose transaction then also drops the log
            # entry it wrote for the deletion that did not happen.
            raise _Refused(f"{self.describe(obj)}: not deleted: {error_text(exc)}") from exc

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> HttpResponse:
        try:
            return super().delete_view(request, object_id, extra_context)
        except _Refused as refused:
            self.message_user(request, refused.text, messages.ERROR)
            info = (self.opts.app_label, self.opts.model_name)
            return HttpResponseRedirect(reverse("admin:{}_{}_change".format(*info), args=[object_id]))

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # counts rows, not what the service did: remove_selected instead
        return actions

    @admin.action(description="Delete selected (through the team services)", permissions=["delete"])
    def remove_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        run_for_each(self, request, queryset, lambda obj: self.remove(request, obj), verb="deleted")


def _require_team_admin(request: HttpRequest, team: Team) -> None:
    """The API's rule for a team's changes: its admins, or staff with ``tasks_app.change_team``."""
    require(request_user(request), team.pk, TeamRole.ADMIN, "tasks_app.change_team", what="this team")


class TeamAdminForm(ServiceModelForm):
    """Creates (:func:`~tasks_app.teams.services.team_create`) or renames
    (:func:`~tasks_app.teams.services.team_rename`) while it is validated, so the services'
    refusals (a taken or reserved slug, an empty name) are errors on the form's fields."""

    class Meta:
        model = Team
        fields = ["name", "slug"]
        help_texts = {"slug": "Its unique short name (letters, digits, hyphens, underscores); fixed once made."}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "slug" in self.fields:
            self.fields["slug"].required = False  # the service makes one from the name

    def validate_unique(self) -> None:
        """The service decides (its message names the slug taken)."""

    def save_through_services(self) -> Team:
        if self.instance._state.adding:
            return team_create(
                creator=request_user(self.request),
                name=self.cleaned_data["name"],
                slug=self.cleaned_data.get("slug") or "",
            )
        if "name" in self.changed_data:
            _require_team_admin(self.request, self.instance)
            return team_rename(team=self.instance, name=self.cleaned_data["name"])
        return self.instance

    def refusal_field(self) -> str | None:
        return None  # creating a team, or renaming it: the whole form's


@admin.register(Team)
class TeamAdmin(_ServiceDeleteMixin, ServiceFormAdmin):
    """Every team: made (the maker its admin; a team staff make is *managed*, so single sign-on's
    group mapping may grant its members), renamed and deleted through :mod:`tasks_app.teams`, as
    the API does. Members are on the Membership pages (linked from each team's)."""

    form = TeamAdminForm
    list_display = ("slug", "name", "kind", "member_count", "managed", "created_at")
    list_filter = ("managed", ("personal_of", admin.EmptyFieldListFilter))
    search_fields = ("slug", "name", "personal_of__username")
    list_select_related = ("personal_of",)
    show_full_result_count = False  # a personal team per user: no second count of them all
    actions = ["remove_selected"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        members = people(Membership.objects.filter(team_id=OuterRef("pk"))).order_by().values("team_id")
        count = members.annotate(n=Count("id")).values("n")
        return super().get_queryset(request).annotate(people_count=Subquery(count[:1]))

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is None:
            return ("name", "slug")
        return ("name", "slug", "kind", "managed", "created_at", "members")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else ["slug", "kind", "managed", "created_at", "members"]

    @admin.display(description="Kind")
    def kind(self, team: Team) -> str:
        return f"personal team of {team.personal_of}" if team.personal_of_id else "shared"

    @admin.display(description="Members", ordering="people_count")
    def member_count(self, team: Team) -> int:
        return getattr(team, "people_count", None) or 0

    @admin.display(description="Members")
    def members(self, team: Team) -> str:
        rows = people(Membership.objects.filter(team=team)).select_related("user").order_by("user__username")
        items = format_html_join(
            "",
            '<li><a href="{}">{}</a>: {}{}</li>',
            (
                (
                    reverse("admin:tasks_app_membership_change", args=[m.pk]),
                    m.user.get_username(),
                    m.role,
                    " (single sign-on)" if m.sso else "",
                )
                for m in rows
            ),
        )
        add = format_html('<a href="{}?team={}">Add a member</a>', reverse("admin:tasks_app_membership_add"), team.pk)
        if team.personal_of_id:
            return format_html('<ul class="members">{}</ul>', items)
        return format_html('<ul class="members">{}</ul>{}', items, add)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[list[Any], dict[str, int], set, list]:
        # team_delete deletes only an empty team (it refuses one holding anything but members):
        # the confirmation names the teams, not Django's cascade.
        teams = list(objs)
        return [format_html("Team: {}", team) for team in teams], {"teams": len(teams)}, set(), []

    def remove(self, request: HttpRequest, obj: Team) -> str:
        _require_team_admin(request, obj)
        team_delete(team=obj)
        return "deleted"


class MembershipAdminForm(ServiceModelForm):
    """Adds a member or changes a role through :func:`~tasks_app.teams.services.member_set` while it is
    validated, so the service's refusals (the last admin demoted, an unknown user, a service
    account, a personal team's one member) are errors on the form's fields."""

    username = forms.CharField(max_length=150, required=False, help_text="The user to add.")

    class Meta:
        model = Membership
        fields = ["team", "role"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "username" in self.fields and self.instance._state.adding:
            self.fields["username"].required = True

    def validate_unique(self) -> None:
        """The service decides: adding someone already in the team changes their role (as the API)."""

    def save_through_services(self) -> Membership:
        adding = self.instance._state.adding
        team = self.cleaned_data["team"] if adding else self.instance.team
        username = self.cleaned_data["username"] if adding else self.instance.user.get_username()
        _require_team_admin(self.request, team)
        return member_set(team=team, username=username, role=self.cleaned_data["role"])


@admin.register(Membership)
class MembershipAdmin(_ServiceDeleteMixin, ServiceFormAdmin):
    """Who is in which team with which role (people; a team's service accounts are on their own
    page). Added, changed and removed through :func:`~tasks_app.teams.services.member_set` and
    :func:`~tasks_app.teams.services.member_remove`, with the API's rules: a team's admins (or staff with
    ``tasks_app.change_team``), never without an admin, a personal team one member only."""

    form = MembershipAdminForm
    list_display = ("team", "user", "role", "sso", "created_at")
    list_filter = ("role", "sso")
    search_fields = ("team__slug", "team__name", "user__username")
    list_select_related = ("team", "user")
    raw_id_fields = ("team",)
    show_full_result_count = False
    actions = ["remove_selected"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return people(super().get_queryset(request))

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is None:
            return ("team", "username", "role")
        return ("team", "user", "role", "sso", "created_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else ["team", "user", "sso", "created_at"]

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[list[Any], dict[str, int], set, list]:
        rows = list(objs)
        return [format_html("Membership: {}", m) for m in rows], {"memberships": len(rows)}, set(), []

    def describe(self, obj: Membership) -> str:
        return f"{obj.user.get_username()} in {obj.team.slug}"

    def remove(self, request: HttpRequest, obj: Membership) -> str:
        _require_team_admin(request, obj.team)
        member_remove(team=obj.team, username=obj.user.get_username())
        return "removed"
