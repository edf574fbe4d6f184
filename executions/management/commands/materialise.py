from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from executions.materialiser import materialise_due


class Command(BaseCommand):
    help = "Run one materialiser pass now (beat runs it every few seconds)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--horizon", type=float, default=None, help="Seconds ahead to materialise.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["horizon"] is not None and options["horizon"] < 0:
            raise CommandError("--horizon must not be negative")
        created = materialise_due(horizon=options["horizon"])
        self.stdout.write(f"created {created} executions")
