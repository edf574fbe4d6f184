from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from executions.monitor import Monitor


class Command(BaseCommand):
    help = "Run the monitor: publish due executions to the broker until stopped (SIGTERM or Ctrl-C)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch", type=int, default=None, help="Executions per transaction (default: TMS setting)."
        )
        parser.add_argument("--passes", type=int, default=None, help="Stop after this many passes (for scripts).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] is not None and options["batch"] < 1:
            from django.core.management.base import CommandError

            raise CommandError("--batch must be at least 1")
        monitor = Monitor(batch=options["batch"])
        monitor.install_signal_handlers()
        monitor.run(max_passes=options["passes"])
