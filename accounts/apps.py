from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Who may call the API: personal access tokens (and, later, teams and service accounts)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "accounts"
    verbose_name = "Accounts"
