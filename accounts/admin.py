"""Personal access tokens in the admin: everyone's, to find and revoke; never their keys."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.models import AccessToken, OidcIdentity
from accounts.tokens import token_revoke


@admin.register(AccessToken)
class AccessTokenAdmin(admin.ModelAdmin):
    """Tokens are created through the API (the key is shown to its owner only) and revoked here or there."""

    list_display = ("name", "user", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "user__username", "lookup")
    list_select_related = ("user",)
    fields = readonly_fields = (
        "user", "name", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at",
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
