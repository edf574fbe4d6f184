from django.contrib import admin

from tasks_app.models import Task


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "id",
        "owner",
        "runner",
        "status",
        "start_at",
        "interval",
        "cron",
        "timezone",
        "misfire_policy",
        "overlap_policy",
        "next_run_at",
        "priority",
    ]
    list_filter = ["status", "runner", "misfire_policy", "overlap_policy"]
    search_fields = ["name", "id", "owner__username"]
    readonly_fields = ["id", "next_run_at", "runs_materialised", "paused_at", "created_at", "updated_at"]
    raw_id_fields = ["owner"]
