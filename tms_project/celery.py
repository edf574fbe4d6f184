"""The Celery application shared by workers, beat and the monitor's publisher."""

import os

from celery import Celery

# A checkout runs the local settings; the docker image sets DJANGO_SETTINGS_MODULE to production.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tms_project.settings.local")

app = Celery("tms_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Worker registration and heartbeat (loaded by name when a worker starts).
app.steps["worker"].add("executions.heartbeat:HeartbeatStep")
