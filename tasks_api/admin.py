"""The task admin: every write goes through the task services, exactly as the API's.

* Add calls :func:`~tasks_api.creation.task_create` (the task is materialised: its first
  executions exist, ``next_run_at`` and ``why`` are right), change calls
  :func:`~tasks_api.editing.task_update` with the fields that changed (only updatable fields are
  editable), delete calls :func:`~tasks_api.lifecycle.task_delete` (a soft delete that cancels the
  task's active executions). Input is checked by the API's own serializers first, so the admin
  accepts exactly what the API accepts, and every refusal lands on the form field it is about.
* ``status`` is read-only; the pause, resume and run-now actions change it, in bulk on a filtered
  selection, reporting per task what happened.
* Secret config values are masked (:mod:`tasks_app.secrets`: encrypted at rest, never shown); a
  masked value left alone when saving keeps its stored value.

Who may do what: :mod:`tms_core.roles`.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from executions.admin import ReadOnlyAdmin, error_text, run_for_each
from executions.models import Execution
from runners.registry import runner_aliases
from tasks_api.calendars import CALENDAR_FIELDS, calendar_create, calendar_delete, calendar_update
from tasks_api.creation import task_create
from tasks_api.editing import task_update
from tasks_api.lifecycle import task_delete, task_pause, task_resume
from tasks_api.limits import limit_create, limit_delete, limit_update
from tasks_api.serializers import TaskCreateSerializer, TaskUpdateSerializer
from tasks_api.states import task_next_run, task_state, with_state
from tasks_api.task_config import task_config_masked
from tasks_api.triggers import task_trigger, trigger_words
from tasks_api.workflows import Neighbour, task_after_entries, task_neighbours
from tasks_app import fields as task_fields
from tasks_app.fields import UPDATABLE_FIELDS
from tasks_app.models import AuditEntry, Calendar, Limit, Task, TaskHook, TaskStatus, TaskVersion, TeamQuota
from tasks_app.quotas import QUOTA_FIELDS, team_limits, team_quota_set
from tasks_app.schedule_words import runs_only_after
from tasks_app.schedules import CRON_FIELDS_HELP
from tasks_app.versions import version_first_ensure_many
from tms_core.auth import actor_for, request_user
from tms_core.durations import DurationFormField
from tms_core.errors import InvalidInput
from tms_core.form_errors import SERVICE_ERRORS
from tms_core.service_forms import ServiceFormAdmin, ServiceModelForm

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec

#: What a task is created with, in the order the add form shows it: the groups of
#: :data:`tasks_app.fields.TASK_FIELDS`.
WHAT_FIELDS = task_fields.names(task_fields.WHAT)
WHEN_FIELDS = task_fields.names(task_fields.WHEN)
POLICY_FIELDS = task_fields.names(task_fields.POLICIES)
OTHER_FIELDS = task_fields.names(task_fields.OTHER)
RETENTION_FIELDS = task_fields.names(task_fields.RETENTION)
CREATE_FIELDS = task_fields.SETTINGS
#: Read-only facts shown at the top of the change page.
STATUS_FIELDS = [
    "id",
    "owner",
    "status",
    "state",
    "next_run",
    "cursor",
    "runs_materialised",
    "paused_at",
    "recent_runs",
    "created_at",
    "updated_at",
]
#: Times as the admin shows them, to the second (UTC).
DATETIME_DISPLAY = "%Y-%m-%d %H:%M:%S"


class PreciseDateTimeInput(forms.DateTimeInput):
    """A date-time to the second, with its microseconds only when it has some: the admin's split
    date/time widget cut ``start_at`` to whole seconds, and then no fire time matched the grid of
    the stored schedule."""

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs={"size": 30, **(attrs or {})}, format=DATETIME_DISPLAY)

    def format_value(self, value: Any) -> str | None:
        if isinstance(value, datetime) and value.microsecond:
            return value.strftime(f"{DATETIME_DISPLAY}.%f")
        return super().format_value(value)


def _api_value(value: Any) -> Any:
    """A cleaned form value as the API serializers take it."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Calendar):  # the API names a calendar (the task owner's)
        return value.name
    if isinstance(value, models.Model):
        return value.pk
    if isinstance(value, QuerySet):  # named limits: the API takes their names
        return sorted(limit.name for limit in value)
    return value


class TaskAdminForm(ServiceModelForm):
    """Validates with the API's serializer and saves through the task services while the form is
    validated, so a refusal from the service, not only from the serializer, becomes an error on
    the form (the request gives the actor and the serializer's context)."""

    runner = forms.ChoiceField(
        choices=lambda: [(alias, alias) for alias in runner_aliases()],
        help_text="A runner configured in TMS_RUNNERS.",
    )
    start_at = forms.DateTimeField(
        required=False,
        widget=PreciseDateTimeInput,
        help_text="UTC, unless you give an offset (2030-01-15 09:00:00+01:00). Empty: now.",
    )
    end_at = forms.DateTimeField(required=False, widget=PreciseDateTimeInput, help_text="UTC; empty: no end.")
    # Not a column: the tasks it follows, as the API takes them (the services write the links).
    after = forms.JSONField(
        required=False,
        help_text='The tasks it follows, as in the API: [{"task": "<id>", "on": "success"}] ("failure", '
        '"completion"), each with an optional "condition" on its output ({"path": "$.rows", "op": ">", "value": 0}). '
        "With no schedule given it runs only after them. Empty: none.",
    )

    class Meta:
        model = Task
        fields = ["owner", *CREATE_FIELDS]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.instance._state.adding and "config" in self.fields:
            # Edited from its masked form; clean_config puts the untouched secrets back.
            self.initial["config"] = task_config_masked(self.instance)
        if not self.instance._state.adding and "after" in self.fields:
            self.initial["after"] = task_after_entries(self.instance)
        if "name" in self.fields:
            self.fields["name"].help_text = "Optional: a task without a name is shown by its id."
        if "cron" in self.fields:
            self.fields["cron"].help_text = f"Or a cron expression, {CRON_FIELDS_HELP}."
        if "timezone" in self.fields:
            self.fields["timezone"].help_text = 'IANA name, e.g. "Europe/Berlin": the zone cron expressions follow.'

    def clean_config(self) -> Any:
        # The masks stay: the update service puts the kept secrets back (and drops them if the
        # run now goes elsewhere).
        config = self.cleaned_data.get("config")
        return {} if config is None else config

    def save_through_services(self) -> Task:
        return self._create() if self.instance._state.adding else self._update()

    def _create(self) -> Task:
        data = {name: _api_value(self.cleaned_data.get(name)) for name in CREATE_FIELDS if name in self.cleaned_data}
        data = {name: value for name, value in data.items() if value is not None}
        serializer = TaskCreateSerializer(data=data, context={"request": self.request})
        serializer.is_valid(raise_exception=True)
        owner = self.cleaned_data.get("owner") or request_user(self.request)
        return task_create(owner=owner, **serializer.validated_data)

    def _update(self) -> Task:
        changed = [name for name in self.changed_data if name in UPDATABLE_FIELDS]
        if not changed:
            return self.instance
        data = {name: _api_value(self.cleaned_data.get(name)) for name in changed}
        serializer = TaskUpdateSerializer(self.instance, data=data, context={"request": self.request})
        serializer.is_valid(raise_exception=True)
        return task_update(
            task=self.instance, actor=actor_for(request_user(self.request)), changes=serializer.validated_data
        )


@admin.register(Task)
class TaskAdmin(ServiceFormAdmin):
    form = TaskAdminForm
    list_display = [
        "name_or_id",
        "owner",
        "team",
        "runner",
        "state",
        "status",
        "schedule",
        "next_run",
        "priority",
        "created",
    ]
    list_filter = [
        "status",
        "runner",
        ("owner", admin.RelatedOnlyFieldListFilter),
        ("team", admin.RelatedOnlyFieldListFilter),
        ("created_at", admin.DateFieldListFilter),
        ("start_at", admin.DateFieldListFilter),
        "misfire_policy",
        "overlap_policy",
    ]
    search_fields = ["name", "=id", "owner__username", "tracing_id"]
    list_select_related = ["owner", "team"]
    raw_id_fields = ["owner", "artifact"]
    actions = ["pause_selected", "resume_selected", "run_now_selected", "delete_selected"]
    show_full_result_count = False
    # Durations in the API's syntax ("90s", "5m", "1h30m"), as everywhere else.
    formfield_overrides = {models.DurationField: {"form_class": DurationFormField}}

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        queryset, duplicates = super().get_search_results(request, queryset, search_term)
        if request.GET.get("app_label") == "notifications":  # a rule's task picker: live tasks only
            queryset = queryset.exclude(status=TaskStatus.DELETED)
        return queryset, duplicates

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return with_state(super().get_queryset(request))

    # --- the pages: add shows what a task is created with, change what may still change -----

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> _FieldsetSpec:
        if obj is None:
            return [
                ("What", {"fields": ["owner", *WHAT_FIELDS]}),
                ("When", {"fields": [*WHEN_FIELDS]}),
                ("Retries and policies", {"fields": [*POLICY_FIELDS]}),
                ("Retention", {"fields": [*RETENTION_FIELDS]}),
                ("Other", {"classes": ["collapse"], "fields": [*OTHER_FIELDS]}),
            ]
        editable = self.has_change_permission(request, obj) and obj.status != TaskStatus.DELETED
        what = [name if name != "config" or editable else "masked_config" for name in WHAT_FIELDS]
        return [
            ("Status", {"fields": [*STATUS_FIELDS]}),
            ("What", {"fields": [*what]}),
            ("When", {"fields": [*WHEN_FIELDS]}),
            ("Retries and policies", {"fields": [*POLICY_FIELDS]}),
            ("Retention", {"fields": [*RETENTION_FIELDS]}),
            ("Workflow", {"fields": ["upstream_tasks", "downstream_tasks"]}),
            ("Other", {"classes": ["collapse"], "fields": [*OTHER_FIELDS]}),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        # The team is chosen when the task is added; a move (editor in both teams, audited) is the
        # API's PATCH or the back office's, never a field saved here.
        readonly = [*STATUS_FIELDS, "artifact", "team", "masked_config", "upstream_tasks", "downstream_tasks"]
        if obj.status == TaskStatus.DELETED:
            readonly += [name for name in CREATE_FIELDS if name not in readonly]
        return readonly

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        return {"owner": request.user.pk, **super().get_changeform_initial_data(request)}

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)
        if db_field.name == "owner" and field is not None:
            field.required = False
            field.help_text = "Empty: you."
        if db_field.name == "team" and field is not None:
            field.required = False
            field.help_text = "Empty: the owner's personal team. The owner must be an editor of the team chosen."
        return field

    @admin.display(description="after")
    def after(self, obj: Task) -> str:
        """The tasks it follows, on a page that shows the task read-only (``after`` is no column)."""
        return ", ".join(f"{entry['task']} on {entry['on']}" for entry in task_after_entries(obj)) or "-"

    @staticmethod
    def _task_links(neighbours: list[Neighbour]) -> str:
        if not neighbours:
            return "-"
        return format_html_join(
            ", ",
            '<a href="{}">{}</a> (on {})',
            ((reverse("admin:tasks_app_task_change", args=[n.task.pk]), str(n.task), n.on) for n in neighbours),
        )

    @admin.display(description="runs after")
    def upstream_tasks(self, obj: Task) -> str:
        """The tasks it follows, as links (read-only: ``after`` above changes them)."""
        return self._task_links(task_neighbours(obj)[0])

    @admin.display(description="followed by")
    def downstream_tasks(self, obj: Task) -> str:
        """The tasks that follow it, as links (each one's own ``after`` changes them)."""
        return self._task_links(task_neighbours(obj)[1])

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        deleted = obj is not None and obj.status == TaskStatus.DELETED
        return not deleted and super().has_delete_permission(request, obj)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        # Not form.save_m2m(): the services set the task's limits (and has_limits) already.
        for formset in formsets:
            self.save_formset(request, form, formset, change=change)

    # --- delete: a soft delete through task_delete ------------------------------------------

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[list[Any], dict[str, int], set, list]:
        # Deleting a task keeps its history (executions, events): only the tasks are "deleted",
        # so the confirmation lists them alone and asks for no permission on executions.
        tasks = list(objs)
        shown = [format_html("{}: {}", str(Task._meta.verbose_name).capitalize(), task) for task in tasks]
        return shown, {str(Task._meta.verbose_name_plural): len(tasks)}, set(), []

    def delete_model(self, request: HttpRequest, obj: Task) -> None:
        try:
            report = task_delete(task=obj, actor=actor_for(request_user(request)))
        except SERVICE_ERRORS as exc:  # deleted meanwhile
            self.message_user(request, f"{obj}: {error_text(exc)}", messages.ERROR)
            return
        self._report_delete(request, obj, report)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        actor = actor_for(request_user(request))

        def delete(task: Task) -> str:
            report = task_delete(task=task, actor=actor)
            cancelled = len(report.executions)
            may_run = " An external run may go on (its runner cannot stop it)." if report.may_still_run else ""
            return f"deleted; {cancelled} active execution(s) cancelled.{may_run}"

        run_for_each(self, request, queryset.exclude(status=TaskStatus.DELETED), delete, verb="deleted")

    def _report_delete(self, request: HttpRequest, task: Task, report: Any) -> None:
        if report.executions:
            level = messages.WARNING if report.may_still_run else messages.INFO
            detail = "; ".join(
                f"execution {item.execution_id}: {item.from_status} -> {item.status} (external run {item.external_run})"
                for item in report.executions
            )
            self.message_user(request, f"{task}: {detail}", level)

    # --- actions ---------------------------------------------------------------------------

    @admin.action(description="Pause selected tasks", permissions=["change"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        actor = actor_for(request_user(request))

        def pause(task: Task) -> str:
            if task.status == TaskStatus.PAUSED:
                return "already paused."
            before = Execution.objects.filter(task=task, status="SCHEDULED").count()
            task_pause(task=task, actor=actor)
            return f"paused; {before} scheduled execution(s) cancelled."

        run_for_each(self, request, queryset, pause, verb="paused")

    @admin.action(description="Resume selected tasks", permissions=["change"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        actor = actor_for(request_user(request))

        def resume(task: Task) -> str:
            if task.status != TaskStatus.PAUSED:
                return f"not paused ({task.status}): nothing to resume."
            task = task_resume(task=task, actor=actor)
            return f"resumed; next run {task_next_run(task) or 'none'}."

        run_for_each(self, request, queryset, resume, verb="resumed")

    @admin.action(description="Run selected tasks now", permissions=["change"])
    def run_now_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        actor = actor_for(request_user(request))

        def run_now(task: Task) -> str:
            return trigger_words(task_trigger(task=task, actor=actor)) + "."

        run_for_each(self, request, queryset, run_now, verb="run")

    # --- display ---------------------------------------------------------------------------

    @admin.display(description="name", ordering="name")
    def name_or_id(self, task: Task) -> str:
        return str(task)

    @admin.display(description="state")
    def state(self, task: Task) -> str:
        return task_state(task).label

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, task: Task) -> str:
        return task.created_at.strftime(DATETIME_DISPLAY)

    @admin.display(description="next run (UTC)")
    def next_run(self, task: Task) -> str:
        when = task_next_run(task)
        return when.strftime(DATETIME_DISPLAY) if when else "-"

    @admin.display(description="next fire time not yet materialised (cursor)")
    def cursor(self, task: Task) -> str:
        return task.next_run_at.strftime(DATETIME_DISPLAY) if task.next_run_at else "-"

    @admin.display(description="schedule")
    def schedule(self, task: Task) -> str:
        if task.cron:
            # The zone on a line of its own: "(America/Argentina/Buenos_Aires)" beside the
            # expression widened the column until the list no longer fitted 1440 px.
            return format_html("cron {}<br><small>{}</small>", task.cron, task.timezone)
        if task.interval is not None:
            return f"every {task.interval.total_seconds():g} s"
        if runs_only_after(task):
            return "after other tasks"  # its page names them (runs after)
        return f"once at {task.start_at.strftime(DATETIME_DISPLAY)}"

    @admin.display(description="config")
    def masked_config(self, task: Task) -> str:
        return format_html("<pre>{}</pre>", json.dumps(task_config_masked(task), indent=2, sort_keys=True))

    @admin.display(description="recent runs")
    def recent_runs(self, task: Task) -> str:
        executions = list(
            Execution.objects.filter(task=task, started_at__isnull=False).order_by("-scheduled_for", "-id")[:10]
        )
        if not executions:
            return "-"
        return format_html_join(
            "",
            '<div><a href="{}">execution {}</a> {} at {} (attempt {})</div>',
            (
                (
                    reverse("admin:executions_execution_change", args=[e.pk]),
                    e.pk,
                    e.status,
                    e.scheduled_for.strftime(DATETIME_DISPLAY),
                    e.attempt,
                )
                for e in executions
            ),
        )


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    """The audit log, read-only: entries are written by the services, never by hand."""

    list_display = ["at", "actor_name", "source", "action", "object_type", "object_id", "owner", "remote_addr"]
    list_filter = ["action", "object_type", "source", ("at", admin.DateFieldListFilter)]
    search_fields = ["=object_id", "=task_id", "actor_name", "owner__username"]
    list_select_related = ["owner"]
    show_full_result_count = False
    # An entry's page shows every column, in the model's order.
    readonly_fields = [field.name for field in AuditEntry._meta.concrete_fields if field.name != "id"]


@admin.register(TeamQuota)
class TeamQuotaAdmin(admin.ModelAdmin):
    """Per-team limits; an empty field means the TMS_QUOTA_* default. Staff with the permission
    ``tasks_app.change_teamquota`` (superusers) change them, through
    :func:`tasks_app.quotas.team_quota_set`; other staff may look. A user's quota before teams is
    their personal team's: search by username."""

    list_display = (
        "team",
        "personal_of",
        "max_tasks",
        "max_executions_per_hour",
        "max_artifact_bytes",
        "fair_weight",
        "effective",
    )
    search_fields = ("team__slug", "team__name", "team__personal_of__username")
    # The team's id, with a look-up in the Teams admin (a personal team per user: too many for a menu).
    raw_id_fields = ("team",)
    list_select_related = ("team__personal_of",)

    @admin.display(description="Personal team of")
    def personal_of(self, quota: TeamQuota) -> str:
        user = quota.team.personal_of
        return user.get_username() if user is not None else "-"

    @admin.display(description="In force (0: no limit)")
    def effective(self, quota: TeamQuota) -> str:
        limits = team_limits(quota.team_id)
        return (
            f"{limits.max_tasks} tasks, {limits.max_executions_per_hour} runs/hour on request, "
            f"{limits.max_artifact_bytes} artifact bytes, fair-share weight {limits.fair_weight}"
        )

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_staff)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_staff and request.user.has_perm("tasks_app.change_teamquota"))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_staff and request.user.has_perm("tasks_app.change_teamquota"))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_staff and request.user.has_perm("tasks_app.change_teamquota"))

    def save_model(self, request: HttpRequest, obj: TeamQuota, form: Any, change: bool) -> None:
        team_quota_set(team=obj.team, **{name: getattr(obj, name) for name in QUOTA_FIELDS})


#: What the limit services take. Not the form's ``Meta.fields``: the admin's form subclass lists
#: the page's read-only fields there too (``use``).
_LIMIT_FIELDS = ("owner", "team", "name", "scope", "key", "max_concurrency", "windows")


class LimitAdminForm(ServiceModelForm):
    """Saves through the limit services while it is validated, so their refusals (a window that
    cannot be met, no window and no cap, a duplicate name, an owner who is not an editor of the
    team) are errors on the form's fields."""

    class Meta:
        model = Limit
        fields = list(_LIMIT_FIELDS)
        help_texts = {
            "owner": "Who defines it. Empty (and no team): a global limit, which any team's task may reference.",
            "team": "The team whose tasks may reference it (default: the owner's personal team). The owner must be "
            "an editor there.",
            "windows": '[{"count": 10, "seconds": 1}, {"count": 1000, "seconds": 3600}]',
        }

    def save_through_services(self) -> Limit:
        data: dict[str, Any] = {name: self.cleaned_data.get(name) for name in _LIMIT_FIELDS}
        if self.instance._state.adding:
            if data["owner"] is None and data["team"] is not None:
                raise InvalidInput.on("owner", "A limit of a team is defined by one of its editors.")
            return limit_create(**data)
        fixed = ("owner", "team")
        changes = {name: data[name] for name in self.changed_data if name in data and name not in fixed}
        return limit_update(limit=self.instance, changes=changes)


@admin.register(Limit)
class LimitAdmin(ServiceFormAdmin):
    """Named limits and their current use; every change goes through :mod:`tasks_api.limits`."""

    form = LimitAdminForm
    list_display = ("name", "team", "owner", "scope", "max_concurrency", "windows", "use")
    list_filter = ("scope", ("team", admin.RelatedOnlyFieldListFilter))
    search_fields = ("name", "owner__username", "team__slug")
    list_select_related = ("owner", "team")
    raw_id_fields = ("owner",)
    readonly_fields = ("use",)

    @admin.display(description="Current use")
    def use(self, limit: Limit) -> str:
        from executions.limits import limit_usage

        if limit.pk is None:
            return "-"
        parts = []
        for bucket in limit_usage(limit=limit):
            windows = ", ".join(f"{w['starts']}/{w['count']} in {w['seconds']:g}s" for w in bucket["windows"])
            cap = f"{bucket['slots_held']}/{limit.max_concurrency} slots" if limit.max_concurrency else ""
            parts.append(
                f"{bucket['key']}: " + "; ".join(p for p in (cap, windows, f"{bucket['waiting']} waiting") if p)
            )
        return " | ".join(parts) or "not used yet"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["use", "owner", "team"] if obj is not None else ["use"]

    def delete_model(self, request: HttpRequest, obj: Limit) -> None:
        try:
            limit_delete(limit=obj)
        except SERVICE_ERRORS as exc:
            self.message_user(request, f"{obj}: {error_text(exc)}", messages.ERROR)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for limit in queryset:
            self.delete_model(request, limit)


class CalendarAdminForm(ServiceModelForm):
    """Saves through the calendar services while it is validated, so their refusals (an unknown
    country or subdivision, a closed run too long, a duplicate name) are errors on the form's
    fields; a change of what it closes re-plans the tasks that use it."""

    class Meta:
        model = Calendar
        fields = ["owner", "team", *CALENDAR_FIELDS]
        help_texts = {
            "team": "The team whose tasks may use it (default: the owner's personal team). The owner must be an "
            "editor there.",
            "weekend_days": "ISO weekdays, 1 Monday ... 7 Sunday: [6, 7]",
            "extra_dates": '[{"start": "2027-12-24", "end": "2027-12-31", "label": "shutdown"}]',
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "team" in self.fields:
            self.fields["team"].required = False  # the service's default: the owner's personal team

    def save_through_services(self) -> Calendar:
        data: dict[str, Any] = {name: self.cleaned_data.get(name) for name in CALENDAR_FIELDS}
        if self.instance._state.adding:
            owner = self.cleaned_data.get("owner") or request_user(self.request)
            return calendar_create(owner=owner, team=self.cleaned_data.get("team"), **data)
        changes = {name: data[name] for name in self.changed_data if name in data}
        return calendar_update(calendar=self.instance, changes=changes, actor=actor_for(request_user(self.request)))


@admin.register(Calendar)
class CalendarAdmin(ServiceFormAdmin):
    """Business calendars; every change goes through :mod:`tasks_api.calendars`."""

    form = CalendarAdminForm
    list_display = ("name", "team", "owner", "country", "subdivision", "weekends_closed", "tasks_using")
    list_filter = ("country", "weekends_closed", ("team", admin.RelatedOnlyFieldListFilter))
    search_fields = ("name", "owner__username", "team__slug")
    raw_id_fields = ("owner",)
    list_select_related = ("owner", "team")

    @admin.display(description="Tasks using it")
    def tasks_using(self, calendar: Calendar) -> int:
        return calendar.tasks.exclude(status=TaskStatus.DELETED).count()

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["owner", "team"] if obj is not None else []

    def delete_model(self, request: HttpRequest, obj: Calendar) -> None:
        try:
            calendar_delete(calendar=obj)
        except SERVICE_ERRORS as exc:
            self.message_user(request, f"{obj}: {error_text(exc)}", messages.ERROR)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for calendar in queryset:
            self.delete_model(request, calendar)


@admin.register(TaskVersion)
class TaskVersionAdmin(ReadOnlyAdmin):
    """A task's versions (docs/triggers.md): its settings after each change, secrets masked."""

    list_display = ["task", "number", "created_at", "actor_name", "source", "changed"]
    list_filter = ["source", ("created_at", admin.DateFieldListFilter)]
    search_fields = ["=task__id", "task__name", "actor_name"]
    list_select_related = ["task"]
    show_full_result_count = False
    readonly_fields = ["task", "number", "created_at", "actor_name", "source", "changed", "snapshot"]
    #: Tasks a search may write the version 1 of (a name that matches many tasks is a wide search).
    search_ensures_at_most = 200

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        # Version 1 is written when first needed (tasks_app.versions): a task nothing has read
        # yet has no row. A search names its tasks, so theirs are written before the rows are read.
        if search_term:
            named = Task.objects.filter(name__icontains=search_term)
            with contextlib.suppress(ValueError):
                named = named | Task.objects.filter(pk=uuid.UUID(search_term))
            version_first_ensure_many(named.values_list("pk", flat=True)[: self.search_ensures_at_most])
        return super().get_search_results(request, queryset, search_term)


@admin.register(TaskHook)
class TaskHookAdmin(ReadOnlyAdmin):
    """Trigger URLs (docs/triggers.md); their secrets are never shown. Owners make, rotate and
    remove them through the API (the service audits it)."""

    list_display = ["id", "task", "created_at", "rotated_at", "last_used_at"]
    search_fields = ["=id", "=task__id", "task__name"]
    list_select_related = ["task"]
    fields = ("id", "task", "created_at", "rotated_at", "last_used_at")
    readonly_fields = ("id", "task", "created_at", "rotated_at", "last_used_at")
