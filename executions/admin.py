from django.contrib import admin

from executions.models import Execution, ExecutionEvent, SkippedOccurrence, Worker


class ExecutionEventInline(admin.TabularInline):
    model = ExecutionEvent
    extra = 0
    can_delete = False
    fields = ["at", "from_status", "to_status", "attempt", "actor", "detail"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    """Executions and workers are written only by the platform; the admin shows them."""

    def has_add_permission(self, request) -> bool:  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False


@admin.register(Execution)
class ExecutionAdmin(ReadOnlyAdmin):
    list_display = ["id", "task", "status", "attempt", "scheduled_for", "started_at", "finished_at", "lease_owner"]
    list_filter = ["status"]
    search_fields = ["id", "task__name", "external_run_id"]
    date_hierarchy = "scheduled_for"
    list_select_related = ["task"]
    inlines = [ExecutionEventInline]


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ["id", "status", "started_at", "last_heartbeat"]
    list_filter = ["status"]


@admin.register(SkippedOccurrence)
class SkippedOccurrenceAdmin(admin.ModelAdmin):
    """Fire times that did not run, and why (misfire and overlap policies, pauses)."""

    list_display = ["task", "scheduled_for", "reason", "detail", "recorded_at"]
    list_filter = ["reason"]
    search_fields = ["task__name", "task__id"]
    raw_id_fields = ["task", "execution"]
    date_hierarchy = "scheduled_for"
