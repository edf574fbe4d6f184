from django.apps import AppConfig
from django.db.models.signals import post_migrate


class NotificationsConfig(AppConfig):
    name = "notifications"

    def ready(self) -> None:
        from notifications.periodic import register_periodic_tasks

        post_migrate.connect(register_periodic_tasks, sender=self)
