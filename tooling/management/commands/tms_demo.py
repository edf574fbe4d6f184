from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from accounts.account_keys import account_key_create, account_key_exists

#: Where the banner (addresses, demo credentials, token) is kept, under VAR_DIR; the Procfile's
#: ``banner`` process prints it again once the other processes' start-up logs have scrolled by.
BANNER_FILE = "run-banner.txt"


class Command(BaseCommand):
    help = "Create (or reuse) the demo admin user and its API token, and print how to reach the platform."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument(
            "--password",
            default=None,
            help="Password of a new admin (default: a random one, printed once). An existing admin's "
            "password is never changed: reset it with `manage.py changepassword USERNAME`.",
        )
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--flower-port", type=int, default=5555)

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        user, created = users.objects.get_or_create(
            username=options["username"], defaults={"is_staff": True, "is_superuser": True}
        )
        # A fresh random password for a new admin (never a well-known one: `make run` may listen on a
        # shared machine); an existing admin keeps theirs, so running `make run` again changes nothing.
        password = options["password"] or secrets.token_urlsafe(12)
        if created:
            user.set_password(password)
            user.save()
        # The key is stored hashed: shown when made (the first run), never again.
        key = None if account_key_exists(user=user) else account_key_create(user=user)
        token_shown = (
            key
            if key is not None
            else f"unchanged (shown when made; a new one: python manage.py tms_create_user {user.username} --rotate)"
        )
        web = f"http://127.0.0.1:{options['port']}"
        database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        broker = "filesystem (embedded)" if settings.TMS_EMBEDDED_BROKER else settings.CELERY_BROKER_URL.split("@")[-1]
        shown = (
            f"password {password!r} (new: later runs do not show it again)"
            if created
            else f"password unchanged (set earlier; to reset it: python manage.py changepassword {user.username})"
        )
        banner_file = Path(settings.VAR_DIR) / BANNER_FILE
        banner = "\n".join(
            [
                "",
                f"TMS is starting (this banner is repeated once start-up is done, and kept in {banner_file})",
                f"  database:  {database}    broker: {broker}",
                f"  API:       {web}/api/v1/tasks   (docs: {web}/api/docs/)",
                f"  admin:     {web}/admin/   user {user.username!r}, {shown}",
                f"  token:     {token_shown}",
                f"  flower:    http://127.0.0.1:{options['flower_port']}/",
                f"  try:       curl -X POST {web}/api/v1/tasks -H 'Authorization: Token {key or '<your key>'}' "
                '-H \'Content-Type: application/json\' -d \'{"runner": "sleep", "config": {"duration": "2s"}}\'',
                "  Ctrl-C stops everything.",
                "",
            ]
        )
        banner_file.parent.mkdir(parents=True, exist_ok=True)
        # It holds the demo credentials: readable by this user only.
        banner_file.touch(mode=0o600, exist_ok=True)
        banner_file.chmod(0o600)
        banner_file.write_text(banner.replace("TMS is starting", "TMS is running", 1) + "\n")
        self.stdout.write(banner)
