"""Re-encrypt every secret config value (and every other registered secret: notification
channels' signing secrets and targets) with the first key of ``TMS_SECRET_KEYS``.

Rotation: put the new key first in ``TMS_SECRET_KEYS`` (keep the old one after it) on every
process, run this command, then remove the old key. Values already under the first key are
re-encrypted too (Fernet tokens carry no key id): the command is safe to run again.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from tasks_app.models import Task
from tasks_app.secrets import ROTATIONS, SecretsUnavailable, config_rotate


class Command(BaseCommand):
    help = (
        "Re-encrypt every secret task config value and notification channel secret with the first key of "
        "TMS_SECRET_KEYS (key rotation)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=500, help="Tasks locked and rewritten per transaction.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] < 1:
            raise CommandError("--batch must be at least 1")
        tasks = values = 0
        failed: list[str] = []
        last = None
        while True:
            with transaction.atomic():
                batch = Task.objects.select_for_update().order_by("pk").only("pk", "config")
                if last is not None:
                    batch = batch.filter(pk__gt=last)
                rows = list(batch[: options["batch"]])
                for task in rows:
                    try:
                        config, count = config_rotate(task.config)
                    except SecretsUnavailable:
                        failed.append(str(task.pk))
                        continue
                    if count:
                        # update(): a rotation is not a change of the task (updated_at stays).
                        Task.objects.filter(pk=task.pk).update(config=config)
                        tasks += 1
                        values += count
            if len(rows) < options["batch"]:
                break
            last = rows[-1].pk
        self.stdout.write(f"re-encrypted {values} secret value(s) in {tasks} task(s) with the first key")
        problems = []
        if failed:
            problems.append(f"{len(failed)} task(s) hold values no key of TMS_SECRET_KEYS decrypts (left unchanged): "
                            + ", ".join(failed[:20]))  # fmt: skip
        # Other apps' secrets (notification channels' signing secrets and targets).
        for name, rotate in ROTATIONS.items():
            rewritten, count, unreadable = rotate(options["batch"])
            self.stdout.write(f"re-encrypted {count} secret value(s) in {rewritten} {name} with the first key")
            if unreadable:
                problems.append(f"{len(unreadable)} {name} hold values no key decrypts (left unchanged): "
                                + ", ".join(unreadable[:20]))  # fmt: skip
        if problems:
            raise CommandError("; ".join(problems))
