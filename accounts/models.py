"""Personal access tokens: many per user, each named, scoped, expiring and revocable; and the
service accounts that hold tokens for a team.

The key is shown once, when the token is created; the database keeps only its SHA-256 digest
and a public ``lookup`` (part of the key) to find the row by. See :mod:`accounts.tokens` and
:mod:`accounts.service_accounts`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.functions import Now


class TokenScope(models.TextChoices):
    READ = "read"  #: GET, HEAD and OPTIONS only
    WRITE = "write"  #: every method (includes read)


class AccessToken(models.Model):
    """A personal access token of ``user``: the API acts as that user within the token's scopes."""

    id = models.BigAutoField(primary_key=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="access_tokens")
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. 'CI deploys'.")
    #: The key's public part (``tms_pat_<lookup>_<secret>``): finds the row, and tells a token apart
    #: in lists and logs without revealing anything that authenticates.
    lookup = models.CharField(max_length=16, unique=True, editable=False)
    #: SHA-256 of the whole key, hex. Keys carry 256 random bits, so a fast hash is enough (a
    #: password hasher's deliberate slowness would be paid on every request, for no gain).
    digest = models.CharField(max_length=64, editable=False)
    #: Sorted names of :class:`TokenScope`.
    scopes = models.JSONField(default=list)
    #: The one team the token sees and acts in (None: every team of its user). Deleting the team
    #: deletes its tokens: cleared, the column would widen the token to all its user's teams.
    team = models.ForeignKey(
        "tasks_app.Team",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="access_tokens",
        help_text="The one team this token sees and acts in; empty: every team of its user.",
    )
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never (only where the operator allows).")
    #: Updated at most once a minute (a write per request would cost more than the request).
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["user", "-id"], name="access_token_user_idx")]

    def __str__(self) -> str:
        return f"{self.name} (tms_pat_{self.lookup}_…)"

    @property
    def prefix(self) -> str:
        """The start of the key, safe to show: enough to recognise it, useless to authenticate."""
        return f"tms_pat_{self.lookup}_"

    @property
    def may_write(self) -> bool:
        return TokenScope.WRITE in self.scopes


class AccountKey(models.Model):
    """A user's account key (``tms_create_user``'s; the older DRF key, ``Authorization: Token``):
    all of the user's powers, no expiry, one per user. Only the SHA-256 of the key is stored
    (:mod:`accounts.account_keys`); the key is shown once, when it is made. Keys that existed in
    DRF's ``authtoken_token`` table were hashed into this one by migration 0004, so the clients
    holding them keep working."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, primary_key=True, on_delete=models.CASCADE, related_name="account_key"
    )
    #: SHA-256 of the key, hex. Keys carry 160 random bits (or 256): a fast hash is enough.
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"account key of user {self.user_id}"


class OidcIdentity(models.Model):
    """A user's account at an OpenID Connect provider: single sign-on finds the user by it.

    (issuer, subject) is the provider's stable identifier (the ID token's ``iss`` and ``sub``); an
    e-mail address or a username can change hands, so neither is ever used to match a sign-in to a
    user. An operator links an existing local account by adding a row here (the admin).
    """

    id = models.BigAutoField(primary_key=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(db_default=Now())
    last_login_at = models.DateTimeField(null=True, blank=True)
    #: The provider's groups at the last sign-in (what TMS_OIDC_GROUPS mapped), for the admin.
    groups = models.JSONField(default=list, blank=True)

    class Meta:
        verbose_name = "OIDC identity"
        verbose_name_plural = "OIDC identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="oidc_identity_unique")]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Whatever writes the link (the admin, a shell, a script), a service account never gets one:
        # single sign-on would otherwise open a session as it.
        self.clean()
        super().save(*args, **kwargs)

    def clean(self) -> None:
        if self.user_id is not None and ServiceAccount.objects.filter(user_id=self.user_id).exists():
            raise ValidationError({"user": "A service account cannot sign in, single sign-on included."})


class ServiceAccount(models.Model):
    """A team's identity for machines (CI, deploy scripts): a user row that cannot sign in, a
    member of its one team with a role below admin, and the access tokens it holds, each scoped
    to that team. Made and deleted by the team's admins (:mod:`accounts.service_accounts`).

    The user row is kept when the account is deleted (made inactive, its tokens revoked, its
    membership gone): the tasks it created and the audit log still name it.
    """

    id = models.BigAutoField(primary_key=True)
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="service_account")
    team = models.ForeignKey("tasks_app.Team", on_delete=models.CASCADE, related_name="service_accounts")
    name = models.CharField(max_length=100, help_text="What it is for, e.g. 'deploy-ci'.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(db_default=Now())
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "name"], condition=models.Q(deleted_at__isnull=True), name="service_account_team_name"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.user.get_username()})"
