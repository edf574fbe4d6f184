import importlib

from django.apps import AppConfig
from django.db.models.signals import post_migrate

from tms_core.sqlite_triggers import SqliteTriggers, register


class NotificationsConfig(AppConfig):
    name = "notifications"

    def ready(self) -> None:
        from notifications.periodic import register_periodic_tasks
        from notifications.services import rotate_channel_secrets
        from tasks_app.secrets import register_rotation

        post_migrate.connect(register_periodic_tasks, sender=self)
        register_rotation("notification channel(s)", rotate_channel_secrets)
        outbox = importlib.import_module("notifications.migrations.0001_initial")
        register(
            self,
            SqliteTriggers(
                migration=("notifications", "0001_initial"),
                install=lambda: list(outbox.SQLITE_INSTALL),
                uninstall=list(outbox.SQLITE_UNINSTALL),
            ),
        )
