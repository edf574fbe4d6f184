"""``Team.managed``: only a team an administrator made receives single sign-on's group grants.

Existing shared teams are marked managed when the audit log says staff created them (the
``team.create`` entry's actor is staff); any other team stays unmanaged until an administrator
vouches for it with ``manage.py tms_team_managed <slug>`` (sign-ins log the grant they skip).
"""

from __future__ import annotations

from django.conf import settings
from django.db import migrations, models


def mark_staff_made_teams(apps, schema_editor):
    Team = apps.get_model("tasks_app", "Team")
    AuditEntry = apps.get_model("tasks_app", "AuditEntry")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    staff = User.objects.filter(is_staff=True).values("pk")
    made_by_staff = AuditEntry.objects.filter(action="team.create", object_type="team", actor_id__in=staff).values_list(
        "object_id", flat=True
    )
    ids = [int(pk) for pk in made_by_staff if str(pk).isdigit()]
    Team.objects.filter(pk__in=ids, personal_of__isnull=True).update(managed=True)


class Migration(migrations.Migration):
    dependencies = [
        ("tasks_app", "0035_restore_completed_followers"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="team", name="managed", field=models.BooleanField(db_default=False, default=False)
        ),
        migrations.RunPython(mark_staff_made_teams, migrations.RunPython.noop),
    ]
