from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ops.checks import OPERATOR, run_checks

#: Exit status when at least one check fails (``CommandError`` would use 1 too, with a traceback-like line).
FAILED = 1


class Command(BaseCommand):
    help = (
        "Check the platform for an operator: database, broker, queue arguments, runner configuration, "
        "beat schedule, monitor and workers. Prints one OK/FAIL line each; exits 1 if any fails."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        names = [check.__name__.removeprefix("check_") for check in OPERATOR]
        parser.add_argument(
            "--only",
            action="append",
            choices=names,
            metavar="CHECK",
            help=f"Run only this check (repeatable): {', '.join(names)}.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        checks = OPERATOR
        if options["only"]:
            checks = tuple(check for check in OPERATOR if check.__name__.removeprefix("check_") in options["only"])
        results = run_checks(checks)
        width = max(len(result.name) for result in results)
        for result in results:
            status = self.style.SUCCESS("OK  ") if result.ok else self.style.ERROR("FAIL")
            self.stdout.write(f"{status}  {result.name.ljust(width)}  {result.detail}")
        failed = [result.name for result in results if not result.ok]
        if failed:
            self.stderr.write(f"{len(failed)} of {len(results)} checks failed: {', '.join(failed)}")
            raise SystemExit(FAILED)
