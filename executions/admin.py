"""The admin of executions, their events, skipped occurrences and workers.

All of it is read-only: the platform writes these rows (status only through
:mod:`executions.transitions`). Operators act on executions with the cancel and retry actions,
which call the same services as the API with the admin user as actor and report per execution
what happened. Who may act is described in :mod:`tms_core.roles`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from executions.models import Execution, ExecutionEvent, SkippedOccurrence, Worker
from executions.replay import executions_replay_by_user
from executions.serializers import masked_input, masked_run_config
from executions.services import execution_cancel_by_user, execution_retry_by_user
from tasks_app.masking import mask_config
from tms_core.auth import actor_for, request_user
from tms_core.form_errors import SERVICE_ERRORS, exception_messages

#: Actions stop after this many objects per submission (each one is a service call).
ACTION_MAX = 1000


def precise(value: Any) -> str:
    """A date-time with milliseconds, in UTC (events a few milliseconds apart stay in order)."""
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if value else "-"


def error_text(exc: Exception) -> str:
    return " ".join(exception_messages(exc))


def run_for_each(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    act: Callable[[Any], str],
    *,
    verb: str,
) -> None:
    """Call ``act`` (a service call returning what it did) for each selected object and report each
    outcome as its own message: success, or the service's refusal as a warning."""
    done = failed = 0
    for obj in queryset[:ACTION_MAX]:
        try:
            what = act(obj)
        except SERVICE_ERRORS as exc:
            failed += 1
            modeladmin.message_user(request, f"{obj}: not {verb}: {error_text(exc)}", messages.WARNING)
        else:
            done += 1
            modeladmin.message_user(request, f"{obj}: {what}", messages.SUCCESS)
    if queryset.count() > ACTION_MAX:
        modeladmin.message_user(
            request, f"Only the first {ACTION_MAX} selected were {verb}; run the action again.", messages.WARNING
        )
    modeladmin.message_user(request, f"{done} {verb}, {failed} refused.", messages.INFO)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the platform writes; the admin shows them and never adds, changes or deletes them."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ExecutionEventInline(admin.TabularInline):
    """The execution's timeline: every transition, oldest first."""

    model = ExecutionEvent
    extra = 0
    can_delete = False
    fields = readonly_fields = ("at_precise", "from_status", "to_status", "attempt", "actor", "detail")
    verbose_name_plural = "Timeline (every state change)"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="at (UTC)")
    def at_precise(self, event: ExecutionEvent) -> str:
        return precise(event.at)


@admin.register(Execution)
class ExecutionAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "task_link",
        "status",
        "waiting",
        "origin",
        "attempt",
        "scheduled_for",
        "started_at",
        "finished_at",
        "duration",
        "lease_owner",
    ]
    list_filter = [
        "status",
        "origin",
        ("task__runner", admin.AllValuesFieldListFilter),
        ("task__owner", admin.RelatedOnlyFieldListFilter),
        ("scheduled_for", admin.DateFieldListFilter),
        ("finished_at", admin.DateFieldListFilter),
        "superseded",
    ]
    search_fields = ["=id", "task__name", "=task__id", "external_run_id", "lease_owner"]
    date_hierarchy = "scheduled_for"
    list_select_related = ["task", "task__owner"]
    show_full_result_count = False  # a COUNT(*) over millions of rows per page view
    inlines = [ExecutionEventInline]
    actions = ["cancel_selected", "retry_selected", "replay_selected"]
    fieldsets = [
        (
            "Outcome",
            {
                "fields": [
                    "task_link",
                    "status",
                    "waiting",
                    "attempt",
                    "origin",
                    "error_block",
                    "output_block",
                    "progress",
                ]
            },
        ),
        (
            "Times (UTC)",
            {
                "fields": [
                    "scheduled_for",
                    "moved_from",
                    "due_at",
                    "created_at",
                    "enqueued_at",
                    "started_at",
                    "finished_at",
                ]
            },
        ),
        ("Attempts", {"fields": ["retry_of_link", "retried_by", "replay_of_link", "superseded", "exclusive"]}),
        ("Input and config", {"fields": ["input_masked", "config_masked", "workflow_run", "upstream"]}),
        (
            "Runner and worker",
            {
                "classes": ["collapse"],
                "fields": [
                    "external_run_id",
                    "run_handle_masked",
                    "lease_owner",
                    "lease_expires_at",
                    "next_poll_at",
                    "poll_count",
                    "handbacks",
                    "orphaned",
                    "message_id",
                    "reported_at",
                    "priority",
                ],
            },
        ),
    ]
    readonly_fields = [
        "task_link",
        "error_block",
        "output_block",
        "retry_of_link",
        "retried_by",
        "run_handle_masked",
        "replay_of_link",
        "input_masked",
        "config_masked",
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return flatten_fieldsets(self.fieldsets)

    # --- permissions: the actions need "change execution" (superusers have it) ---------------

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("executions.change_execution")

    # --- display ---------------------------------------------------------------------------

    @admin.display(description="task", ordering="task__name")
    def task_link(self, execution: Execution) -> str:
        url = reverse("admin:tasks_app_task_change", args=[execution.task_id])
        return format_html('<a href="{}">{}</a>', url, execution.task)

    @admin.display(description="duration")
    def duration(self, execution: Execution) -> str:
        if execution.started_at and execution.finished_at:
            return f"{(execution.finished_at - execution.started_at).total_seconds():.3f} s"
        return "-"

    @admin.display(description="error")
    def error_block(self, execution: Execution) -> str:
        return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', execution.error or "-")

    @admin.display(description="output")
    def output_block(self, execution: Execution) -> str:
        return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', execution.output or "-")

    @staticmethod
    def _link(execution_id: int | None) -> str:
        """A link to another execution's admin page, or "-"."""
        if execution_id is None:
            return "-"
        url = reverse("admin:executions_execution_change", args=[execution_id])
        return format_html('<a href="{}">execution {}</a>', url, execution_id)

    @admin.display(description="retry of")
    def retry_of_link(self, execution: Execution) -> str:
        return self._link(execution.retry_of_id)

    @admin.display(description="retried by")
    def retried_by(self, execution: Execution) -> str:
        ids = list(Execution.objects.filter(retry_of=execution).values_list("pk", flat=True))
        if not ids:
            return "-"
        return format_html_join(
            ", ",
            '<a href="{}">execution {}</a>',
            ((reverse("admin:executions_execution_change", args=[pk]), pk) for pk in ids),
        )

    @admin.display(description="run handle")
    def run_handle_masked(self, execution: Execution) -> str:
        return json.dumps(mask_config(execution.run_handle or {}), indent=2, sort_keys=True)

    @admin.display(description="replay of")
    def replay_of_link(self, execution: Execution) -> str:
        return self._link(execution.replay_of_id)

    @admin.display(description="input (secrets masked)")
    def input_masked(self, execution: Execution) -> str:
        if execution.input is None:
            return "-"
        return json.dumps(masked_input(execution.input), indent=2, sort_keys=True)

    @admin.display(description="run's own config (secrets masked)")
    def config_masked(self, execution: Execution) -> str:
        if execution.config_override is None:
            return "- (the task's)"
        return json.dumps(masked_run_config(execution.config_override), indent=2, sort_keys=True)

    # --- actions ---------------------------------------------------------------------------

    @admin.action(description="Cancel selected executions", permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        actor = actor_for(request_user(request))

        def cancel(execution: Execution) -> str:
            report = execution_cancel_by_user(
                execution=execution, actor=actor, reason=f"cancelled by {actor} in the admin"
            )
            return f"cancelled (was {report.from_status}; external run: {report.external_run}). {report.detail}".strip()

        run_for_each(self, request, queryset.order_by("pk"), cancel, verb="cancelled")

    @admin.action(description="Retry selected executions (failed or cancelled)", permissions=["operate"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        actor = actor_for(request_user(request))

        def retry(execution: Execution) -> str:
            new = execution_retry_by_user(execution=execution, actor=actor)
            return f"retried as execution {new.pk} (attempt {new.attempt})."

        run_for_each(self, request, queryset.order_by("pk"), retry, verb="retried")

    @admin.action(description="Replay selected executions (finished ones)", permissions=["operate"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        """The API's replay (:func:`executions_replay_by_user`), once per owner of the selection:
        each owner's all or nothing, against the quotas of their tasks' teams, one audit entry each."""
        actor = actor_for(request_user(request))
        by_owner: dict[int, list[int]] = {}
        for pk, owner_id in queryset.order_by("pk").values_list("pk", "owner_id")[: ACTION_MAX + 1]:
            by_owner.setdefault(owner_id, []).append(pk)
        if sum(len(ids) for ids in by_owner.values()) > ACTION_MAX:
            self.message_user(request, f"Select at most {ACTION_MAX} executions to replay.", messages.ERROR)
            return
        for owner_id, ids in sorted(by_owner.items()):
            try:
                # No config here: the action reruns what the runs did (an editor changes a task).
                report = executions_replay_by_user(
                    user=request_user(request),
                    owner_id=owner_id,
                    execution_ids=ids,
                    actor=actor,
                    selection={"executions": ids, "via": "admin"},
                )
            except SERVICE_ERRORS as exc:
                self.message_user(request, f"Owner {owner_id}: nothing replayed: {error_text(exc)}", messages.WARNING)
            else:
                created = ", ".join(map(str, report.created))
                self.message_user(
                    request, f"Owner {owner_id}: {report.count} replayed as execution(s) {created}.", messages.SUCCESS
                )


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ["id", "node_name", "status", "started_at", "last_heartbeat"]
    list_filter = ["status", ("last_heartbeat", admin.DateFieldListFilter)]
    search_fields = ["id", "node_name", "hostname"]


@admin.register(SkippedOccurrence)
class SkippedOccurrenceAdmin(ReadOnlyAdmin):
    """Fire times that did not run, and why (misfire and overlap policies, pauses)."""

    list_display = ["task", "scheduled_for", "reason", "detail", "recorded_at"]
    list_filter = [
        "reason",
        ("task__owner", admin.RelatedOnlyFieldListFilter),
        ("scheduled_for", admin.DateFieldListFilter),
    ]
    search_fields = ["task__name", "=task__id"]
    list_select_related = ["task"]
    date_hierarchy = "scheduled_for"
