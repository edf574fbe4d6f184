"""Quotas count per team: each user's ``OwnerQuota`` row becomes their personal team's
``TeamQuota`` (the same limits and fair-share weight), and the rolling-window ledger
(``QuotaUse``) moves from users to their personal teams, so an existing install's limits, and
what has been counted against them this hour, are unchanged. A user with a quota row but no
personal team (made outside the user model's signal) gets one here, as migration 0027 gave one
to every user then.

Going back moves personal teams' quotas to their users; a shared team's quota has no user and
is lost."""

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import migrations, models
from django.utils.text import slugify

FIELDS = ("max_tasks", "max_executions_per_hour", "max_artifact_bytes", "fair_weight")


def _personal_teams(apps, db, user_ids):
    """{user id: personal team id} for ``user_ids``, making the teams that are missing."""
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    Team = apps.get_model("tasks_app", "Team")
    Membership = apps.get_model("tasks_app", "Membership")
    found = dict(
        Team.objects.using(db).filter(personal_of_id__in=user_ids).values_list("personal_of_id", "id")
    )
    missing = sorted(set(user_ids) - set(found))
    if missing:
        taken = set(Team.objects.using(db).values_list("slug", flat=True))
        for user in User.objects.using(db).filter(pk__in=missing).order_by("pk"):
            # The same slug as tasks_app.teams.services.personal_team_of gives a new user.
            slug = slugify(user.username)[:50].strip("-") or f"user-{user.pk}"
            if slug in taken:
                slug = f"{slug[:40]}-user-{user.pk}"
            taken.add(slug)
            team = Team.objects.using(db).create(name=user.username[:100], slug=slug, personal_of_id=user.pk)
            Membership.objects.using(db).create(team_id=team.pk, user_id=user.pk, role="admin")
            found[user.pk] = team.pk
    return found


def to_teams(apps, schema_editor):
    OwnerQuota = apps.get_model("tasks_app", "OwnerQuota")
    TeamQuota = apps.get_model("tasks_app", "TeamQuota")
    QuotaUse = apps.get_model("tasks_app", "QuotaUse")
    db = schema_editor.connection.alias
    quotas = list(OwnerQuota.objects.using(db).all())
    users = {quota.user_id for quota in quotas}
    users |= set(QuotaUse.objects.using(db).values_list("owner_id", flat=True).distinct())
    teams = _personal_teams(apps, db, users)
    TeamQuota.objects.using(db).bulk_create(
        [TeamQuota(team_id=teams[q.user_id], **{name: getattr(q, name) for name in FIELDS}) for q in quotas],
        batch_size=1000,
    )
    # The ledger (at most an hour of rows): one set-based statement.
    uses, team_table = QuotaUse._meta.db_table, apps.get_model("tasks_app", "Team")._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {uses} SET team_id = (SELECT tm.id FROM {team_table} tm WHERE tm.personal_of_id = {uses}.owner_id)"
        )
    _constraints_now(schema_editor)


def to_users(apps, schema_editor):
    OwnerQuota = apps.get_model("tasks_app", "OwnerQuota")
    TeamQuota = apps.get_model("tasks_app", "TeamQuota")
    QuotaUse = apps.get_model("tasks_app", "QuotaUse")
    Team = apps.get_model("tasks_app", "Team")
    db = schema_editor.connection.alias
    personal = dict(Team.objects.using(db).filter(personal_of__isnull=False).values_list("id", "personal_of_id"))
    OwnerQuota.objects.using(db).bulk_create(
        [
            OwnerQuota(user_id=personal[q.team_id], **{name: getattr(q, name) for name in FIELDS})
            for q in TeamQuota.objects.using(db).filter(team_id__in=list(personal))
        ],
        batch_size=1000,
    )
    uses, team_table = QuotaUse._meta.db_table, Team._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {uses} SET owner_id = (SELECT tm.personal_of_id FROM {team_table} tm WHERE tm.id = {uses}.team_id)"
        )
        cursor.execute(f"DELETE FROM {uses} WHERE owner_id IS NULL")  # noqa: S608 - a shared team's uses
    _constraints_now(schema_editor)


def _constraints_now(schema_editor):
    # The rows' foreign-key checks are deferred to the commit on PostgreSQL, and a table with
    # pending checks cannot be altered in the same transaction (the operations below do): check now.
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):
    dependencies = [("tasks_app", "0031_team_owned_objects_not_null")]

    operations = [
        migrations.CreateModel(
            name="TeamQuota",
            fields=[
                (
                    "team",
                    models.OneToOneField(
                        on_delete=models.deletion.CASCADE,
                        primary_key=True,
                        related_name="quota",
                        serialize=False,
                        to="tasks_app.team",
                    ),
                ),
                (
                    "max_tasks",
                    models.PositiveIntegerField(
                        blank=True, help_text="Tasks (not deleted). Empty: TMS_QUOTA_MAX_TASKS; 0: no limit.", null=True
                    ),
                ),
                (
                    "max_executions_per_hour",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="Executions created on request (run now, backfill, retry, replay) per rolling hour. "
                        "Empty: TMS_QUOTA_EXECUTIONS_PER_HOUR; 0: no limit.",
                        null=True,
                    ),
                ),
                (
                    "max_artifact_bytes",
                    models.PositiveBigIntegerField(
                        blank=True,
                        help_text="Bytes of uploaded artifacts. Empty: TMS_QUOTA_ARTIFACT_BYTES; 0: no limit.",
                        null=True,
                    ),
                ),
                (
                    "fair_weight",
                    models.PositiveSmallIntegerField(
                        blank=True,
                        help_text="Share of the workers when more is due than they can start, relative to other "
                        "teams (weighted round-robin: weight 3 starts three runs for one of a weight-1 team). "
                        "Empty: TMS_FAIR_WEIGHT (1). At least 1.",
                        null=True,
                        validators=[MinValueValidator(1), MaxValueValidator(1000)],
                    ),
                ),
            ],
            options={"verbose_name": "team quota"},
        ),
        migrations.AddField(
            model_name="quotause",
            name="team",
            field=models.ForeignKey(
                db_index=False, null=True, on_delete=models.deletion.CASCADE, related_name="+", to="tasks_app.team"
            ),
        ),
        migrations.AlterField(
            model_name="quotause",
            name="owner",
            field=models.ForeignKey(
                db_index=False,
                null=True,
                on_delete=models.deletion.CASCADE,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RunPython(to_teams, to_users),
        migrations.RemoveIndex(model_name="quotause", name="quota_use_owner_kind_at_idx"),
        migrations.RemoveField(model_name="quotause", name="owner"),
        migrations.AlterField(
            model_name="quotause",
            name="team",
            field=models.ForeignKey(
                db_index=False, on_delete=models.deletion.CASCADE, related_name="+", to="tasks_app.team"
            ),
        ),
        migrations.AddIndex(
            model_name="quotause",
            index=models.Index(fields=["team", "kind", "at"], name="quota_use_team_kind_at_idx"),
        ),
        migrations.DeleteModel(name="OwnerQuota"),
    ]
