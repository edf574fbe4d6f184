"""The Task: what to run, on which runner, and when."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from tms_core.conf import tms_settings


class TaskStatus(models.TextChoices):
    ACTIVE = "ACTIVE"  #: materialised and run per its schedule
    PAUSED = "PAUSED"  #: kept, but no new executions are created
    COMPLETED = "COMPLETED"  #: its schedule has no further occurrence
    DELETED = "DELETED"  #: removed by its owner; history is kept


class OverlapPolicy(models.TextChoices):
    ALLOW = "allow"  #: start every occurrence, even while the previous one runs
    SKIP = "skip"  #: skip an occurrence while the previous one still runs
    QUEUE_ONE = "queue_one"  #: keep at most one occurrence waiting behind a running one
    CANCEL_PREVIOUS = "cancel_previous"  #: cancel the running occurrence, start the new one


class MisfirePolicy(models.TextChoices):
    SKIP = "skip"  #: run nothing that was missed
    RUN_ONCE = "run_once"  #: one catch-up run for everything missed
    RUN_ALL = "run_all"  #: every missed occurrence, bounded by a maximum


def artifact_upload_to(instance: Artifact, filename: str) -> str:
    return f"artifacts/{instance.owner_id}/{instance.id}/{filename}"


class Artifact(models.Model):
    """An uploaded binary or script that a ``subprocess`` task runs, stored with Django's storage
    API (local files by default, S3 through django-storages by setting)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tms_artifacts")
    name = models.CharField(max_length=200)
    file = models.FileField(upload_to=artifact_upload_to, max_length=500)
    sha256 = models.CharField(max_length=64, help_text="Checksum of the content, checked before every run.")
    size = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.sha256[:12]})"


def default_timeout() -> timedelta:
    return timedelta(seconds=tms_settings().DEFAULT_TIMEOUT)


#: Bounds of a task's misfire settings. A grace under a second would turn the ordinary delay
#: between creating a "run now" task and materialising it into a misfire.
MIN_MISFIRE_GRACE = timedelta(seconds=1)
MAX_CATCH_UP_LIMIT = 1000


#: The largest per-task concurrency cap.
MAX_CONCURRENCY = 10_000


def claims_exclusive(*, overlap_policy: str, max_concurrency: int | None) -> bool:
    """Whether a task's executions are claimed through the checked (slow) claim, which looks at
    their running siblings: an overlap policy other than ``allow``, or a concurrency cap."""
    return overlap_policy != OverlapPolicy.ALLOW or max_concurrency is not None


def default_misfire_grace() -> timedelta:
    return timedelta(seconds=tms_settings().MISFIRE_GRACE)


def default_catch_up_limit() -> int:
    return tms_settings().CATCH_UP_LIMIT


class Task(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: task_owner_created_idx leads with the owner.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tms_tasks", db_index=False
    )
    name = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.ACTIVE)

    runner = models.CharField(max_length=64, help_text="Alias of a runner in TMS_RUNNERS.")
    config = models.JSONField(default=dict, blank=True, help_text="Runner config, validated by the runner.")
    # Indexed only where set (task_artifact_idx): most tasks have none.
    artifact = models.ForeignKey(
        Artifact,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="tasks",
        help_text="Uploaded binary.",
        db_index=False,
    )

    # Schedule: one-shot at start_at, or every `interval`, or on `cron` in `timezone`.
    start_at = models.DateTimeField()
    interval = models.DurationField(null=True, blank=True)
    cron = models.CharField(max_length=120, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    end_at = models.DateTimeField(null=True, blank=True)
    max_runs = models.PositiveIntegerField(null=True, blank=True)
    jitter = models.DurationField(default=timedelta(0), blank=True)
    misfire_policy = models.CharField(max_length=16, choices=MisfirePolicy.choices, default=MisfirePolicy.RUN_ONCE)
    misfire_grace = models.DurationField(
        default=default_misfire_grace,
        validators=[MinValueValidator(MIN_MISFIRE_GRACE)],
        help_text="A fire time later than this when it comes to run is a misfire, handled per misfire_policy.",
    )
    catch_up_limit = models.PositiveIntegerField(
        default=default_catch_up_limit,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_CATCH_UP_LIMIT)],
        help_text="The most missed fire times misfire policy run_all runs (the latest ones).",
    )
    overlap_policy = models.CharField(max_length=16, choices=OverlapPolicy.choices, default=OverlapPolicy.ALLOW)
    max_age = models.DurationField(
        null=True,
        blank=True,
        validators=[MinValueValidator(MIN_MISFIRE_GRACE)],
        help_text="A scheduled run not started this long after its fire time is skipped as expired (empty: never).",
    )
    max_concurrency = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_CONCURRENCY)],
        help_text="At most this many runs of the task RUNNING at once; the others wait, in due order (empty: no cap).",
    )

    # Retries and limits.
    max_attempts = models.PositiveSmallIntegerField(
        default=3, validators=[MinValueValidator(1), MaxValueValidator(100)]
    )
    retry_backoff = models.DurationField(default=timedelta(seconds=5), help_text="Delay before the first retry.")
    retry_backoff_max = models.DurationField(default=timedelta(minutes=10), help_text="Cap on the retry delay.")
    retry_jitter = models.BooleanField(default=True, help_text="Randomise retry delays (full jitter).")
    timeout = models.DurationField(default=default_timeout)
    priority = models.PositiveSmallIntegerField(
        default=5, validators=[MaxValueValidator(9)], help_text="0-9, 9 runs first."
    )

    notification_target = models.CharField(max_length=500, blank=True)
    tracing_id = models.CharField(max_length=64, blank=True)
    #: Opt-in to a per-task series at /metrics (last success time); capped by TMS_METRICS_MAX_TASKS.
    expose_metrics = models.BooleanField(
        default=False, help_text="Publish this task's last success time at /metrics (Prometheus)."
    )

    # Materialisation cursor: the next occurrence not yet turned into an execution (null: none left).
    next_run_at = models.DateTimeField(null=True, blank=True)
    runs_materialised = models.PositiveIntegerField(default=0)
    #: When the current (or last unresumed) pause began; occurrences missed after it are recorded
    #: as "paused". Set by pause, cleared when the task is materialised again after resume.
    paused_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["next_run_at"], condition=Q(status="ACTIVE"), name="task_due_active_idx"),
            models.Index(fields=["owner", "-created_at"], name="task_owner_created_idx"),
            models.Index(fields=["artifact"], condition=Q(artifact__isnull=False), name="task_artifact_idx"),
            # /metrics lists the opted-in tasks at every scrape: a few rows of a large table.
            models.Index(fields=["id"], condition=Q(expose_metrics=True), name="task_expose_metrics_idx"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(priority__lte=9), name="task_priority_0_9"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="task_max_attempts_positive"),
            models.CheckConstraint(condition=Q(misfire_grace__gte=MIN_MISFIRE_GRACE), name="task_misfire_grace_min"),
            models.CheckConstraint(
                condition=Q(catch_up_limit__gte=1, catch_up_limit__lte=MAX_CATCH_UP_LIMIT), name="task_catch_up_limit"
            ),
            models.CheckConstraint(
                condition=Q(max_age__isnull=True) | Q(max_age__gte=MIN_MISFIRE_GRACE), name="task_max_age_min"
            ),
            models.CheckConstraint(
                condition=Q(max_concurrency__isnull=True)
                | Q(max_concurrency__gte=1, max_concurrency__lte=MAX_CONCURRENCY),
                name="task_max_concurrency_range",
            ),
            models.CheckConstraint(
                condition=Q(end_at__isnull=True) | Q(end_at__gte=models.F("start_at")), name="task_end_after_start"
            ),
        ]

    def __str__(self) -> str:
        return self.name or str(self.id)


class ApiIdempotencyKey(models.Model):
    """The first response to a create request sent with an ``Idempotency-Key`` header.

    A retry with the same key and the same body gets this response back and creates nothing; the
    unique (owner, key) constraint makes concurrent duplicates wait for the first one and then
    replay it. Keys expire after ``TMS_IDEMPOTENCY_KEY_TTL`` seconds.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    #: sha256 of the request's method, path and body: the same key with another body is an error.
    request_fingerprint = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField()
    response_body = models.JSONField(encoder=DjangoJSONEncoder, null=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="idempotency_key_unique_per_owner")]
        indexes = [models.Index(fields=["created_at"], name="idempotency_key_created_idx")]

    def __str__(self) -> str:
        return f"{self.key} ({self.owner_id})"
