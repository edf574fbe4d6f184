from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tooling.management.arguments import positive
from tooling.scale import SCENARIOS, materialise_scale_check


class Command(BaseCommand):
    help = (
        "Materialiser scale check: insert N recurring tasks, time materialiser passes (with the CPU "
        "seconds of this process and of its PostgreSQL backends), print the figures and delete the "
        "tasks again. Use a scratch database."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tasks", type=positive(int), metavar="N", help="recurring tasks to insert")
        parser.add_argument(
            "--scenario",
            choices=SCENARIOS,
            default="mix",
            help="mix: a cold pass over interval and hourly cron tasks in six zones, then an idle one; "
            "herd: identical '* * * * *' tasks in UTC, a cold pass, the pass a minute later, an idle one; "
            "steady: every-minute tasks on distinct grids already materialised, passes 5, 10 and 15 s on",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        result = materialise_scale_check(tasks=options["tasks"], scenario=options["scenario"])
        self.stdout.write(str(result))
        idle = result.must_be_idle
        if idle is not None and idle.created:
            raise CommandError("a pass that had nothing to do created executions: materialisation is not idempotent")
