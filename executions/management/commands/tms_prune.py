from __future__ import annotations

import argparse
import uuid
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_date, parse_datetime

from executions.retention import PruneReport, retention_prune
from tasks_app.models import Task
from tms_core.conf import tms_settings


def _when(text: str) -> datetime:
    """A date (midnight UTC) or an ISO 8601 date-time (UTC unless it gives an offset)."""
    try:
        parsed = parse_datetime(text)
        if parsed is None:
            day = parse_date(text)
            if day is None:
                raise ValueError(text)
            parsed = datetime(day.year, day.month, day.day)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date or date-time: {text!r}") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _batch(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 10000:
        raise argparse.ArgumentTypeError("must be between 1 and 10000")
    return value


def _task(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a task id: {text!r}") from None


class Command(BaseCommand):
    help = (
        "Prune finished executions by their tasks' retention rules (keep_last, keep_for, keep_failed_longer; "
        "defaults TMS_RETENTION_KEEP_LAST and TMS_RETENTION_KEEP_FOR), archiving each batch to the tms_archive "
        "storage before deleting it. Beat runs the same every TMS_RETENTION_INTERVAL seconds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="print what would go, change nothing")
        parser.add_argument(
            "--before",
            type=_when,
            default=None,
            help="only executions that ended before this date (UTC) or date-time; the rules still apply",
        )
        parser.add_argument("--task", type=_task, default=None, help="only this task's executions")
        parser.add_argument(
            "--batch", type=_batch, default=None, help="executions per transaction (default TMS_RETENTION_BATCH)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        task_id = options["task"]
        if task_id is not None and not Task.objects.filter(pk=task_id).exists():
            raise CommandError(f"No task {task_id}.")
        report = retention_prune(
            before=options["before"], task_id=task_id, batch=options["batch"], dry_run=options["dry_run"]
        )
        if report.busy:
            raise CommandError("Another pruning run is in progress; try again when it ends.")
        self._print(report, batch=options["batch"] or tms_settings().RETENTION_BATCH)

    def _print(self, report: PruneReport, *, batch: int) -> None:
        verb = "would prune" if report.dry_run else "pruned"
        names = dict(Task.objects.filter(pk__in=report.per_task).values_list("pk", "name"))
        for task_id, count in sorted(report.per_task.items(), key=lambda item: (-item[1], str(item[0]))):
            label = names.get(task_id) or ""
            self.stdout.write(f"task {task_id}{f' ({label})' if label else ''}: {verb} {count} executions")
        summary = f"{verb} {report.executions} executions of {len(report.per_task)} tasks"
        if not report.dry_run:
            summary += (
                f" ({report.events} events, {report.skipped} skipped occurrences) into {report.files} archive "
                f"files in {report.seconds:.1f}s, batches of {batch}"
            )
            if report.orphans_removed:
                summary += f"; removed {report.orphans_removed} archive files of batches that never committed"
        self.stdout.write(summary)
