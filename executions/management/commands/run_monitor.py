from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from executions.monitor import Monitor
from tms_core.queue_type import QueueTypeMismatch


class Command(BaseCommand):
    help = "Run the monitor: publish due executions to the broker until stopped (SIGTERM or Ctrl-C)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch", type=int, default=None, help="Executions per transaction (default: TMS setting)."
        )
        parser.add_argument("--passes", type=int, default=None, help="Stop after this many passes (for scripts).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] is not None and options["batch"] < 1:
            raise CommandError("--batch must be at least 1")
        monitor = Monitor(batch=options["batch"])
        monitor.install_signal_handlers()
        try:
            monitor.run(max_passes=options["passes"])
        except QueueTypeMismatch as exc:
            # The queue exists as the other type: a configuration error, said in one line.
            raise CommandError(str(exc)) from exc
