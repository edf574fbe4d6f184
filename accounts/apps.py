from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Who may call the API: personal access tokens (and, later, teams and service accounts)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "accounts"
    verbose_name = "Accounts"

    def ready(self) -> None:
        from django.apps import apps
        from django.db.models.signals import post_migrate

        from accounts.sso import mapped_team_slugs
        from accounts.support_group import ensure_support_group_after_migrate
        from tasks_app.teams import register_reserved_slugs

        # Team slugs the group mapping names are an administrator's to give (tasks_app.teams.services.team_create).
        register_reserved_slugs(mapped_team_slugs)
        # After the executions app's migrations: its permissions exist by then (auth creates each
        # app's permissions in its own post_migrate receiver, connected before this one).
        post_migrate.connect(ensure_support_group_after_migrate, sender=apps.get_app_config("executions"))
