from django.apps import AppConfig


class TasksApiConfig(AppConfig):
    """The task services, API and admin: an installed app so that its admin module and
    ``manage.py tms_task`` are found. It has no models (they are :mod:`tasks_app`'s)."""

    name = "tasks_api"
    verbose_name = "Task API"
