"""What the task API's read-only views of a task's schedule take and give: the previews, "why"
and the occurrence timeline of :mod:`tasks_api.selectors` (the task itself is read and written
through :mod:`tasks_api.serializers`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from executions.models import ExecutionOrigin, ExecutionStatus, SkipReason
from tasks_api.selectors import OCCURRENCES_MAX_SPAN, OccurrenceState
from tasks_api.serializers import (
    CALENDAR_POLICY_HELP,
    SCHEDULE_DESCRIPTION_HELP,
    LocalDateTimeField,
    TaskCreateSerializer,
    check_task,
    dst_fold_field,
    dst_gap_field,
    localize_wall_times,
)
from tasks_app.models import CalendarPolicy
from tasks_app.schedules import CRON_HELP
from teams_api.scope import TeamRefField
from tms_core.api.base import (
    BoundedDateTimeField,
    OffsetDateTimeField,
    StrictInputMixin,
)
from tms_core.durations import DurationField

# --- previews and "why" ------------------------------------------------------------------------


class FireTimeSerializer(serializers.Serializer):
    utc = serializers.DateTimeField(help_text="The fire time in UTC.")
    local = serializers.SerializerMethodField(help_text="The same instant in the schedule's time zone.")
    dst = serializers.CharField(
        help_text="Which DST rule (dst_gap, dst_fold) decided this fire time, in words; empty on an ordinary day."
    )
    calendar = serializers.ChoiceField(
        choices=["", "skipped", "moved"],
        help_text="What the business calendar makes of it: `skipped`, `moved`, or empty (it runs as scheduled).",
    )
    calendar_reason = serializers.CharField(
        help_text="Why its day is closed (the holiday's name, an extra date's label, `weekend`) and where it moved."
    )
    runs_at = serializers.DateTimeField(
        allow_null=True, help_text="When it runs (UTC): the fire time, the moved instant, or null (skipped)."
    )

    def get_local(self, obj: Any) -> str:
        return obj.local.isoformat()


class PreviewQuerySerializer(StrictInputMixin, serializers.Serializer):
    count = serializers.IntegerField(required=False, default=10, min_value=1, max_value=1000)
    after = BoundedDateTimeField(required=False, allow_null=True, default=None, help_text="Default: now.")


class SchedulePreviewSerializer(StrictInputMixin, serializers.Serializer):
    """A schedule to preview before creating a task (the same fields and rules as a task's)."""

    start_at = LocalDateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="First (or only) run, RFC 3339 (without an offset: wall-clock time in `timezone`). Default: now.",
    )
    interval = DurationField(required=False, allow_null=True, default=None, min_value=timedelta(milliseconds=100))
    cron = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=120, trim_whitespace=False, help_text=CRON_HELP
    )
    timezone = serializers.CharField(required=False, default="UTC", max_length=64)
    dst_gap = dst_gap_field()
    dst_fold = dst_fold_field()
    end_at = LocalDateTimeField(required=False, allow_null=True, default=None)
    max_runs = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1)
    calendar = serializers.CharField(
        required=False,
        allow_null=True,
        default=None,
        max_length=100,
        help_text="Name of a business calendar of `team`: each fire time says whether it is skipped or moved.",
    )
    team = TeamRefField(
        required=False,
        help_text="The team whose calendar `calendar` names, by slug or id (default: your personal team).",
    )
    calendar_policy = serializers.ChoiceField(
        choices=CalendarPolicy.choices, required=False, allow_blank=True, default="", help_text=CALENDAR_POLICY_HELP
    )
    count = serializers.IntegerField(required=False, default=10, min_value=1, max_value=1000)

    validate_timezone = TaskCreateSerializer.validate_timezone
    validate_cron = TaskCreateSerializer.validate_cron

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        localize_wall_times(attrs, attrs["timezone"])
        check_task(attrs)  # the schedule's part of a task's rules
        return attrs


class PreviewSerializer(serializers.Serializer):
    timezone = serializers.CharField()
    description = serializers.CharField(help_text=SCHEDULE_DESCRIPTION_HELP)
    fire_times = FireTimeSerializer(many=True)


class WhyQuerySerializer(StrictInputMixin, serializers.Serializer):
    at = BoundedDateTimeField(help_text="The instant asked about, RFC 3339.")


class WhyExecutionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.CharField()
    attempt = serializers.IntegerField()
    origin = serializers.CharField()
    scheduled_for = serializers.DateTimeField()
    moved_from = serializers.DateTimeField(
        allow_null=True, help_text="The fire time a business calendar moved it from (null: not moved)."
    )
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    error = serializers.CharField()


class WhySkippedSerializer(serializers.Serializer):
    scheduled_for = serializers.DateTimeField()
    reason = serializers.CharField()
    detail = serializers.CharField()
    recorded_at = serializers.DateTimeField()


class WhySerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    occurrence = serializers.DateTimeField(
        allow_null=True, help_text="The fire time at or before `at` nearest to it (null: none)."
    )
    verdict = serializers.ChoiceField(
        choices=[
            "ran",
            "running",
            "failed",
            "cancelled",
            "skipped",
            "not_a_fire_time",
            "before_start",
            "after_end",
            "upcoming",
            "paused",
            "holiday",
            "moved",
            "follows",
        ]
    )
    reason = serializers.CharField()
    execution = WhyExecutionSerializer(allow_null=True)
    skipped = WhySkippedSerializer(allow_null=True)
    next_fire_times = serializers.ListField(child=serializers.DateTimeField())
    next_notes = serializers.ListField(
        child=serializers.CharField(allow_blank=True),
        help_text="What the task's business calendar makes of each of `next_fire_times`, in the same order: "
        '"" for an open day, else why it will not run or where it is moved.',
    )
    dst = serializers.CharField(
        help_text="Which DST rule (dst_gap, dst_fold) decided the instant asked about or its fire time, in words; "
        "empty when the clock was not being changed."
    )


# --- the occurrence timeline -----------------------------------------------------------------


class OccurrencesQuerySerializer(StrictInputMixin, serializers.Serializer):
    """The window of ``GET /tasks/{id}/occurrences`` (``from_`` is exposed as ``from``)."""

    from_ = OffsetDateTimeField(
        required=False,
        help_text="Start of the window (inclusive), RFC 3339 with its offset (`Z`, `+02:00`: escape `+` as `%2B`). "
        "Default: `to` minus 2 days, or now minus 1 day (less for a task that fires more than 1000 times in it).",
    )
    to = OffsetDateTimeField(
        required=False,
        help_text="End of the window (exclusive), after `from` and at most 366 days from it. "
        "Default: `from` plus 2 days, or now plus 1 day (less for a task that fires more than 1000 times in it).",
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        return {"from": fields.pop("from_"), **fields}

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        start, end = attrs.get("from"), attrs.get("to")
        if start is not None and end is not None:
            if end <= start:
                raise serializers.ValidationError({"to": ["Must be after from."]})
            if end - start > OCCURRENCES_MAX_SPAN:
                days = OCCURRENCES_MAX_SPAN.days
                raise serializers.ValidationError({"to": [f"The window may span at most {days} days."]})
        return attrs


class OccurrenceExecutionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=ExecutionStatus.choices)
    attempt = serializers.IntegerField()
    origin = serializers.ChoiceField(
        choices=ExecutionOrigin.choices,
        help_text="Why it exists: `schedule` (a fire time, backfills included), `trigger` (run now) or `retry`.",
    )
    superseded = serializers.BooleanField(help_text="Replaced before it started by a schedule change or a pause.")
    retry_of = serializers.IntegerField(source="retry_of_id", allow_null=True)
    due_at = serializers.DateTimeField(help_text="When it was (or is) due to be published: later for a backfill.")
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class OccurrenceSkipSerializer(serializers.Serializer):
    reason = serializers.ChoiceField(choices=SkipReason.choices)
    detail = serializers.CharField()
    recorded = serializers.BooleanField(
        help_text="False: not recorded yet, the task is paused (its misfire policy decides when it resumes)."
    )
    summary = serializers.BooleanField(
        help_text="Recorded by a summary row that stands for many fire times not listed one by one."
    )
    row_scheduled_for = serializers.DateTimeField(
        allow_null=True, help_text="The recorded row's own time: the summary row's, for a fire time it stands for."
    )
    recorded_at = serializers.DateTimeField(allow_null=True)


class OccurrenceSerializer(serializers.Serializer):
    scheduled_for = serializers.DateTimeField(help_text="The instant, in UTC.")
    local_time = serializers.SerializerMethodField(help_text="The same instant in the task's time zone.")
    fire_time = serializers.BooleanField(
        help_text="A fire time of the task's schedule (false: a trigger, a retry, or a record of an earlier schedule)."
    )
    state = serializers.ChoiceField(choices=OccurrenceState.choices)
    reason = serializers.CharField(help_text="What became of it, for people (as `why` says it).")
    execution = OccurrenceExecutionSerializer(allow_null=True)
    skip = OccurrenceSkipSerializer(allow_null=True)

    @extend_schema_field(OpenApiTypes.DATETIME)
    def get_local_time(self, obj: Any) -> str:
        return obj.local.isoformat()


class OccurrenceWindowSerializer(serializers.Serializer):
    task = serializers.UUIDField(source="task_id")
    timezone = serializers.CharField()
    from_ = serializers.DateTimeField(source="start", help_text="Start of the window (inclusive).")
    to = serializers.DateTimeField(source="end", help_text="End of the window (exclusive).")
    now = serializers.DateTimeField(help_text="The database clock that past and future were judged by.")
    items = OccurrenceSerializer(many=True, help_text="In time order; at one instant the fire time first.")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        return {"task": fields.pop("task"), "timezone": fields.pop("timezone"), "from": fields.pop("from_"), **fields}
