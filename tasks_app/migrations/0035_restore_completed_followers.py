"""Issue 44, item 1: bring back the workflow steps an edit completed by mistake.

Before ``tasks_app.models.status_for_cursor``, an edit that re-planned a task following others
(its config, priority, time zone ...) let the materialiser judge it as a one-shot task whose time
had passed: COMPLETED, silently, and its upstreams' ends started nothing for it from then on.
A task that follows others is never completed by its own schedule's end now, so every COMPLETED
task with ``after`` links is one of those: it becomes ACTIVE again, each change in the audit log.
"""

from __future__ import annotations

from django.db import migrations

DETAIL = "restored: a task that follows others is not completed by its own schedule's end (issue 44)"


def restore_followers(apps, schema_editor) -> None:
    Task = apps.get_model("tasks_app", "Task")
    AuditEntry = apps.get_model("tasks_app", "AuditEntry")
    stuck = list(Task.objects.filter(status="COMPLETED", has_after=True).values_list("pk", "owner_id"))
    if not stuck:
        return
    Task.objects.filter(pk__in=[pk for pk, _ in stuck], status="COMPLETED").update(status="ACTIVE")
    AuditEntry.objects.bulk_create(
        [
            AuditEntry(
                actor_name="system",
                source="system",
                action="update",
                object_type="task",
                object_id=str(pk),
                task_id=pk,
                owner_id=owner,
                changes={"status": {"from": "COMPLETED", "to": "ACTIVE"}},
                detail=DETAIL,
            )
            for pk, owner in stuck
        ],
        batch_size=1000,
    )


class Migration(migrations.Migration):
    dependencies = [("tasks_app", "0034_trigger_url_replay_and_idempotency_scope")]

    operations = [migrations.RunPython(restore_followers, migrations.RunPython.noop, elidable=True)]
