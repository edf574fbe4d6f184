"""``manage.py tms_create_user alice [--staff] [--superuser] [--password ...] [--rotate]``: a user and
its account key (API key).

The key is printed once, when it is made (a new user, a user without one, or ``--rotate``): only
its SHA-256 is stored (:mod:`accounts.account_keys`), so a later run cannot show it again."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from accounts.account_keys import account_key_create, account_key_exists
from accounts.support_group import SUPPORT_GROUP, ensure_support_group
from tasks_app.teams import is_service_account


class Command(BaseCommand):
    help = (
        "Create an API user (or reuse an existing one) and print its account key, for "
        "`Authorization: Token <key>`, once: when it is made (only a hash is stored; --rotate makes a new one). "
        "Without --password the user can use the API but not log in to the admin."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--email", default="")
        parser.add_argument("--password", help="Also set this password (for the admin and the browsable API).")
        parser.add_argument(
            "--staff",
            action="store_true",
            help="Staff see every user's tasks and the workers; in the admin they join the read-only "
            f"{SUPPORT_GROUP!r} group (superusers change things).",
        )
        parser.add_argument("--superuser", action="store_true", help="Implies --staff.")
        parser.add_argument("--rotate", action="store_true", help="Replace the user's existing key (and print it).")

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        username = options["username"].strip()
        if not username:
            raise CommandError("The username may not be empty.")
        existing_user = users.objects.filter(**{users.USERNAME_FIELD: username}).first()
        if existing_user is not None and is_service_account(existing_user):
            # An account key (all powers, never expires) or a password would bypass everything a
            # service account is: tokens scoped to its team, made and revoked by the team's admins.
            raise CommandError(
                f"{username!r} is a service account: give it tokens through its team "
                "(/api/v1/teams/<id>/service-accounts/<id>/tokens or the team's page)."
            )
        if options["password"] is not None:
            # Django's password validators (AUTH_PASSWORD_VALIDATORS), as the admin's forms apply
            # them: a usage error, and nothing created or changed.
            existing = users.objects.filter(**{users.USERNAME_FIELD: username}).first()
            candidate = existing or users(**{users.USERNAME_FIELD: username, "email": options["email"]})
            try:
                validate_password(options["password"], user=candidate)
            except ValidationError as exc:
                raise CommandError(f"--password: {' '.join(exc.messages)}") from None
        with transaction.atomic():
            user, created = users.objects.get_or_create(**{users.USERNAME_FIELD: username})
            if created:
                user.email = options["email"]
                if options["password"] is None:
                    user.set_unusable_password()
            if options["password"] is not None:
                user.set_password(options["password"])
            if options["staff"] or options["superuser"]:
                user.is_staff = True
            if options["superuser"]:
                user.is_superuser = True
            user.save()
            if user.is_staff and not user.is_superuser:
                group = ensure_support_group()
                if group is None:
                    raise CommandError("Run `manage.py migrate` first: the admin's permissions do not exist yet.")
                user.groups.add(group)
            key = None
            if options["rotate"] or not account_key_exists(user=user):
                key = account_key_create(user=user)
        role = "superuser" if user.is_superuser else "staff" if user.is_staff else "user"
        if key is None:
            self.stderr.write(
                f"Updated {role} {username!r}; its API key is unchanged (shown only when it was made: "
                "--rotate replaces it and prints the new one)."
            )
            return
        self.stderr.write(f"{'Created' if created else 'Updated'} {role} {username!r}; API key (shown once):")
        self.stdout.write(key)
