"""Access tokens in the admin: everyone's, to find and revoke, with the team each is scoped to;
never their keys. Service accounts: every team's, to find and delete (through the same service as
the API: its tokens are revoked, it leaves its team); they are made by a team's admins, on the
team's page or through the API, where the admin role is checked."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest

from accounts.models import AccessToken, OidcIdentity, ServiceAccount
from accounts.service_accounts import service_account_delete
from accounts.tokens import token_revoke
from tasks_app.models import Membership


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
