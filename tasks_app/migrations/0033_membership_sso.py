from django.db import migrations, models


class Migration(migrations.Migration):
    # Numbered 0031 for the merge (0029 and 0030 are other branches'); depends on what main has.
    dependencies = [("tasks_app", "0032_team_quotas")]

    operations = [
        migrations.AddField(
            model_name="membership",
            name="sso",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Managed by single sign-on: each sign-in sets or removes it from the provider's groups.",
            ),
        ),
    ]
