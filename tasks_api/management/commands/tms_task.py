"""Operate tasks from a shell: ``manage.py tms_task pause|resume|run|delete TASK_ID...``.

Each action goes through the same service as the API, and is in the audit log as
``command:tms_task`` with the operating-system user who ran it.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import CommandError, CommandParser

from tasks_api.lifecycle import task_delete, task_pause, task_resume
from tasks_api.triggers import task_trigger, trigger_words
from tasks_app.audit import AuditedCommand
from tasks_app.models import Task, TaskStatus
from tms_core.errors import DomainError


class Command(AuditedCommand):
    help = "Pause, resume, run now or delete tasks by id (through the task services; audited as command:tms_task)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["pause", "resume", "run", "delete"])
        parser.add_argument("task_ids", nargs="+", metavar="TASK_ID")

    def handle(self, *args: Any, **options: Any) -> None:
        ids = []
        for text in options["task_ids"]:
            try:
                ids.append(uuid.UUID(text))
            except ValueError:
                raise CommandError(f"{text!r} is not a task id (a UUID).") from None
        tasks = {task.pk: task for task in Task.objects.filter(pk__in=ids).exclude(status=TaskStatus.DELETED)}
        missing = [str(pk) for pk in ids if pk not in tasks]
        if missing:
            raise CommandError(f"No such task: {', '.join(missing)}. Nothing was done.")
        actor = f"command:tms_task ({self.os_user})"  # how execution events name who acted
        for pk in ids:
            task = tasks[pk]
            try:
                self.stdout.write(f"{task.pk}: {self._act(options['action'], task, actor)}")
            except DomainError as exc:
                raise CommandError(f"{task.pk}: {exc}") from None

    def _act(self, action: str, task: Task, actor: str) -> str:
        if action == "pause":
            return f"status {task_pause(task=task, actor=actor).status}"
        if action == "resume":
            return f"status {task_resume(task=task, actor=actor).status}"
        if action == "run":
            return trigger_words(task_trigger(task=task, actor=actor))
        report = task_delete(task=task, actor=actor)
        return f"deleted; {len(report.executions)} active execution(s) cancelled"
