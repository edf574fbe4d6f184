"""A task's runner config as each reader may have it: opened (its secrets decrypted) for the
runner and for edits, masked for people; and the check that ``secret_fields`` names parts of it."""

from __future__ import annotations

from typing import Any

from tasks_app.models import Task
from tasks_app.secrets import check_secret_fields, config_masked, config_open
from tms_core.errors import InvalidInput


def task_check_secret_fields(*, config: Any, secret_fields: Any) -> None:
    """Raise :class:`InvalidInput` on ``secret_fields`` unless each path names something in ``config``."""
    errors = check_secret_fields(config, secret_fields)
    if errors:
        raise InvalidInput(errors)


def task_config(task: Task) -> dict[str, Any]:
    """The task's runner config with its secrets decrypted: for the runner (and edits), never for display."""
    opened: dict[str, Any] = config_open(task.config)
    return opened


def task_config_masked(task: Task) -> dict[str, Any]:
    """The task's runner config as people may see it: every secret value masked."""
    masked: dict[str, Any] = config_masked(task.runner, task.config, task.secret_fields or [])
    return masked
