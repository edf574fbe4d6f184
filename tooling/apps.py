from django.apps import AppConfig


class ToolingConfig(AppConfig):
    """Registers the tooling commands (``chaos``, ``tms_bench``, ``tms_demo``, ``tms_scale``) and
    the benchmark's bare-Celery task; it has no models."""

    name = "tooling"
