from django.apps import AppConfig
from django.db.models.signals import post_migrate

from tms_core.sqlite_triggers import SqliteTriggers, register


class NotificationsConfig(AppConfig):
    name = "notifications"

    def ready(self) -> None:
        from executions import triggers as status
        from notifications import triggers
        from notifications.periodic import register_periodic_tasks
        from notifications.services import rotate_channel_secrets
        from tasks_app.secrets import register_rotation

        post_migrate.connect(register_periodic_tasks, sender=self)
        register_rotation("notification channel(s)", rotate_channel_secrets)
        # What executions' own migrations install beside their rollup when they change it.
        status.register_part(triggers.OUTBOX_PART)
        register(
            self,
            SqliteTriggers(
                migration=("notifications", "0001_initial"),
                install=lambda: [triggers.SQLITE_SKIPPED],
                uninstall=[triggers.SQLITE_SKIPPED_UNINSTALL],
            ),
        )
        # The execution table's status trigger, executions' rollup and this app's outbox
        # (notifications/triggers.py); the uninstall also drops the two row-level triggers it
        # replaced (executions 0006, notifications 0001) from a database made before it.
        register(
            self,
            SqliteTriggers(
                migration=("notifications", "0007_one_status_trigger"),
                install=lambda: [status.sqlite_install(triggers.STATUS_PARTS)],
                uninstall=[
                    status.SQLITE_UNINSTALL,
                    "DROP TRIGGER IF EXISTS tms_rollup_attempt_ended;",
                    "DROP TRIGGER IF EXISTS tms_notify_execution;",
                ],
            ),
        )
