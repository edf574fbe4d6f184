from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ExecutionsConfig(AppConfig):
    name = "executions"

    def ready(self) -> None:
        from tms_core import tracing

        # OpenTelemetry, when the environment asks for it (OTEL_EXPORTER_OTLP_ENDPOINT, ...):
        # before the web's middleware is loaded and a worker forks its pool.
        tracing.setup()
        from executions.periodic import register_periodic_tasks

        post_migrate.connect(register_periodic_tasks, sender=self)
        from executions.models import Execution
        from tasks_app.audit_scope import register_team_object

        # A replay across tasks is recorded on its first run, with no task: its team reads it.
        register_team_object("execution", Execution)
        # The rollup is a part of the status trigger, which notifications installs
        # (executions/triggers.py).
