from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ExecutionsConfig(AppConfig):
    name = "executions"

    def ready(self) -> None:
        from executions.periodic import register_periodic_tasks

        post_migrate.connect(register_periodic_tasks, sender=self)
