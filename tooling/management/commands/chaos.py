from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tooling.harness.chaos import ChaosConfig, run_chaos
from tooling.management.arguments import positive


class Command(BaseCommand):
    help = (
        "Run N executions on real monitors, workers and beat while killing workers (SIGKILL), pausing one "
        "(SIGSTOP), restarting RabbitMQ and PostgreSQL; print lost / duplicate / recovery figures. "
        "Needs PostgreSQL and RabbitMQ on this machine; leaves both running."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        defaults = ChaosConfig()
        parser.add_argument("--executions", type=positive(int), default=defaults.executions)
        parser.add_argument("--workers", type=positive(int), default=defaults.workers)
        parser.add_argument("--concurrency", type=positive(int), default=defaults.concurrency)
        parser.add_argument("--monitors", type=positive(int), default=defaults.monitors)
        parser.add_argument(
            "--workflows",
            type=int,
            default=defaults.workflows,
            help="diamond workflow runs among the load (4 tasks each: a root, two after it, one after both)",
        )
        parser.add_argument("--kill-every", type=positive(float), default=defaults.kill_every, help="seconds")
        parser.add_argument("--spread", type=positive(float), default=defaults.spread, help="seconds of submissions")
        parser.add_argument("--deadline", type=positive(float), default=defaults.deadline, help="seconds")
        parser.add_argument("--no-pause", action="store_true", help="skip the SIGSTOP disruption")
        parser.add_argument("--no-broker-restart", action="store_true")
        parser.add_argument("--no-database-restart", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["workflows"] < 0:
            raise CommandError("--workflows must be 0 or more")
        config = ChaosConfig(
            executions=options["executions"],
            workers=options["workers"],
            concurrency=options["concurrency"],
            monitors=options["monitors"],
            workflows=options["workflows"],
            kill_every=options["kill_every"],
            spread=options["spread"],
            deadline=options["deadline"],
            pause=not options["no_pause"],
            restart_broker=not options["no_broker_restart"],
            restart_database=not options["no_database_restart"],
            progress=lambda line: self.stdout.write(f"  {line}"),
        )
        try:
            report = run_chaos(config)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write("\n".join(report.lines()))
        if (
            report.lost
            or report.duplicate_launches
            or report.duplicate_terminal_events
            or report.workflow_steps_missing
            or report.workflow_steps_duplicate
        ):
            raise CommandError("chaos found lost or duplicated work")
