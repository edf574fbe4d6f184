"""What the task API reads and writes."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils.timezone import is_naive as timezone_is_naive
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from executions.models import Execution
from executions.serializers import CancelReportSerializer, InputField
from tasks_api.checks import task_check_rules
from tasks_api.limits import task_limit_names
from tasks_api.states import TaskState, task_next_run, task_state
from tasks_api.task_config import task_config, task_config_masked
from tasks_api.workflows import task_after_entries
from tasks_app import fields as task_fields
from tasks_app import run_config
from tasks_app.event_subscriptions import SubscriptionsField, subscriptions_clean
from tasks_app.fields import UPDATABLE_FIELDS
from tasks_app.models import (
    DEFAULT_MAP_CONCURRENCY,
    MAX_AFTER,
    MAX_CATCH_UP_LIMIT,
    MAX_CONCURRENCY,
    MAX_KEEP_FOR_DELTA,
    MAX_LIMITS_PER_TASK,
    MAX_MAP_CONCURRENCY,
    MAX_TRIGGER_DEBOUNCE,
    MAX_WORKFLOW_RETRIES,
    MIN_KEEP_FOR_DELTA,
    MIN_MISFIRE_GRACE,
    Artifact,
    CalendarPolicy,
    DependencyOn,
    DstFold,
    DstGap,
    JoinRule,
    MisfirePolicy,
    OverlapPolicy,
    Task,
    TaskStatus,
    default_catch_up_limit,
    default_misfire_grace,
    default_timeout,
)
from tasks_app.run_config import task_validate_runner
from tasks_app.run_input import check_input_fills, check_input_schema, has_nul
from tasks_app.schedule_words import schedule_words
from tasks_app.schedules import (
    CRON_BLANKS,
    CRON_HELP,
    ScheduleError,
    validate_cron,
    validate_timezone,
    wall_time_to_utc,
)
from tasks_app.secrets import check_secret_fields, config_unmask
from tasks_app.teams import member_team_ids
from tasks_app.workflow_rules import ConditionError, condition_check, path_parse
from teams_api.scope import TeamRefField
from tms_core.api.base import (
    MAX_DATETIME,
    MIN_DATETIME,
    BoundedDateTimeField,
    BuiltOnceFieldsMixin,
    StrictInputMixin,
)
from tms_core.conf import MAX_KEEP_LAST
from tms_core.durations import DurationField
from tms_core.errors import InvalidInput


class RunnerAliasField(serializers.CharField):
    """A runner alias of ``TMS_RUNNERS`` (checked with the config, so the error lists the choices)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 64)
        kwargs.setdefault("help_text", "Runner alias: one of the runners configured in TMS_RUNNERS.")
        super().__init__(**kwargs)


class RunnerConfigField(serializers.JSONField):
    """A runner's per-task config: a JSON object the runner validates (its fields are documented per runner)."""


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": True,
        "description": 'The runner config, every secret value masked as "********" (headers, env values, '
        "secret-looking keys, URL passwords, the paths in secret_fields). Send a masked value back "
        "unchanged to keep it.",
    }
)
class MaskedConfigField(serializers.Field):
    """A task's config as the API shows it: secrets masked (read-only, ``source="*"``)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("source", "*")
        kwargs.setdefault("read_only", True)
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        return task_config_masked(value)


#: Help text of ``secret_fields``.
PROTECTED_PATHS_HELP = (
    'Paths into config whose values are secret, e.g. ["payload.token", "args.2"] (dot-separated; a number '
    "indexes a list; everything under a path is secret). Header values, env values, secret-looking keys "
    "(token, password, api_key, ...) and URL passwords are secret without being listed. Secret values are "
    "encrypted at rest, write-only (masked on read, kept when the mask is sent back) and given to the runner only."
)


#: Help text of ``input_schema``.
INPUT_SCHEMA_HELP = (
    "A JSON Schema (draft 2020-12 unless it names another with `$schema`) that a run's input must satisfy: "
    "the `input` of `POST .../trigger`, a trigger URL's JSON body. A trigger without an input is checked as `{}`, "
    "so required keys are required. Null: any JSON object."
)
#: Help text of ``input_fills``.
INPUT_FILLS_HELP = (
    'Config values a run\'s input fills: `{"<config path>": "<input path>"}`, both dot-separated (a number '
    "indexes a list). At run time the runner gets the config with exactly these paths set from the run's input "
    "(a trigger's, a trigger URL's body, an upstream's output); a value the input lacks leaves the config's. "
    "A path must name something in config, and no secret."
)


@extend_schema_field({"type": "object", "additionalProperties": True, "nullable": True})
class InputSchemaField(serializers.JSONField):
    """A task's ``input_schema``: a JSON Schema (an object), or null."""


class LocalDateTimeField(BoundedDateTimeField):
    """An RFC 3339 date-time; one without a UTC offset is a wall-clock time in the task's
    ``timezone``, read by :func:`localize_wall_times` (it stays naive until then)."""

    def enforce_timezone(self, value: datetime) -> datetime:
        return value if timezone_is_naive(value) else super().enforce_timezone(value)

    def to_internal_value(self, value: Any) -> datetime:
        parsed = serializers.DateTimeField.to_internal_value(self, value)
        low, high = (MIN_DATETIME, MAX_DATETIME)
        if timezone_is_naive(parsed):
            low, high = low.replace(tzinfo=None), high.replace(tzinfo=None)
        if not low <= parsed < high:
            self.fail("range")
        return parsed


#: The fields of a task's schedule that :class:`LocalDateTimeField` reads.
WALL_TIME_FIELDS = ("start_at", "end_at")


def localize_wall_times(attrs: dict[str, Any], timezone: str) -> None:
    """Turn ``start_at`` and ``end_at`` given without an offset into instants, read on the wall
    clock of ``timezone`` (a skipped local time is an error on its field; a repeated one is read
    as its first occurrence)."""
    errors: dict[str, list[str]] = {}
    for name in WALL_TIME_FIELDS:
        value = attrs.get(name)
        if value is None or not timezone_is_naive(value):
            continue
        try:
            attrs[name] = wall_time_to_utc(value, timezone)
        except ScheduleError as exc:
            errors[name] = [str(exc)]
    if errors:
        raise serializers.ValidationError(errors)


class OwnArtifactField(serializers.PrimaryKeyRelatedField):
    """An artifact by id: one of your teams' (another team's id is "does not exist"); any with
    the permission to change anyone's tasks (superusers), not for read-only support staff. That
    it is of the task's own team is the service's check (:func:`tasks_api.checks.artifact_check_team`)."""

    def get_queryset(self) -> QuerySet[Artifact]:
        queryset = Artifact.objects.all()
        request = self.context.get("request")
        if request is not None and not request.user.has_perm("tasks_app.change_task"):
            return queryset.filter(team_id__in=member_team_ids(request.user))
        return queryset


#: The answer to a request that still sends the removed ``notification_target`` field.
NOTIFICATION_TARGET_REMOVED = (
    "This field was removed: notifications are channels and rules now. Create a channel with "
    "POST /api/v1/notification-channels, then a rule for this task with POST /api/v1/notification-rules "
    "(existing values were turned into such a channel and rule)."
)


DST_GAP_HELP = (
    "Cron only: wall times the clock skips when it is set forward fire once right after the gap (`shift`) or not "
    "at all (`skip`). Empty: `shift` for a fixed hour (`30 2 * * *`), `skip` for a clock-following expression "
    "(`*/15 * * * *`)."
)
DST_FOLD_HELP = (
    "Cron only: wall times the clock shows twice when it is set back fire at their `first` occurrence (summer "
    "time), their `second` (standard time) or `both`. Empty: `first` for a fixed hour, `both` for a "
    "clock-following expression."
)


def dst_gap_field() -> serializers.ChoiceField:
    """A task's (or a previewed schedule's) ``dst_gap``: optional, empty by default."""
    return serializers.ChoiceField(
        choices=DstGap.choices, required=False, allow_blank=True, default=DstGap.AUTO, help_text=DST_GAP_HELP
    )


def dst_fold_field() -> serializers.ChoiceField:
    """A task's (or a previewed schedule's) ``dst_fold``: optional, empty by default."""
    return serializers.ChoiceField(
        choices=DstFold.choices, required=False, allow_blank=True, default=DstFold.AUTO, help_text=DST_FOLD_HELP
    )


CALENDAR_POLICY_HELP = (
    "With a calendar: `skip` (default) records a closed day's fire time as skipped (reason `holiday`, the holiday's "
    "name); `next_business_day` / `previous_business_day` run it at the same wall time on the next / previous "
    "business day (the execution's `moved_from` says from where). Empty without a calendar."
)


CONDITION_HELP = (
    "Run only if this holds on the upstream's output (read as the step's input would be: its JSON object, or "
    '`{"output": "<text>"}`, with `error` after a failure). A test `{"path": "$.status", "op": "==", "value": "ok"}` '
    '(ops `==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, `not in`, `exists`; paths `$.key`, `[0]`, `["key"]`, '
    '`.length`), or `{"all": [...]}`, `{"any": [...]}`, `{"not": {...}}`. null: none.'
)


@extend_schema_field({"type": "object", "additionalProperties": True})
class ConditionField(serializers.JSONField):
    """A condition on an upstream's output (:mod:`tasks_app.workflow_rules`): a JSON object."""


class AfterEntrySerializer(StrictInputMixin, serializers.Serializer):
    """One task this task follows, and how its run must end."""

    task = serializers.UUIDField(help_text="Id of one of your tasks (not deleted).")
    on = serializers.ChoiceField(
        choices=DependencyOn.choices,
        required=False,
        default=DependencyOn.SUCCESS,
        help_text="Run after its run succeeded (`success`, the default), failed for good (`failure`) or either "
        "(`completion`).",
    )
    condition = ConditionField(
        required=False,
        allow_null=True,
        default=None,
        help_text=CONDITION_HELP,
    )

    def validate_condition(self, value: Any) -> Any:
        try:
            condition_check(value) if value is not None else None
        except ConditionError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value


AFTER_HELP = (
    'The tasks this task follows: `[{"task": "<id>", "on": "success"}]`. When a run of one ends that way, a run of '
    "this task is created in the same transaction (due now), with that run's output as its `input`; with several "
    "entries, once all of them have ended that way within the same workflow run (fan-in). With no schedule "
    "(`start_at`, `interval`, `cron`) it runs only after them. A cycle, an unknown task or another owner's is a 400."
)


JOIN_HELP = (
    "How its `after` links combine (a link is met when its upstream's run ended as its `on` asks and its condition "
    "holds): `all_success` (default) every link met; `one_success` as soon as one is; `one_failed` as soon as one "
    "upstream failed for good (its condition holding); `all_done` once every upstream ended or was skipped; "
    "`none_failed` once every upstream ended or was skipped, none failed. A step that will not run is skipped, "
    "with its reason. `all_done` and `none_failed` read no `on` or condition, `one_failed` no `on`: one set is a 400."
)


TEAM_HELP = (
    "The team it belongs to, by slug or id (default: your personal team). You need the editor role there; "
    "changing it moves the task and its runs, and needs editor in both teams."
)


class TaskCreateSerializer(BuiltOnceFieldsMixin, StrictInputMixin, serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    team = TeamRefField(required=False, help_text=TEAM_HELP)
    runner = RunnerAliasField()
    config = RunnerConfigField(required=False, default=dict)
    secret_fields = serializers.ListField(
        child=serializers.CharField(max_length=200),
        required=False,
        default=list,
        max_length=100,
        help_text=PROTECTED_PATHS_HELP,
    )
    input_schema = InputSchemaField(
        required=False,
        allow_null=True,
        default=None,
        help_text=INPUT_SCHEMA_HELP,
    )
    input_fills = serializers.DictField(
        child=serializers.CharField(max_length=200),
        required=False,
        default=dict,
        help_text=INPUT_FILLS_HELP,
    )
    artifact = OwnArtifactField(
        queryset=Artifact.objects.all(),
        required=False,
        allow_null=True,
        default=None,
        help_text="An uploaded artifact (POST /api/v1/artifacts) of the task's team that a subprocess task runs.",
    )
    start_at = LocalDateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="First (or only) run, RFC 3339. Without a UTC offset it is a wall-clock time in `timezone`. "
        "Default: now.",
    )
    interval = DurationField(
        required=False,
        allow_null=True,
        default=None,
        min_value=timedelta(milliseconds=100),
        help_text='Repeat every interval: seconds or a duration string such as "90s", "5m", "1h".',
    )
    cron = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=120,
        trim_whitespace=False,  # validate_cron strips ASCII blanks only: a trailing U+3000 is an error
        help_text=CRON_HELP,
    )
    timezone = serializers.CharField(required=False, default="UTC", max_length=64, help_text="IANA time zone name.")
    dst_gap = dst_gap_field()
    dst_fold = dst_fold_field()
    end_at = LocalDateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="No runs after this. Without a UTC offset it is a wall-clock time in `timezone`.",
    )
    max_runs = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=1_000_000_000
    )
    after = serializers.ListField(
        child=AfterEntrySerializer(), required=False, max_length=MAX_AFTER, help_text=AFTER_HELP
    )
    join = serializers.ChoiceField(
        choices=JoinRule.choices, required=False, default=JoinRule.ALL_SUCCESS, help_text=JOIN_HELP
    )
    calendar = serializers.CharField(
        required=False,
        allow_null=True,
        default=None,
        max_length=100,
        help_text="Name of a business calendar of the task's team (POST /api/v1/calendars): fire times on its "
        "closed days are skipped or moved per calendar_policy. null: none.",
    )
    calendar_policy = serializers.ChoiceField(
        choices=CalendarPolicy.choices,
        required=False,
        allow_blank=True,
        default=CalendarPolicy.NONE,
        help_text=CALENDAR_POLICY_HELP,
    )
    jitter = DurationField(required=False, default=timedelta(0))
    misfire_policy = serializers.ChoiceField(
        choices=MisfirePolicy.choices,
        default=MisfirePolicy.RUN_ONCE,
        help_text=(
            "Fire times missed by more than misfire_grace (downtime, a pause, a backlog): skip runs none, "
            "run_once runs the latest once, run_all runs the latest catch_up_limit of them. The others are "
            "recorded as skipped (GET /tasks/{id}/why)."
        ),
    )
    misfire_grace = DurationField(
        required=False,
        default=default_misfire_grace,
        min_value=MIN_MISFIRE_GRACE,
        max_value=timedelta(days=30),
        help_text="How late a fire time may start and still count as on time (default TMS_MISFIRE_GRACE, 60 s).",
    )
    catch_up_limit = serializers.IntegerField(
        required=False,
        default=default_catch_up_limit,
        min_value=1,
        max_value=MAX_CATCH_UP_LIMIT,
        help_text="The most missed fire times run_all runs, the latest ones (default TMS_CATCH_UP_LIMIT, 100).",
    )
    overlap_policy = serializers.ChoiceField(
        choices=OverlapPolicy.choices,
        default=OverlapPolicy.ALLOW,
        help_text=(
            "When a run starts while an earlier one of the task is still running: allow both; skip the new one; "
            "queue_one (the new one waits, at most one waiting, others skipped); cancel_previous (the running one "
            "is cancelled through its runner)."
        ),
    )
    max_age = DurationField(
        required=False,
        allow_null=True,
        default=None,
        min_value=MIN_MISFIRE_GRACE,
        max_value=timedelta(days=30),
        help_text=(
            "A scheduled run not started this long after its fire time is skipped with the reason `expired` "
            "instead of running late (null: never). At least the task's jitter plus 1 s."
        ),
    )
    max_concurrency = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=1,
        max_value=MAX_CONCURRENCY,
        help_text=(
            "At most this many runs of the task RUNNING at once (null: no cap). The others wait, in due order, "
            "and start as runs end; the execution says why it waits (`waiting: max_concurrency 2`). Counts with "
            "overlap_policy allow; the other overlap policies already keep one run at a time."
        ),
    )
    trigger_debounce = DurationField(
        required=False,
        allow_null=True,
        default=None,
        min_value=timedelta(seconds=1),
        max_value=MAX_TRIGGER_DEBOUNCE,
        help_text=(
            "Debounce for triggers (`POST .../trigger`, run now): the first trigger's run starts this long later, "
            "and the triggers that come before it starts join it (answered 200 with that run) instead of starting "
            "runs of their own. The first trigger's run wins. Null: every trigger runs at once."
        ),
    )
    on_events = SubscriptionsField(
        required=False,
        default=list,  # type: ignore[arg-type]
        help_text=(
            "Named events that start a run of it (`POST /api/v1/events/{name}`): a list of names, or of objects "
            '`{"name", "debounce", "debounce_key", "debounce_max_wait"}` (seconds; debounce_key a JSON path into '
            "the payload such as `$.customer_id`): events of the same key within `debounce` make one run, due "
            "`debounce` after the last of them, never later than `debounce_max_wait` after the first."
        ),
    )
    limits = serializers.ListField(
        child=serializers.CharField(max_length=100),
        required=False,
        max_length=MAX_LIMITS_PER_TASK,
        help_text=(
            "Names of named limits (GET /api/v1/limits) its runs are subject to: the task's team's own of that "
            "name, else a global one. A run that would exceed one waits, and says why "
            "(`waiting: limit api.example.com 10/s`)."
        ),
    )
    max_attempts = serializers.IntegerField(required=False, default=3, min_value=1, max_value=100)
    retry_backoff = DurationField(required=False, default=timedelta(seconds=5))
    retry_backoff_max = DurationField(required=False, default=timedelta(minutes=10))
    retry_jitter = serializers.BooleanField(required=False, default=True)
    timeout = DurationField(
        required=False,
        default=default_timeout,
        min_value=timedelta(seconds=1),
    )
    priority = serializers.IntegerField(required=False, default=5, min_value=0, max_value=9)
    workflow_timeout = DurationField(
        required=False,
        allow_null=True,
        default=None,
        min_value=timedelta(seconds=1),
        max_value=timedelta(days=30),
        help_text=(
            "The longest a workflow run this task starts (its run, and the steps that follow it) may go on, from "
            "the run's start: past it, the workflow run is cancelled, with the reason (null: no limit)."
        ),
    )
    workflow_retries = serializers.IntegerField(
        required=False,
        default=0,
        min_value=0,
        max_value=MAX_WORKFLOW_RETRIES,
        help_text=(
            "How many times a failed workflow run this task starts is retried from its failed steps, each within "
            "about a minute of its failure (0: never)."
        ),
    )
    map_over = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=200,
        help_text=(
            "A map step: a path (`$.files`) into the output of the one task it follows, naming a list; it then runs "
            'once per item (each item its run\'s input; an item that is no object as `{"item": ...}`), '
            "`map_concurrency` at once, and what follows it gets the items' outputs in order. Empty: an ordinary step."
        ),
    )
    map_concurrency = serializers.IntegerField(
        required=False,
        default=DEFAULT_MAP_CONCURRENCY,
        min_value=1,
        max_value=MAX_MAP_CONCURRENCY,
        help_text="How many items of a map step run at once.",
    )
    tracing_id = serializers.CharField(required=False, allow_blank=True, default="", max_length=64)
    expose_metrics = serializers.BooleanField(required=False, default=False)
    keep_last = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=1,
        max_value=MAX_KEEP_LAST,
        help_text="Retention: the most finished runs kept (null: the default, TMS_RETENTION_KEEP_LAST, 1000).",
    )
    keep_for = DurationField(
        required=False,
        allow_null=True,
        default=None,
        min_value=MIN_KEEP_FOR_DELTA,
        max_value=MAX_KEEP_FOR_DELTA,
        help_text='Retention: finished runs older than this are archived and deleted, e.g. "30d" or seconds '
        "(null: the default, TMS_RETENTION_KEEP_FOR, 30 days; at least 1 h, at most 3650 days).",
    )
    keep_failed_longer = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Retention of failed runs by whichever of keep_last and keep_for keeps more (other runs: "
        "whichever keeps fewer). Unfinished runs and a task's latest run are never pruned.",
    )

    def to_internal_value(self, data: Any) -> Any:
        # The old field was stored and never used; saying so beats a generic "Unknown field."
        if isinstance(data, dict) and "notification_target" in data:
            raise serializers.ValidationError({"notification_target": [NOTIFICATION_TARGET_REMOVED]})
        return super().to_internal_value(data)

    def validate_map_over(self, value: str) -> str:
        try:
            path_parse(value) if value else None
        except ConditionError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def validate_on_events(self, value: Any) -> list[dict[str, Any]]:
        return subscriptions_clean(value)

    def validate_timezone(self, value: str) -> str:
        try:
            validate_timezone(value)
        except ScheduleError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def validate_cron(self, value: str) -> str:
        if value.strip(CRON_BLANKS):
            try:
                validate_cron(value)
            except ScheduleError as exc:
                raise serializers.ValidationError(str(exc)) from None
        return value.strip(CRON_BLANKS)

    def validate_config(self, value: Any) -> Any:
        if has_nul(value):
            raise serializers.ValidationError("Null characters are not allowed.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        localize_wall_times(attrs, attrs["timezone"])
        check_task(attrs)
        _check_runner(attrs["runner"], attrs["config"])
        _check_runner_timeout(attrs["runner"], attrs["config"], attrs.get("timeout"))
        _check_secret_fields(attrs["config"], attrs["secret_fields"])
        _check_input_settings(attrs)
        return attrs


def _check_input_settings(attrs: Mapping[str, Any]) -> None:
    """``input_schema`` is a JSON Schema, and each path of ``input_fills`` fills a value of the
    (plain) config that is not a secret."""
    errors: dict[str, list[str]] = {}
    schema_problems = check_input_schema(attrs.get("input_schema"))
    if schema_problems:
        errors["input_schema"] = schema_problems
    fill_problems = check_input_fills(
        fills=attrs.get("input_fills") or {},
        runner=attrs["runner"],
        config=attrs["config"],
        secret_fields=attrs.get("secret_fields") or [],
    )
    if fill_problems:
        errors["input_fills"] = fill_problems
    if errors:
        raise serializers.ValidationError(errors)


def _check_secret_fields(config: Any, secret_fields: Any) -> None:
    errors = check_secret_fields(config, secret_fields)
    if errors:
        raise serializers.ValidationError(errors)


def _check_runner_timeout(runner: str, config: Any, timeout: Any) -> None:
    """A config that cannot work within the task's timeout (a ``sleep`` pause longer than it)."""
    try:
        run_config.task_check_runner_timeout(runner=runner, config=config, timeout=timeout)
    except InvalidInput as exc:
        raise serializers.ValidationError(exc.errors) from None


def _check_runner(runner: str, config: Any) -> None:
    """The runner's verdict on ``config``, as this serializer's errors (so that a list of tasks
    reports them per item)."""
    try:
        task_validate_runner(runner=runner, config=config)
    except InvalidInput as exc:
        raise serializers.ValidationError(exc.errors) from None


def check_task(attrs: Mapping[str, Any]) -> None:
    """The services' cross-field rules (:func:`~tasks_api.checks.task_check_rules`) as this
    serializer's errors, so that a list of tasks reports them per item."""
    try:
        task_check_rules(attrs)
    except InvalidInput as exc:
        raise serializers.ValidationError(exc.errors) from None


#: What the API computes for a task, listed after the declared field it belongs beside.
COMPUTED_AFTER = {"dst_fold": ["description"], "keep_failed_longer": ["state", "next_run_at"]}
#: Declared fields the API shows under another name: the cursor, since ``next_run_at`` is
#: when the task next runs.
API_NAMES = {"next_run_at": "next_occurrence_at"}


def read_fields() -> list[str]:
    """The fields of a task's representation: the shown ones of :data:`tasks_app.fields.TASK_FIELDS`
    in their order, with the computed ones beside them."""
    names = []
    for name in task_fields.names(shown=True):
        names.append(API_NAMES.get(name, name))
        names += COMPUTED_AFTER.get(name, [])
    return names


SCHEDULE_DESCRIPTION_HELP = (
    'The schedule in words, read as TMS reads it: "At 09:00, Monday through Friday (Europe/Berlin)", '
    '"Every 5 minutes", "Once". A six-field cron is seconds first, so a seconds-last expression shows '
    'here as something else ("0 0 * * * 1": "Every hour, only on Monday").'
)


class TaskSerializer(BuiltOnceFieldsMixin, serializers.ModelSerializer):
    state = serializers.SerializerMethodField(
        help_text=(
            "What the task is doing, as people read it: `scheduled`, `running`, `succeeded`, `failed` or "
            "`cancelled` (a one-shot task's run), `completed` (a recurring task whose schedule ended), `paused`. "
            "`status` is the scheduling lifecycle instead: a one-shot task is `COMPLETED` as soon as its only "
            "execution is created, before it runs."
        )
    )
    next_run_at = serializers.SerializerMethodField(
        help_text="When the task next runs: its earliest waiting execution's due time, else its next fire time "
        "(null: paused, deleted, or nothing left to run)."
    )
    next_occurrence_at = serializers.DateTimeField(
        source="next_run_at",
        read_only=True,
        allow_null=True,
        help_text="The materialisation cursor: the next fire time not yet turned into an execution (null: none).",
    )
    config = MaskedConfigField()
    input_schema = InputSchemaField(read_only=True, allow_null=True, help_text=INPUT_SCHEMA_HELP)
    input_fills = serializers.DictField(child=serializers.CharField(), read_only=True, help_text=INPUT_FILLS_HELP)
    interval = DurationField(allow_null=True, help_text="Seconds between runs; null for one-shot and cron.")
    jitter = DurationField()
    misfire_grace = DurationField()
    retry_backoff = DurationField()
    retry_backoff_max = DurationField()
    timeout = DurationField()
    keep_for = DurationField(allow_null=True, help_text="Seconds; null: the default (TMS_RETENTION_KEEP_FOR).")
    # Seconds, as every duration the API shows (a model DurationField alone renders "00:05:00").
    max_age = DurationField(allow_null=True, help_text="Seconds; null: runs never expire.")
    workflow_timeout = DurationField(allow_null=True, help_text="Seconds; null: its workflow runs have no limit.")
    trigger_debounce = DurationField(allow_null=True, help_text="Seconds a trigger's run waits for others to join it.")
    on_events = SubscriptionsField(help_text="The named events it subscribes to, each with its debounce.")
    limits = serializers.SerializerMethodField(help_text="Names of the named limits its runs are subject to.")
    after = serializers.SerializerMethodField(help_text="The tasks it follows and how their runs must end.")
    calendar: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True, help_text="Name of its business calendar (null: none)."
    )
    description = serializers.SerializerMethodField(help_text=SCHEDULE_DESCRIPTION_HELP)

    class Meta:
        model = Task
        fields = read_fields()
        read_only_fields = fields

    def get_description(self, task: Task) -> str:
        return schedule_words(task)

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_limits(self, task: Task) -> list[str]:
        return task_limit_names(task) if task.has_limits else []  # no query for a task without

    @extend_schema_field(AfterEntrySerializer(many=True))
    def get_after(self, task: Task) -> list[dict[str, str]]:
        return task_after_entries(task)  # no query for a task that follows nothing

    @extend_schema_field(serializers.ChoiceField(choices=TaskState.choices))
    def get_state(self, task: Task) -> str:
        return task_state(task).value

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_next_run_at(self, task: Task) -> str | None:
        when = task_next_run(task)
        return serializers.DateTimeField().to_representation(when) if when is not None else None


class TaskCreatedSerializer(TaskSerializer):
    """A task just created, with its first execution when the first run falls inside the horizon."""

    first_execution = serializers.SerializerMethodField(
        help_text="Id of the task's first execution (GET /api/v1/executions/{id}); null when its first run is "
        "further ahead than the materialisation horizon (it is created later) or it has none."
    )

    class Meta(TaskSerializer.Meta):
        fields = [*TaskSerializer.Meta.fields, "first_execution"]
        read_only_fields = fields

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_first_execution(self, task: Task) -> int | None:
        if hasattr(task, "first_execution"):  # set by task_bulk_create: no query
            first: int | None = task.first_execution
            return first
        return Execution.objects.filter(task=task).order_by("scheduled_for", "id").values_list("pk", flat=True).first()


class TaskUpdateSerializer(TaskCreateSerializer):
    """A partial update: every field optional; the task with the changes applied must be valid."""

    #: What a task shows but a user does not set: "cannot be changed" rather than "unknown".
    read_only_names = frozenset(read_fields()) - frozenset(task_fields.SETTINGS)

    runner = RunnerAliasField(required=False)
    start_at = LocalDateTimeField(
        required=False,
        help_text="First (or only) run, RFC 3339. Without a UTC offset it is a wall-clock time in the task's "
        "`timezone` (the new one, if this request changes it).",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["partial"] = True
        super().__init__(*args, **kwargs)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        task = self.instance
        assert task is not None  # an update serializer is always bound to the task it changes
        localize_wall_times(attrs, attrs.get("timezone", task.timezone))
        plain = task_config(task)
        # The team is not a setting of the task's own: a move is checked by tasks_api.moving.task_move.
        checked = {name: value for name, value in attrs.items() if name != "team"}
        if "config" in attrs:
            # A secret sent back as its mask keeps its stored value (the runner checks the real
            # one). Checked here only: attrs keep the masks, for task_update to see which secrets
            # the update keeps (it drops them if the run goes elsewhere).
            checked["config"] = config_unmask(attrs["config"], plain)
        merged = (
            {name: getattr(task, name) for name in UPDATABLE_FIELDS - {"limits", "after"}} | {"config": plain} | checked
        )
        if "calendar" in attrs and "calendar_policy" not in attrs:
            # A calendar removed takes its policy with it; a first one gets the default (skip).
            merged["calendar_policy"] = task.calendar_policy if attrs["calendar"] and task.calendar_id else ""
        check_task(merged)
        if "runner" in attrs or "config" in attrs:
            _check_runner(merged["runner"], merged["config"])
        if {"runner", "config", "timeout"} & set(attrs):
            _check_runner_timeout(merged["runner"], merged["config"], merged.get("timeout"))
        if "config" in attrs or "secret_fields" in attrs:
            _check_secret_fields(merged["config"], merged["secret_fields"])
        if {"runner", "config", "secret_fields", "input_schema", "input_fills"} & set(attrs):
            _check_input_settings(merged)
        return attrs


class TaskDeleteSerializer(serializers.Serializer):
    """What deleting a task did: it is DELETED, and each of its active executions was cancelled."""

    id = serializers.UUIDField(source="task_id")
    status = serializers.ChoiceField(choices=[TaskStatus.DELETED], default=TaskStatus.DELETED)
    executions = CancelReportSerializer(many=True, help_text="Each execution that was still active.")

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["status"] = TaskStatus.DELETED
        return data


class MaterialiseSerializer(StrictInputMixin, serializers.Serializer):
    until = BoundedDateTimeField(help_text="Create the task's executions due up to this time (RFC 3339).")


class MaterialiseResultSerializer(serializers.Serializer):
    task = serializers.UUIDField()
    until = serializers.DateTimeField()
    execution_ids = serializers.ListField(
        child=serializers.IntegerField(), help_text="Ids of the executions created (existing ones are not repeated)."
    )


# --- backfill ---------------------------------------------------------------------------------


class BackfillSerializer(StrictInputMixin, serializers.Serializer):
    start = BoundedDateTimeField(help_text="First instant of the past range, RFC 3339.")
    end = BoundedDateTimeField(help_text="Last instant of the range (not in the future).")


class BackfillResultSerializer(serializers.Serializer):
    task = serializers.UUIDField(source="task_id")
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    execution_ids = serializers.ListField(child=serializers.IntegerField(), help_text="Executions created, due now.")
    existing = serializers.IntegerField(help_text="Fire times in the range that already had an execution.")
    fire_times = serializers.IntegerField(
        help_text="Fire times the range holds (created + existing); 0: the schedule has none between start and end."
    )
    detail = serializers.CharField(
        help_text='What was done, in words; "No fire times between X and Y: nothing to backfill." for an empty range.'
    )


class TriggerSerializer(StrictInputMixin, serializers.Serializer):
    """What a trigger (run now) may give its run."""

    input = InputField(
        required=False,
        allow_null=True,
        default=None,
        help_text="The run's input: a JSON object (at most 64 KiB of JSON) that the task's `input_schema` checks "
        "and whose values fill the config paths of its `input_fills`. Shown as the execution's `input`.",
    )
