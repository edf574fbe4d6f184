"""TMS's SQLite triggers (the embedded default of ``make run``) live outside the migrations.

On SQLite, Django rebuilds a table (create a copy, move the rows, drop, rename) for most schema
changes. A rebuild of a table that a trigger reads is refused ("error in trigger ...: no such
table"), and a rebuild of the table a trigger is on silently drops the trigger. So on SQLite the
migrations that define triggers install nothing; every ``migrate`` drops the triggers before its
first migration (``pre_migrate``) and installs them after its last (``post_migrate``), once the
migration that introduced each one is applied. PostgreSQL keeps its triggers in the migrations:
its ``ALTER TABLE`` does not rebuild tables.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.apps import AppConfig
from django.db import connections
from django.db.migrations.recorder import MigrationRecorder
from django.db.models.signals import post_migrate, pre_migrate


@dataclass(frozen=True)
class SqliteTriggers:
    """The triggers one migration introduced: SQL that installs them, and SQL that drops them."""

    migration: tuple[str, str]
    install: Callable[[], Sequence[str]]
    uninstall: Sequence[str]


_REGISTERED: list[SqliteTriggers] = []


def _drop(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    with connection.cursor() as cursor:
        for triggers in _REGISTERED:
            for statement in triggers.uninstall:
                cursor.execute(statement)


def _install(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    applied = MigrationRecorder(connection).applied_migrations()
    with connection.cursor() as cursor:
        for triggers in _REGISTERED:
            for statement in triggers.uninstall:
                cursor.execute(statement)
            if triggers.migration in applied:
                for statement in triggers.install():
                    cursor.execute(statement)


def register(app_config: AppConfig, triggers: SqliteTriggers) -> None:
    """Keep ``triggers`` installed on SQLite around every ``migrate`` (call from ``ready()``)."""
    _REGISTERED.append(triggers)
    # Once per migrate (sender: this app), whichever app's migrations run.
    pre_migrate.connect(_drop, sender=app_config, dispatch_uid=f"tms-sqlite-drop-{app_config.label}")
    post_migrate.connect(_install, sender=app_config, dispatch_uid=f"tms-sqlite-install-{app_config.label}")
