from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from rest_framework import serializers

from tasks_app.durations import DurationField
from tasks_app.models import Artifact, MisfirePolicy, OverlapPolicy, Task
from tasks_app.schedules import ScheduleError, validate_cron, validate_timezone
from tasks_app.services import task_validate_runner
from tms_project.api_base import StrictInputMixin


class TaskCreateSerializer(StrictInputMixin, serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    runner = serializers.CharField(max_length=64, help_text="Runner alias, e.g. http, sleep, noop.")
    config = serializers.JSONField(required=False, default=dict, help_text="Runner config, checked by the runner.")
    artifact = serializers.PrimaryKeyRelatedField(
        queryset=Artifact.objects.all(),
        required=False,
        allow_null=True,
        default=None,
        help_text="An uploaded artifact (POST /api/v1/artifacts) that a subprocess task runs.",
    )
    start_at = serializers.DateTimeField(required=False, allow_null=True, default=None, help_text="Default: now.")
    interval = DurationField(
        required=False,
        allow_null=True,
        default=None,
        min_value=timedelta(milliseconds=100),
        help_text='Repeat every interval: seconds or a duration string such as "90s", "5m", "1h".',
    )
    cron = serializers.CharField(required=False, allow_blank=True, default="", max_length=120)
    timezone = serializers.CharField(required=False, default="UTC", max_length=64)
    end_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    max_runs = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1)
    jitter = DurationField(required=False, default=timedelta(0))
    misfire_policy = serializers.ChoiceField(choices=MisfirePolicy.choices, default=MisfirePolicy.RUN_ONCE)
    overlap_policy = serializers.ChoiceField(choices=OverlapPolicy.choices, default=OverlapPolicy.ALLOW)
    max_attempts = serializers.IntegerField(required=False, default=3, min_value=1, max_value=100)
    retry_backoff = DurationField(required=False, default=timedelta(seconds=5))
    retry_backoff_max = DurationField(required=False, default=timedelta(minutes=10))
    retry_jitter = serializers.BooleanField(required=False, default=True)
    timeout = DurationField(
        required=False,
        default=lambda: timedelta(seconds=settings.TMS["DEFAULT_TIMEOUT"]),
        min_value=timedelta(seconds=1),
    )
    priority = serializers.IntegerField(required=False, default=5, min_value=0, max_value=9)
    tracing_id = serializers.CharField(required=False, allow_blank=True, default="", max_length=64)
    notification_target = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None and not request.user.is_staff:
            self.fields["artifact"].queryset = Artifact.objects.filter(owner=request.user)

    def validate_timezone(self, value: str) -> str:
        try:
            validate_timezone(value)
        except ScheduleError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def validate_cron(self, value: str) -> str:
        if value:
            try:
                validate_cron(value)
            except ScheduleError as exc:
                raise serializers.ValidationError(str(exc)) from None
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors: dict[str, list[str]] = {}
        if attrs.get("interval") is not None and attrs.get("cron"):
            errors["cron"] = ["Give an interval or a cron expression, not both."]
        start, end = attrs.get("start_at"), attrs.get("end_at")
        if start and end and end < start:
            errors["end_at"] = ["Must not be before start_at."]
        if attrs["retry_backoff_max"] < attrs["retry_backoff"]:
            errors["retry_backoff_max"] = ["Must not be less than retry_backoff."]
        if errors:
            raise serializers.ValidationError(errors)
        task_validate_runner(runner=attrs["runner"], config=attrs["config"])
        return attrs


class TaskSerializer(serializers.ModelSerializer):
    interval = DurationField(allow_null=True, help_text="Seconds between runs; null for one-shot and cron.")
    jitter = DurationField()
    retry_backoff = DurationField()
    retry_backoff_max = DurationField()
    timeout = DurationField()

    class Meta:
        model = Task
        fields = [
            "id",
            "name",
            "status",
            "runner",
            "config",
            "artifact",
            "start_at",
            "interval",
            "cron",
            "timezone",
            "end_at",
            "max_runs",
            "jitter",
            "misfire_policy",
            "overlap_policy",
            "max_attempts",
            "retry_backoff",
            "retry_backoff_max",
            "retry_jitter",
            "timeout",
            "priority",
            "tracing_id",
            "notification_target",
            "next_run_at",
            "runs_materialised",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields
