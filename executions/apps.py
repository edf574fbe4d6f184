from django.apps import AppConfig
from django.db.models.signals import post_migrate

from tms_core.sqlite_triggers import SqliteTriggers, register


class ExecutionsConfig(AppConfig):
    name = "executions"

    def ready(self) -> None:
        from executions.periodic import register_periodic_tasks

        post_migrate.connect(register_periodic_tasks, sender=self)
        # The rollup is a part of the status trigger, which notifications installs
        # (executions/triggers.py).
        from executions import task_guard, task_version

        register(
            self,
            SqliteTriggers(
                migration=("executions", "0016_execution_task_without_fk_constraint"),
                install=lambda: [task_guard.sqlite_install()],
                uninstall=[task_guard.SQLITE_UNINSTALL],
            ),
        )
        register(
            self,
            SqliteTriggers(
                migration=("executions", "0023_execution_task_version"),
                install=lambda: [task_version.sqlite_install()],
                uninstall=[task_version.SQLITE_UNINSTALL],
            ),
        )
