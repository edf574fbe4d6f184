"""The Task: what to run, on which runner, and when."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from tms_core.conf import MAX_KEEP_FOR, MAX_KEEP_LAST, MIN_KEEP_FOR, tms_settings


class TaskStatus(models.TextChoices):
    ACTIVE = "ACTIVE"  #: materialised and run per its schedule
    PAUSED = "PAUSED"  #: kept, but no new executions are created
    COMPLETED = "COMPLETED"  #: its schedule has no further occurrence, and it follows no task
    DELETED = "DELETED"  #: removed by its owner; history is kept


def status_for_cursor(*, next_run_at: object, has_after: bool) -> str:
    """The status of an active task whose materialisation cursor is ``next_run_at``: ACTIVE while
    its schedule has a further occurrence; once it has none, COMPLETED, unless the task follows
    others (``has_after``): a workflow step runs after its upstreams' runs whatever its own
    schedule says (it usually has none: created without one, its only "fire time" is its creation,
    long past), so the end of its schedule does not end it. Every place that completes a task by
    its cursor asks this (the materialiser and the create service)."""
    if next_run_at is not None or has_after:
        return TaskStatus.ACTIVE
    return TaskStatus.COMPLETED


class OverlapPolicy(models.TextChoices):
    ALLOW = "allow"  #: start every occurrence, even while the previous one runs
    SKIP = "skip"  #: skip an occurrence while the previous one still runs
    QUEUE_ONE = "queue_one"  #: keep at most one occurrence waiting behind a running one
    CANCEL_PREVIOUS = "cancel_previous"  #: cancel the running occurrence, start the new one


class MisfirePolicy(models.TextChoices):
    SKIP = "skip"  #: run nothing that was missed
    RUN_ONCE = "run_once"  #: one catch-up run for everything missed
    RUN_ALL = "run_all"  #: every missed occurrence, bounded by a maximum


class DstGap(models.TextChoices):
    """What a cron task does with wall times the clock skips (tasks_app.schedules.DST_GAP_RULES)."""

    AUTO = "", "by the hour field"  #: shift for a fixed hour, skip for a clock-following expression
    SHIFT = "shift"  #: fire once, right after the gap
    SKIP = "skip"  #: do not fire


class DstFold(models.TextChoices):
    """What a cron task does with wall times the clock shows twice (tasks_app.schedules.DST_FOLD_RULES)."""

    AUTO = "", "by the hour field"  #: first for a fixed hour, both for a clock-following expression
    FIRST = "first"  #: at the first occurrence (summer time)
    SECOND = "second"  #: at the second occurrence (standard time)
    BOTH = "both"  #: at both


class ArtifactStatus(models.TextChoices):
    UPLOADING = "UPLOADING"  #: waiting for the bytes at a signed upload URL
    READY = "READY"  #: stored and verified (size, SHA-256): tasks may use it
    REJECTED = "REJECTED"  #: the upload did not match what was declared, or it expired


def artifact_upload_to(instance: Artifact, filename: str) -> str:
    return f"artifacts/{instance.owner_id}/{instance.id}/{filename}"


class Artifact(models.Model):
    """An uploaded binary or script that a ``subprocess`` task runs, stored with Django's storage
    API (local files by default, S3 through django-storages by setting)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    #: Who uploaded it. The team decides who sees and uses it (:mod:`tasks_app.teams`).
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tms_artifacts")
    #: The team it belongs to: its members see it, its editors upload and delete, and only the
    #: team's tasks may run it.
    team = models.ForeignKey("Team", on_delete=models.PROTECT, related_name="artifacts")
    name = models.CharField(max_length=200)
    file = models.FileField(upload_to=artifact_upload_to, max_length=500)
    sha256 = models.CharField(max_length=64, help_text="Checksum of the content, checked before every run.")
    size = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    status = models.CharField(
        max_length=10,
        choices=ArtifactStatus.choices,
        default=ArtifactStatus.READY,
        help_text="UPLOADING until a signed upload arrives and is verified; tasks use READY artifacts only.",
    )
    rejection_reason = models.CharField(max_length=500, blank=True, default="")
    #: A signed upload URL is valid until then (UPLOADING artifacts only).
    upload_expires_at = models.DateTimeField(null=True, blank=True)
    #: Set (conditionally) by the first request to the signed URL: the URL is single-use.
    upload_started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.sha256[:12]})"


#: The most retries of a failed workflow run a task may ask for (``Task.workflow_retries``).
MAX_WORKFLOW_RETRIES = 10
#: The most items of a map step (``Task.map_over``) run at once a task may ask for, and its default.
MAX_MAP_CONCURRENCY = 1000
DEFAULT_MAP_CONCURRENCY = 10
#: The most items a map step runs in one workflow run: a longer list fails the step.
MAX_MAP_ITEMS = 10_000


def default_timeout() -> timedelta:
    return timedelta(seconds=tms_settings().DEFAULT_TIMEOUT)


#: Bounds of a task's misfire settings. A grace under a second would turn the ordinary delay
#: between creating a "run now" task and materialising it into a misfire.
MIN_MISFIRE_GRACE = timedelta(seconds=1)
MAX_CATCH_UP_LIMIT = 1000


MIN_KEEP_FOR_DELTA = timedelta(seconds=MIN_KEEP_FOR)
MAX_KEEP_FOR_DELTA = timedelta(seconds=MAX_KEEP_FOR)

#: The largest per-task concurrency cap.
MAX_CONCURRENCY = 10_000
#: The longest a trigger's run may wait for others to join it (``Task.trigger_debounce``).
MAX_TRIGGER_DEBOUNCE = timedelta(days=1)


def claims_exclusive(*, overlap_policy: str, max_concurrency: int | None, has_limits: bool = False) -> bool:
    """Whether a task's executions are claimed through the checked (slow) claim, which looks at
    their running siblings: an overlap policy other than ``allow``, a concurrency cap, or named
    limits (:class:`Limit`)."""
    return overlap_policy != OverlapPolicy.ALLOW or max_concurrency is not None or has_limits


class LimitScope(models.TextChoices):
    KEY = "key"  #: one budget shared by every run of the tasks that reference the limit
    RUNNER = "runner"  #: one budget per runner alias
    HOST = "host"  #: one budget per target host (the runner's ``limit_key`` of the task's config)


#: Bounds of a named limit: its cap, a rate window's count and length, and how many windows.
MAX_LIMIT_CONCURRENCY = 100_000
MAX_WINDOW_COUNT = 1_000_000
MIN_WINDOW_SECONDS = 0.001
MAX_WINDOW_SECONDS = 86_400.0
MAX_WINDOWS = 5
MAX_LIMITS_PER_TASK = 10


class Limit(models.Model):
    """A named limit on when runs may start, shared by every task that references it: at most
    ``max_concurrency`` runs holding a slot at once, and at most ``count`` starts in any
    ``seconds``-long window for each of ``windows``. Belongs to a team (the team's tasks may
    reference it), or is global (no team, no owner: defined by staff, any team's task may
    reference it).

    ``scope`` says how runs are grouped into budgets: one for all (``key``), one per runner
    alias (``runner``) or one per target host (``host``). Enforced at claim time through
    PostgreSQL (:mod:`executions.limits`)."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="tms_limits",
        help_text="Who defined it (empty for a global limit).",
    )
    #: The team whose tasks may reference it; null: a global limit (staff), for every team's tasks.
    team = models.ForeignKey(
        "Team",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="limits",
        db_index=False,  # limit_unique_name_per_team leads with it
        help_text="Empty: a global limit (staff), any team's task may reference it.",
    )
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=8, choices=LimitScope.choices, default=LimitScope.KEY)
    #: For scope ``key``: what the budget is shown as (defaults to the name).
    key = models.CharField(max_length=200, blank=True, default="")
    max_concurrency = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_LIMIT_CONCURRENCY)],
        help_text="At most this many runs holding a slot at once (empty: no cap).",
    )
    #: ``[{"count": 10, "seconds": 1.0}, ...]``: at most count starts in any window that long.
    windows = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "name"], condition=Q(team__isnull=False), name="limit_unique_name_per_team"
            ),
            models.UniqueConstraint(fields=["name"], condition=Q(team__isnull=True), name="limit_unique_global_name"),
            models.CheckConstraint(
                condition=Q(max_concurrency__isnull=True) | Q(max_concurrency__gte=1), name="limit_cap_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class CalendarPolicy(models.TextChoices):
    """What a task does with a fire time on a day its calendar closes (tasks_app.calendars)."""

    NONE = "", "no calendar"  #: the task has no calendar
    SKIP = "skip"  #: the occurrence does not run; recorded as skipped with the reason ``holiday``
    NEXT_BUSINESS_DAY = "next_business_day"  #: it runs at the same wall time on the next open day
    PREVIOUS_BUSINESS_DAY = "previous_business_day"  #: it runs at the same wall time on the open day before


def default_weekend_days() -> list[int]:
    return [6, 7]  # ISO weekdays: Saturday and Sunday


class Calendar(models.Model):
    """A reusable business calendar, of a team like a task: the public holidays of a country (and
    optionally one of its subdivisions) from the ``holidays`` package, extra closed dates and
    date ranges with a label each, and optionally weekends.

    Tasks reference it (``Task.calendar``) with a :class:`CalendarPolicy`; the materialiser asks
    it whether a fire time's local date is closed and why (:mod:`tasks_app.calendars`). A change
    re-plans the tasks that use it; it cannot be deleted while a task (not deleted) uses it.
    """

    #: Who defined it. The team decides who sees and uses it (:mod:`tasks_app.teams`).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tms_calendars", db_index=False
    )
    #: The team whose tasks may use it. No index of its own: calendar_unique_name_per_team leads with it.
    team = models.ForeignKey("Team", on_delete=models.PROTECT, related_name="calendars", db_index=False)
    name = models.CharField(max_length=100)
    country = models.CharField(
        max_length=3, blank=True, help_text="ISO 3166 code of the country whose public holidays close (empty: none)."
    )
    subdivision = models.CharField(
        max_length=10, blank=True, help_text="A subdivision of the country (state, province), e.g. BY for Bavaria."
    )
    weekends_closed = models.BooleanField(default=False, help_text="Whether the weekend days are closed.")
    #: ISO weekdays (1 Monday ... 7 Sunday) that make the weekend.
    weekend_days = models.JSONField(default=default_weekend_days, blank=True)
    #: ``[{"start": "2027-12-24", "end": "2027-12-31", "label": "shutdown"}, ...]`` (end inclusive).
    extra_dates = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="calendar_unique_name_per_team")]

    def __str__(self) -> str:
        return self.name


def default_misfire_grace() -> timedelta:
    return timedelta(seconds=tms_settings().MISFIRE_GRACE)


def default_catch_up_limit() -> int:
    return tms_settings().CATCH_UP_LIMIT


class TeamRole(models.TextChoices):
    """A member's role in a team; each includes the ones before it (see :mod:`tasks_app.teams`)."""

    VIEWER = "viewer"  #: reads the team's tasks and runs
    OPERATOR = "operator"  #: also runs now, pauses, resumes, cancels, retries, backfills, triggers, replays
    EDITOR = "editor"  #: also creates, changes, moves and deletes tasks
    ADMIN = "admin"  #: also manages the team's members and its name


class Team(models.Model):
    """Who owns tasks (and their runs): every user has a personal team, of which they are the only
    member (its admin), and may belong to any number of shared teams with a role in each."""

    id = models.AutoField(primary_key=True)
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=60, unique=True)
    #: The user whose personal team this is (empty for a shared team). A personal team has one
    #: member, that user, as admin; it cannot be deleted or shared.
    personal_of = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="personal_team"
    )
    created_at = models.DateTimeField(db_default=Now())
    #: Made (or marked) by an administrator: staff created it, or ``tms_team_managed`` marked it.
    #: Only such a team receives the members single sign-on's group mapping grants
    #: (``TMS_OIDC_GROUPS`` ``team:<slug>:<role>``, :func:`accounts.sso.sync_team_memberships`):
    #: a team any user made under a mapped slug would otherwise collect the group's members.
    managed = models.BooleanField(db_default=False, default=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def personal(self) -> bool:
        return self.personal_of_id is not None


class Membership(models.Model):
    """``user`` belongs to ``team`` with ``role``: added by hand (the API, the back office), or by
    single sign-on (``sso``): see :func:`accounts.sso.sync_team_memberships`."""

    id = models.BigAutoField(primary_key=True)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tms_memberships", db_index=False
    )
    role = models.CharField(max_length=16, choices=TeamRole.choices)
    #: Granted by the identity provider's groups (``TMS_OIDC_GROUPS`` ``team:<slug>:<role>``): each
    #: sign-in adds, changes and removes these memberships, and never one added by hand (False). A
    #: role changed by hand takes the membership over (False from then on).
    sso = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Managed by single sign-on: each sign-in sets or removes it from the provider's groups.",
    )
    created_at = models.DateTimeField(db_default=Now())

    #: The personal access token (``accounts.AccessToken`` id) that added the member or last set
    #: their role by hand; None for a session, an account key, a command or single sign-on. No
    #: foreign key: accounts sits above this app. Lets the token's owner list and undo what a
    #: token granted (:func:`accounts.tokens.token_made`).
    created_by_token = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            # Leads with the user: every scoped read asks "which teams is this user in?".
            models.UniqueConstraint(fields=["user", "team"], name="membership_unique_user_team"),
        ]
        indexes = [
            models.Index(
                fields=["created_by_token"],
                name="membership_by_token_idx",
                condition=Q(created_by_token__isnull=False),
            )
        ]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.team_id} as {self.role}"


class JoinRule(models.TextChoices):
    """When a step that follows several tasks runs, over its ``after`` links (Airflow's trigger
    rules; :func:`tasks_app.workflow_rules.join_decide`). A link is *met* when its upstream's run
    ended as its ``on`` asks and its condition holds; an upstream is *done* once its run ended or
    it was skipped."""

    ALL_SUCCESS = "all_success"  #: every link met (the default); skipped as soon as one cannot be
    ALL_DONE = "all_done"  #: every upstream done, however
    ONE_SUCCESS = "one_success"  #: as soon as one link is met
    ONE_FAILED = "one_failed"  #: as soon as one upstream failed for good (and its condition holds)
    NONE_FAILED = "none_failed"  #: every upstream done, none failed (succeeded or skipped)


class Task(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: task_owner_created_idx leads with the owner.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tms_tasks", db_index=False
    )
    #: The team the task belongs to: its members see and act on it by their role
    #: (:mod:`tasks_app.teams`). Its executions copy it (``Execution.team_id``). No index of its own:
    #: task_team_live_idx leads with it.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="tasks", db_index=False)
    name = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.ACTIVE)

    runner = models.CharField(max_length=64, help_text="Alias of a runner in TMS_RUNNERS.")
    #: Secret values are stored encrypted ({"$enc": token}); read it through tasks_app.secrets.
    config = models.JSONField(default=dict, blank=True, help_text="Runner config, validated by the runner.")
    secret_fields = models.JSONField(
        default=list,
        blank=True,
        help_text='Paths into config whose values are secret, e.g. ["payload.token"]: encrypted, masked on read.',
    )
    #: A JSON Schema a run's input must satisfy (checked at trigger time); null: any object.
    input_schema = models.JSONField(
        null=True,
        blank=True,
        help_text="JSON Schema of a run's input (trigger, trigger URL body, upstream output); null: any object.",
    )
    #: Config paths a run's input fills: {"<config path>": "<input path>"} (tasks_app.run_input).
    input_fills = models.JSONField(
        default=dict,
        blank=True,
        help_text='Config values a run\'s input fills, e.g. {"payload.date": "date"}: config path to input path.',
    )
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
    dst_gap = models.CharField(
        max_length=8,
        choices=DstGap.choices,
        default=DstGap.AUTO,
        db_default=DstGap.AUTO,
        blank=True,
        help_text="Cron: wall times the clock skips fire once right after the gap (shift) or not at all (skip); "
        "empty: shift for a fixed hour, skip for a clock-following expression.",
    )
    dst_fold = models.CharField(
        max_length=8,
        choices=DstFold.choices,
        default=DstFold.AUTO,
        db_default=DstFold.AUTO,
        blank=True,
        help_text="Cron: wall times the clock shows twice fire at their first, second or both occurrences; "
        "empty: first for a fixed hour, both for a clock-following expression.",
    )
    max_runs = models.PositiveIntegerField(null=True, blank=True)
    # Indexed only where set (task_calendar_idx): a calendar change finds its tasks.
    calendar = models.ForeignKey(
        Calendar,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="tasks",
        db_index=False,
        help_text="Business calendar: fire times on its closed days are skipped or moved per calendar_policy.",
    )
    calendar_policy = models.CharField(
        max_length=24,
        choices=CalendarPolicy.choices,
        default=CalendarPolicy.NONE,
        db_default=CalendarPolicy.NONE,
        blank=True,
        help_text="With a calendar: skip a closed day's fire time, or move it to the next or previous business day "
        "at the same wall time (default skip).",
    )
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
    #: "Run now" waits this long, and the triggers that come meanwhile join the run (empty: none).
    trigger_debounce = models.DurationField(
        null=True,
        blank=True,
        validators=[MinValueValidator(timedelta(seconds=1)), MaxValueValidator(MAX_TRIGGER_DEBOUNCE)],
        help_text="A trigger (run now) starts its run this long later; triggers meanwhile join that run (empty: "
        "each trigger runs at once).",
    )
    #: The named events it subscribes to (``POST /api/v1/events/{name}`` starts a run of it): a list
    #: of ``{"name", "debounce", "debounce_key", "debounce_max_wait"}`` (seconds, a JSON path),
    #: checked by :mod:`tasks_app.event_subscriptions`.
    on_events = models.JSONField(
        default=list,
        blank=True,
        help_text="Named events that start a run of it, each with an optional debounce by a key of the payload.",
    )

    #: Named limits its runs are subject to; ``has_limits`` mirrors "any", so a claim knows
    #: without a query (tasks without limits pay nothing).
    limits = models.ManyToManyField(Limit, blank=True, related_name="tasks")
    has_limits = models.BooleanField(default=False, db_default=False, editable=False)
    #: Whether its ``after`` (:class:`TaskDependency`, the tasks it follows) names any: a task's
    #: representation reads its entries only then (tasks without pay no query).
    has_after = models.BooleanField(default=False, db_default=False, editable=False)
    #: How its ``after`` links combine (:class:`JoinRule`); read only for a task that follows several.
    join = models.CharField(
        max_length=16, choices=JoinRule.choices, default=JoinRule.ALL_SUCCESS, db_default=JoinRule.ALL_SUCCESS
    )
    #: A map step (executions.transitions.follow): a path (``$.files``) into its one upstream's
    #: output naming a list; the task then runs once per item of it, each item its run's input.
    #: Empty: an ordinary step.
    map_over = models.CharField(max_length=200, blank=True, default="", db_default="")
    #: How many items of a map step run at once (1 to MAX_MAP_CONCURRENCY).
    map_concurrency = models.PositiveSmallIntegerField(
        default=DEFAULT_MAP_CONCURRENCY,
        db_default=DEFAULT_MAP_CONCURRENCY,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_MAP_CONCURRENCY)],
        help_text="How many items of a map step run at once.",
    )

    # Retries and limits.
    max_attempts = models.PositiveSmallIntegerField(
        default=3, validators=[MinValueValidator(1), MaxValueValidator(100)]
    )
    retry_backoff = models.DurationField(default=timedelta(seconds=5), help_text="Delay before the first retry.")
    retry_backoff_max = models.DurationField(default=timedelta(minutes=10), help_text="Cap on the retry delay.")
    retry_jitter = models.BooleanField(default=True, help_text="Randomise retry delays (full jitter).")
    timeout = models.DurationField(default=default_timeout)
    #: The longest a workflow run this task roots may go on, from its root run's start (empty: no
    #: limit); past it the run is cancelled, with the reason (executions.workflow_control).
    workflow_timeout = models.DurationField(
        null=True,
        blank=True,
        validators=[MinValueValidator(timedelta(seconds=1))],
        help_text="A workflow run started by a run of this task is cancelled once it has gone on this long.",
    )
    #: How many times a failed workflow run this task roots is retried from its failed steps
    #: (executions.workflow_control, beat's tms.workflow_retries).
    workflow_retries = models.PositiveSmallIntegerField(
        default=0,
        db_default=0,
        validators=[MaxValueValidator(MAX_WORKFLOW_RETRIES)],
        help_text="Retries of a failed workflow run this task starts, from its failed steps.",
    )
    priority = models.PositiveSmallIntegerField(
        default=5, validators=[MaxValueValidator(9)], help_text="0-9, 9 runs first."
    )

    tracing_id = models.CharField(max_length=64, blank=True)
    #: Opt-in to a per-task series at /metrics (last success time); capped by TMS_METRICS_MAX_TASKS.
    expose_metrics = models.BooleanField(
        default=False, help_text="Publish this task's last success time at /metrics (Prometheus)."
    )

    # Retention (executions.retention): null reads as the TMS_RETENTION_* default, so a change of
    # the default reaches every task that did not choose.
    keep_last = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_KEEP_LAST)],
        help_text="The most finished runs kept (null: TMS_RETENTION_KEEP_LAST).",
    )
    keep_for = models.DurationField(
        null=True,
        blank=True,
        validators=[MinValueValidator(MIN_KEEP_FOR_DELTA), MaxValueValidator(MAX_KEEP_FOR_DELTA)],
        help_text="Finished runs older than this go (null: TMS_RETENTION_KEEP_FOR).",
    )
    keep_failed_longer = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Failed runs go only when both keep_last and keep_for let them (whichever keeps more); "
        "other runs go when either does.",
    )

    # Materialisation cursor: the next occurrence not yet turned into an execution (null: none left).
    next_run_at = models.DateTimeField(null=True, blank=True)
    runs_materialised = models.PositiveIntegerField(default=0)
    #: When the current (or last unresumed) pause began; occurrences missed after it are recorded
    #: as "paused". Set by pause, cleared when the task is materialised again after resume.
    paused_at = models.DateTimeField(null=True, blank=True)
    #: The number of its current :class:`TaskVersion` (1 when created; each change adds one).
    #: Executions copy it when they are inserted (a database trigger: executions/task_version.py).
    version = models.PositiveIntegerField(default=1, db_default=1, editable=False)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["next_run_at"], condition=Q(status="ACTIVE"), name="task_due_active_idx"),
            models.Index(fields=["owner", "-created_at"], name="task_owner_created_idx"),
            # An owner's task ids, read alone (index-only): the dashboard's skipped occurrences of
            # one owner join them by hash. Without it PostgreSQL merge-joined along the primary key,
            # filtering every task by owner (20 ms a render at 100,000 tasks; 4 ms with it).
            models.Index(fields=["owner", "id"], name="task_owner_id_idx"),
            # Staff's task list (every owner's, newest first), in keyset pages on (created_at, id):
            # without it each page sorted every task (284 ms a page at 100,000 tasks, loaded machine).
            models.Index(fields=["-created_at", "-id"], condition=~Q(status="DELETED"), name="task_created_idx"),
            # Staff's list filtered by status (a few paused tasks among many).
            models.Index(fields=["status", "-created_at", "-id"], name="task_status_created_idx"),
            # An owner's list over their tasks not deleted, the same keyset.
            models.Index(
                fields=["owner", "-created_at", "-id"], condition=~Q(status="DELETED"), name="task_owner_live_idx"
            ),
            # A team's list over its tasks not deleted (what members see), the same keyset.
            models.Index(
                fields=["team", "-created_at", "-id"], condition=~Q(status="DELETED"), name="task_team_live_idx"
            ),
            # A team's task ids, read from the index alone: what a join of other rows to their
            # tasks by team hashes (the dashboard's skipped occurrences of a member's teams read
            # every task's row through the primary key without it: 29 ms at 100,000 tasks).
            models.Index(fields=["team", "id"], name="task_team_id_idx"),
            # The list's search: runner = q here, and name ILIKE '%q%' has a trigram index on UPPER(name):
            # migration 0017 (outside the model state).
            models.Index(fields=["runner"], name="task_runner_idx"),
            models.Index(fields=["artifact"], condition=Q(artifact__isnull=False), name="task_artifact_idx"),
            models.Index(fields=["calendar"], condition=Q(calendar__isnull=False), name="task_calendar_idx"),
            # /metrics lists the opted-in tasks at every scrape: a few rows of a large table.
            models.Index(fields=["id"], condition=Q(expose_metrics=True), name="task_expose_metrics_idx"),
            # A named event's subscribers (``on_events @> [{"name": ...}]``): only the tasks that
            # subscribe to any are in it, so a task without pays nothing at insert.
            GinIndex(
                fields=["on_events"],
                opclasses=["jsonb_path_ops"],
                condition=~Q(on_events=[]),
                name="task_on_events_idx",
            ),
            # Beat's workflow-timeout job reads the few tasks with a timeout every minute
            # (executions.workflow_control.workflow_runs_time_out), not every task.
            models.Index(fields=["id"], condition=Q(workflow_timeout__isnull=False), name="task_workflow_timeout_idx"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(priority__lte=9), name="task_priority_0_9"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="task_max_attempts_positive"),
            models.CheckConstraint(condition=Q(misfire_grace__gte=MIN_MISFIRE_GRACE), name="task_misfire_grace_min"),
            models.CheckConstraint(
                condition=Q(catch_up_limit__gte=1, catch_up_limit__lte=MAX_CATCH_UP_LIMIT), name="task_catch_up_limit"
            ),
            models.CheckConstraint(
                condition=Q(keep_last__isnull=True) | Q(keep_last__gte=1, keep_last__lte=MAX_KEEP_LAST),
                name="task_keep_last_range",
            ),
            models.CheckConstraint(
                condition=Q(keep_for__isnull=True)
                | Q(keep_for__gte=MIN_KEEP_FOR_DELTA, keep_for__lte=MAX_KEEP_FOR_DELTA),
                name="task_keep_for_range",
            ),
            models.CheckConstraint(
                condition=Q(max_age__isnull=True) | Q(max_age__gte=MIN_MISFIRE_GRACE), name="task_max_age_min"
            ),
            models.CheckConstraint(
                condition=Q(workflow_timeout__isnull=True) | Q(workflow_timeout__gte=timedelta(seconds=1)),
                name="task_workflow_timeout_min",
            ),
            models.CheckConstraint(
                condition=Q(workflow_retries__lte=MAX_WORKFLOW_RETRIES), name="task_workflow_retries_range"
            ),
            models.CheckConstraint(
                condition=Q(map_concurrency__gte=1, map_concurrency__lte=MAX_MAP_CONCURRENCY),
                name="task_map_concurrency_range",
            ),
            models.CheckConstraint(
                condition=Q(max_concurrency__isnull=True)
                | Q(max_concurrency__gte=1, max_concurrency__lte=MAX_CONCURRENCY),
                name="task_max_concurrency_range",
            ),
            models.CheckConstraint(
                condition=Q(end_at__isnull=True) | Q(end_at__gte=models.F("start_at")), name="task_end_after_start"
            ),
            models.CheckConstraint(
                condition=Q(calendar__isnull=True, calendar_policy="")
                | Q(calendar__isnull=False) & ~Q(calendar_policy=""),
                name="task_calendar_policy",
            ),
        ]

    def __str__(self) -> str:
        return self.name or str(self.id)

    def clean(self) -> None:
        # Only a verified upload can run: not one still UPLOADING, nor a REJECTED one.
        if self.artifact_id is not None and self.artifact is not None and self.artifact.status != ArtifactStatus.READY:
            raise ValidationError(
                {"artifact": [f"Artifact {self.artifact_id} is {self.artifact.status}: only READY artifacts can run."]}
            )


class DependencyOn(models.TextChoices):
    """How an upstream's run must end for its followers to run (an entry of a task's ``after``)."""

    SUCCESS = "success"  #: it SUCCEEDED
    FAILURE = "failure"  #: it FAILED for good (attempts exhausted or not retryable)
    COMPLETION = "completion"  #: either


#: The most entries a task's ``after`` may have.
MAX_AFTER = 20


class TaskDependency(models.Model):
    """One entry of a task's ``after``: ``task`` runs when a run of ``upstream`` ends as ``on``
    says (all its entries, within one workflow run, for a task that follows several). The run is
    created by :mod:`executions.transitions` in the transaction that records the upstream's end."""

    # No index of its own: task_dependency_once leads with it.
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="after", db_index=False)
    #: Indexed: the end of every run of an upstream looks up its followers.
    upstream = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="follower_links")
    on = models.CharField(max_length=16, choices=DependencyOn.choices, default=DependencyOn.SUCCESS)
    #: A condition on the upstream's output (:mod:`tasks_app.workflow_rules`), checked when written;
    #: null: none.
    condition = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "upstream"], name="task_dependency_once"),
            models.CheckConstraint(condition=~Q(task=models.F("upstream")), name="task_dependency_not_self"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} after {self.upstream_id} on {self.on}"


class ApiIdempotencyKey(models.Model):
    """The first response to a create request sent with an ``Idempotency-Key`` header.

    A retry with the same key and the same body gets this response back and creates nothing; the
    unique (owner, scope, key) constraint makes concurrent duplicates wait for the first one and
    then replay it. Keys expire after ``TMS_IDEMPOTENCY_KEY_TTL`` seconds.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    #: Whose keys these are beside the owner: "" for the owner's own requests (the API), or
    #: ``trigger-url:<id>`` for a trigger URL's, so that its holder can neither replay nor block
    #: the owner's keys, nor the owner a trigger URL's.
    scope = models.CharField(max_length=100, default="", blank=True, db_default="")
    key = models.CharField(max_length=255)
    #: sha256 of the request's method, path and body: the same key with another body is an error.
    request_fingerprint = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField()
    response_body = models.JSONField(encoder=DjangoJSONEncoder, null=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "scope", "key"], name="idempotency_key_unique_per_owner_scope")
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotency_key_created_idx")]

    def __str__(self) -> str:
        return f"{self.key} ({self.owner_id})"


class AuditAction(models.TextChoices):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    PAUSE = "pause"
    RESUME = "resume"
    TRIGGER = "trigger"
    BACKFILL = "backfill"
    MATERIALISE = "materialise"
    CANCEL = "cancel"
    RETRY = "retry"
    REPLAY = "replay"
    APPROVE = "approve"
    REJECT = "reject"


class AuditEntry(models.Model):
    """One user action: who did what to which object, when, from where, and what changed.

    Append-only; written in the same transaction as the change by :func:`tasks_app.audit.audit_record`.
    ``owner`` is the owner of the object acted on (who may read the entry), ``actor`` who acted
    (the same person, or staff acting for them). Secrets in ``changes`` are masked.
    """

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(db_default=Now())
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    #: The actor's username when it acted (kept if the user is deleted), or the command's user.
    actor_name = models.CharField(max_length=150)
    #: ``api``, ``admin``, ``backoffice``, ``command:<name>`` or ``system``.
    source = models.CharField(max_length=100)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    #: One of :class:`AuditAction`, or another app's verb (``channel.create``, ``rule.update``, ...).
    action = models.CharField(max_length=40)
    #: ``task``, ``execution``, ``artifact``, or another app's object kind (``channel``, ``rule``).
    object_type = models.CharField(max_length=40)
    object_id = models.CharField(max_length=64)
    #: The task the object belongs to (filters by task); no foreign key: entries outlive rows.
    task_id = models.UUIDField(null=True, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    #: ``{field: {"from": before, "to": after}}`` for an update; what was given for the others.
    changes = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["owner", "-id"], name="audit_owner_idx"),
            models.Index(fields=["task_id", "-id"], name="audit_task_idx", condition=Q(task_id__isnull=False)),
            models.Index(fields=["actor", "-id"], name="audit_actor_idx"),
            models.Index(fields=["at"], name="audit_at_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.actor_name} {self.action} {self.object_type} {self.object_id}"


class TeamQuota(models.Model):
    """A team's limits, where an operator set them; an empty field (or no row) means the default
    from the ``TMS_QUOTA_*`` settings, and 0 means no limit. Everything a quota counts is the
    team's: its tasks, the runs started on request of its tasks, its artifact bytes, and its share
    of the workers (``fair_weight``) against other teams.

    The row is also what serialises a team's quota-checked writes: each check locks it
    (``SELECT ... FOR UPDATE``) before it counts and writes, so two concurrent requests can never
    both pass the last free unit (see :mod:`tasks_app.quotas`). A row is created for a team at
    its first checked write, with every limit empty. Before teams the row was per user
    (``OwnerQuota``); migration 0032 moved each user's row to their personal team.
    """

    team = models.OneToOneField(Team, primary_key=True, on_delete=models.CASCADE, related_name="quota")
    max_tasks = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tasks (not deleted). Empty: TMS_QUOTA_MAX_TASKS; 0: no limit."
    )
    max_executions_per_hour = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Executions created on request (run now, backfill, retry, replay) per rolling hour. "
        "Empty: TMS_QUOTA_EXECUTIONS_PER_HOUR; 0: no limit.",
    )
    max_artifact_bytes = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Bytes of uploaded artifacts. Empty: TMS_QUOTA_ARTIFACT_BYTES; 0: no limit."
    )
    fair_weight = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        # The same bounds as tasks_app.quotas.team_quota_set checks, so the admin form names the field.
        validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Share of the workers when more is due than they can start, relative to other teams "
        "(weighted round-robin: weight 3 starts three runs for one of a weight-1 team). "
        "Empty: TMS_FAIR_WEIGHT (1). At least 1.",
    )

    class Meta:
        verbose_name = "team quota"

    def __str__(self) -> str:
        return f"quota of team {self.team_id}"


class QuotaUse(models.Model):
    """One use counted against a rolling-window limit of a team: executions created on request,
    or messages a runner with a send rate sent. Rows older than their window are deleted by the
    next check of the same team and kind (under the team's quota lock), so the table stays small.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+", db_index=False)
    #: ``executions``, or ``send:<runner alias>``.
    kind = models.CharField(max_length=80)
    amount = models.PositiveIntegerField()
    at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes = [models.Index(fields=["team", "kind", "at"], name="quota_use_team_kind_at_idx")]

    def __str__(self) -> str:
        return f"{self.amount} {self.kind} of team {self.team_id} at {self.at}"


class TaskVersion(models.Model):
    """One version of a task's settings: the task services write one when a task is created
    (number 1) and one for each change (the next number), in the transaction of the change.

    ``snapshot`` holds the audited settings as the audit log shows them: the runner config with
    every secret value masked (a secret is never stored here, not even encrypted), so a version
    can be shown and compared with another; ``changed`` names the fields that differ from the
    version before (a secret's new value changes nothing visible in the snapshot, but is named).
    """

    id = models.BigAutoField(primary_key=True)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="versions", db_index=False)
    number = models.PositiveIntegerField()
    snapshot = models.JSONField(default=dict, encoder=DjangoJSONEncoder)
    changed = models.JSONField(default=list, blank=True)
    actor_name = models.CharField(max_length=150)
    source = models.CharField(max_length=100)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-number"]
        constraints = [models.UniqueConstraint(fields=["task", "number"], name="task_version_unique_number")]

    def __str__(self) -> str:
        return f"{self.task_id} v{self.number}"


class TaskHook(models.Model):
    """A task's trigger URL: ``/hooks/v1/<id>`` starts a run of the task when the request is
    signed with (or bears) ``secret``. The id is random and says nothing of the task; the secret
    is stored encrypted (:func:`tasks_app.secrets.text_seal`: HMAC needs the secret itself, so it
    cannot be hashed) and shown once, when it is made. A task has at most one."""

    id = models.CharField(primary_key=True, max_length=64)
    task = models.OneToOneField(Task, on_delete=models.CASCADE, related_name="hook")
    #: ``$enc:<Fernet token>`` of the secret (never the secret in the clear).
    secret = models.TextField()
    created_at = models.DateTimeField(db_default=Now())
    #: When the secret was last replaced (null: never since the URL was made).
    rotated_at = models.DateTimeField(null=True, blank=True)
    #: When a request last started (or joined) a run through it.
    last_used_at = models.DateTimeField(null=True, blank=True)
    #: The personal access token (``accounts.AccessToken`` id) that made the hook or last rotated
    #: its secret; None otherwise. No foreign key: accounts sits above this app.
    created_by_token = models.BigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["created_by_token"], name="hook_by_token_idx", condition=Q(created_by_token__isnull=False)
            )
        ]

    def __str__(self) -> str:
        return f"hook {self.id} of {self.task_id}"


class SignedRequestMemory(models.Model):
    """What a signed URL (trigger URL, event URL) remembers of a request it accepted; each
    subclass adds its ``hook`` and a unique (hook, digest) constraint (read by
    :func:`tasks_app.hooks.hook_signature_remember`)."""

    #: sha256 of the request's timestamp and signature (the signature covers the body).
    digest = models.CharField(max_length=64)
    expires_at = models.DateTimeField()

    hook_id: str  # the subclass's hook (both kinds have string ids)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.digest[:12]} ({self.hook_id})"


class TaskHookSignature(SignedRequestMemory):
    """A signed request a trigger URL accepted, remembered while its timestamp could still be
    accepted (``expires_at``: the timestamp plus :data:`tasks_app.hooks.TOLERANCE`), so that the
    same request sent again (captured and replayed) is refused instead of starting another run.
    The unique (hook, digest) constraint decides between two copies sent at once."""

    hook = models.ForeignKey(TaskHook, on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["hook", "digest"], name="hook_signature_seen_once")]
        indexes = [models.Index(fields=["expires_at"], name="hook_signature_expires_idx")]


class EventHook(models.Model):
    """A signed event URL: ``/hooks/v1/events/<id>`` posts the named event ``name`` in ``team``
    (as ``POST /api/v1/events/{name}`` with ``?team=`` does) when the request is signed with (or
    bears) ``secret``, exactly as a trigger URL's (:mod:`tasks_app.hooks`). One per team and name."""

    id = models.CharField(primary_key=True, max_length=64)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.CharField(max_length=200)
    #: Who made it (or last rotated its secret): its requests' Idempotency-Keys are stored under them.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False)
    #: ``$enc:<Fernet token>`` of the secret (never the secret in the clear).
    secret = models.TextField()
    created_at = models.DateTimeField(db_default=Now())
    rotated_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="event_hook_one_per_name")]

    def __str__(self) -> str:
        return f"event URL {self.id[:8]} ({self.name})"


class EventHookSignature(SignedRequestMemory):
    """A signed request an event URL accepted, remembered as :class:`TaskHookSignature` is."""

    hook = models.ForeignKey(EventHook, on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["hook", "digest"], name="event_hook_signature_seen_once")]
        indexes = [models.Index(fields=["expires_at"], name="event_hook_signature_exp_idx")]
