"""Stored cron expressions keep their meaning under the rules of issue 26.

Two reading rules changed (``tasks_app.schedules``):

* A day field that starts with ``*`` (``*/2``, ``*/7``, ``*,15``) is now unrestricted, as in Vixie
  cron and cronie: with the other day field restricted, a day must match both. Before, only a
  field that was exactly ``*`` (or ``?``) was unrestricted, and such a pair matched on either.
  A task written under the old rule is rewritten to say the same under the new one: its leading
  ``*`` becomes the explicit range it stood for (``1-31`` for the day of month, ``0-6`` for the
  day of week), which selects the same values and is restricted under both rules.
  ``0 0 */2 * MON`` (odd days or Mondays) becomes ``0 0 1-31/2 * MON``.
* Digits and blanks are ASCII only. Fields were split on any Unicode blank, and ``int`` read the
  decimal digits of any script (U+0665, U+FF10), so such a stored expression is rewritten with the
  ASCII digit and a space, as it was read.

Each rewrite is recorded in the task's audit trail (source ``system``). Self-contained on
purpose: it reads the stored text with its own few lines, not with today's parser.
"""

from __future__ import annotations

import unicodedata

from django.db import migrations

#: What a day field's leading "*" selected under the old rule, written as a range.
_STAR = {3: "1-31", 5: "0-6"}  # index among the six fields, seconds first
_SHORTCUT = "@"


def _ascii(expression: str) -> str:
    """The expression as the old parser read it, in ASCII: blanks as spaces, digits as 0-9."""
    out = []
    for char in expression:
        if char.isascii():
            out.append(char)
        elif char.isspace():
            out.append(" ")
        elif unicodedata.decimal(char, None) is not None:
            out.append(str(unicodedata.decimal(char)))
        else:
            out.append(char)  # never read as anything: left for the parser to refuse
    return " ".join("".join(out).split())


def _old_meaning_kept(expression: str) -> str:
    """``expression`` rewritten to mean under the new day rule what it meant under the old one."""
    if expression.startswith(_SHORTCUT):
        return expression  # @weekly and the rest have a day field that is exactly "*"
    parts = expression.split()
    if len(parts) not in (5, 6):
        return expression
    offset = 6 - len(parts)
    day, weekday = parts[3 - offset], parts[5 - offset]
    both_restricted_before = day not in ("*", "?") and weekday not in ("*", "?")
    if not both_restricted_before:
        return expression
    for index in (3, 5):
        part = parts[index - offset]
        if part.startswith("*"):
            parts[index - offset] = _STAR[index] + part[1:]
    return " ".join(parts)


def forwards(apps, schema_editor):
    Task = apps.get_model("tasks_app", "Task")
    AuditEntry = apps.get_model("tasks_app", "AuditEntry")
    for task in Task.objects.exclude(cron="").only("id", "cron", "owner_id").iterator():
        rewritten = _old_meaning_kept(_ascii(task.cron))
        if rewritten == task.cron:
            continue
        Task.objects.filter(pk=task.pk).update(cron=rewritten)
        AuditEntry.objects.create(
            actor_name="system",
            source="system",
            action="update",
            object_type="task",
            object_id=str(task.pk),
            task_id=task.pk,
            owner_id=task.owner_id,
            changes={"cron": {"from": task.cron, "to": rewritten}},
            detail="Cron rewritten to keep its meaning: day fields starting with * now follow cronie; ASCII only.",
        )


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0014_task_created_idx"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop, elidable=True),
    ]
