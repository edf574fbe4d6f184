"""Turn each task's old ``notification_target`` (stored, never used) into a channel and a rule.

A URL becomes a webhook channel (with a fresh signing secret), an e-mail address an e-mail
channel, one per (owner, target); each task gets a rule on final failure through it. A value that
is neither cannot be delivered anywhere: it is printed, and left behind with the field.
"""

import secrets

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email
from django.db import migrations


def _kind(target):
    try:
        URLValidator(schemes=["http", "https"])(target)
        return "webhook"
    except ValidationError:
        pass
    try:
        validate_email(target)
        return "email"
    except ValidationError:
        return None


def forward(apps, schema_editor):
    Task = apps.get_model("tasks_app", "Task")
    Channel = apps.get_model("notifications", "Channel")
    Rule = apps.get_model("notifications", "Rule")
    channels = {}
    for task in Task.objects.exclude(notification_target="").order_by("pk").iterator():
        target = task.notification_target.strip()
        kind = _kind(target)
        if kind is None:
            print(f"\n  task {task.pk}: notification_target {target!r} is neither a URL nor an e-mail address; dropped")
            continue
        key = (task.owner_id, target)
        if key not in channels:
            channels[key] = Channel.objects.create(
                owner_id=task.owner_id,
                name=f"{kind}: {target}"[:200],
                kind=kind,
                target=target,
                secret=secrets.token_hex(32) if kind == "webhook" else "",
            )
        Rule.objects.create(owner_id=task.owner_id, task_id=task.pk, channel=channels[key], on_failure=True)


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0001_initial"),
        ("tasks_app", "0005_expose_metrics"),
    ]

    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
