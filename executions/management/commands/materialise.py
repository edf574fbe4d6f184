from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from executions.materialiser import materialise_due


class Command(BaseCommand):
    help = "Run one materialiser pass now (beat runs it every few seconds)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--horizon", type=float, default=None, help="Seconds ahead to materialise.")
        parser.add_argument(
            "--scale",
            type=int,
            default=None,
            metavar="N",
            help="Instead: insert N due recurring tasks, time two passes (the second must create nothing), "
            "print the figures and delete the tasks again. Use a scratch database.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["horizon"] is not None and options["horizon"] < 0:
            raise CommandError("--horizon must not be negative")
        if options["scale"] is not None:
            from executions.scale import materialise_scale_check

            self.stdout.write(str(materialise_scale_check(tasks=options["scale"])))
            return
        created = materialise_due(horizon=options["horizon"])
        self.stdout.write(f"created {created} executions")
