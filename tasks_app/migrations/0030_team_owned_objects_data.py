"""Each existing limit, calendar and artifact goes to its owner's personal team, as tasks did in
0027: each user sees and uses exactly what they did. A global limit (no owner) stays without a
team. A user without a personal team yet (made after 0027 by a path that bypassed the signal)
gets one first, the way 0027 made them."""

from django.conf import settings
from django.db import migrations
from django.utils.text import slugify


def _personal_teams(apps, db):
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    Team = apps.get_model("tasks_app", "Team")
    Membership = apps.get_model("tasks_app", "Membership")
    taken = set(Team.objects.using(db).values_list("slug", flat=True))
    have = set(Team.objects.using(db).filter(personal_of__isnull=False).values_list("personal_of_id", flat=True))
    for user in User.objects.using(db).exclude(pk__in=have).order_by("pk").iterator():
        slug = slugify(user.username)[:50].strip("-") or f"user-{user.pk}"
        if slug in taken:
            slug = f"{slug[:40]}-user-{user.pk}"
        taken.add(slug)
        team = Team.objects.using(db).create(name=user.username[:100], slug=slug, personal_of_id=user.pk)
        Membership.objects.using(db).create(team_id=team.pk, user_id=user.pk, role="admin")


def to_personal_teams(apps, schema_editor):
    db = schema_editor.connection.alias
    _personal_teams(apps, db)
    teams = apps.get_model("tasks_app", "Team")._meta.db_table
    # One set-based statement per table, whatever the number of rows (a correlated subquery).
    with schema_editor.connection.cursor() as cursor:
        for model in ("Limit", "Calendar", "Artifact"):
            table = apps.get_model("tasks_app", model)._meta.db_table
            cursor.execute(
                f"UPDATE {table} SET team_id = (SELECT tm.id FROM {teams} tm WHERE tm.personal_of_id = {table}.owner_id)"
                " WHERE team_id IS NULL AND owner_id IS NOT NULL"
            )


class Migration(migrations.Migration):
    dependencies = [("tasks_app", "0029_team_owned_objects")]

    operations = [migrations.RunPython(to_personal_teams, migrations.RunPython.noop)]
