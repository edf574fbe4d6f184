"""Every existing user gets a personal team (as its admin) and their tasks move into it, so an
existing install sees and does exactly what it did when tasks belonged to users."""

from django.conf import settings
from django.db import migrations
from django.utils.text import slugify


def personal_teams(apps, schema_editor):
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    Team = apps.get_model("tasks_app", "Team")
    Membership = apps.get_model("tasks_app", "Membership")
    Task = apps.get_model("tasks_app", "Task")
    db = schema_editor.connection.alias
    taken = set(Team.objects.using(db).values_list("slug", flat=True))
    have = set(Team.objects.using(db).filter(personal_of__isnull=False).values_list("personal_of_id", flat=True))
    for user in User.objects.using(db).exclude(pk__in=have).order_by("pk").iterator():
        # The same slug as tasks_app.teams.services.personal_team_of gives a new user.
        slug = slugify(user.username)[:50].strip("-") or f"user-{user.pk}"
        if slug in taken:
            slug = f"{slug[:40]}-user-{user.pk}"
        taken.add(slug)
        team = Team.objects.using(db).create(name=user.username[:100], slug=slug, personal_of_id=user.pk)
        Membership.objects.using(db).create(team_id=team.pk, user_id=user.pk, role="admin")
    # One set-based statement, whatever the number of tasks.
    table, teams = Task._meta.db_table, Team._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET team_id = (SELECT tm.id FROM {teams} tm WHERE tm.personal_of_id = {table}.owner_id)"
            " WHERE team_id IS NULL"
        )


class Migration(migrations.Migration):
    dependencies = [("tasks_app", "0026_teams")]

    operations = [migrations.RunPython(personal_teams, migrations.RunPython.noop)]
