from django.apps import AppConfig


class TasksAppConfig(AppConfig):
    name = "tasks_app"
    verbose_name = "Tasks"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.models.signals import post_save

        from tasks_app.teams.services import personal_team_on_user_created

        # Every user has a personal team from the moment they exist, whatever made them.
        post_save.connect(
            personal_team_on_user_created, sender=settings.AUTH_USER_MODEL, dispatch_uid="tms_personal_team"
        )
        from tasks_app.hooks import rotate_hook_secrets
        from tasks_app.secrets import register_rotation

        register_rotation("trigger URL(s)", rotate_hook_secrets)
