from django.apps import AppConfig


class BackofficeConfig(AppConfig):
    """The operator back office: dashboard, task and execution pages (server-rendered HTML)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "backoffice"
    verbose_name = "Back office"
