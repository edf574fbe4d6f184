from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tooling.management.arguments import positive
from tooling.scale import materialise_scale_check


class Command(BaseCommand):
    help = (
        "Materialiser scale check: insert N due recurring tasks, time two materialiser passes (the second "
        "must create nothing), print the figures and delete the tasks again. Use a scratch database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tasks", type=positive(int), metavar="N", help="recurring tasks to insert")

    def handle(self, *args: Any, **options: Any) -> None:
        result = materialise_scale_check(tasks=options["tasks"])
        self.stdout.write(str(result))
        if result.second_pass_created:
            raise CommandError("the second pass created executions: materialisation is not idempotent")
