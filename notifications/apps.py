from django.apps import AppConfig
from django.db.models.signals import post_migrate


class NotificationsConfig(AppConfig):
    name = "notifications"

    def ready(self) -> None:
        from executions import triggers as status
        from notifications import triggers
        from notifications.periodic import register_periodic_tasks
        from notifications.services import rotate_channel_secrets
        from tasks_app.secrets import register_rotation

        post_migrate.connect(register_periodic_tasks, sender=self)
        from notifications.models import Channel
        from tasks_app.audit_scope import register_team_object

        # A channel's history is its team's, as the channel is (rules carry their task's id).
        register_team_object("channel", Channel)
        register_rotation("notification channel(s)", rotate_channel_secrets)
        # What executions' own migrations install beside their rollup when they change it.
        status.register_part(triggers.OUTBOX_PART)
