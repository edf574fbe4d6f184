"""Account keys hashed: DRF's ``authtoken_token`` kept every user's key in clear.

Each existing key is moved into ``accounts_accountkey`` as its SHA-256 (the clients holding it
keep sending it and keep working) and the clear row is deleted. Not reversible: the keys are no
longer known (going back leaves users without account keys; ``tms_create_user --rotate`` makes new ones).
"""

from __future__ import annotations

import hashlib

import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


def hash_existing_keys(apps, schema_editor):
    Token = apps.get_model("authtoken", "Token")
    AccountKey = apps.get_model("accounts", "AccountKey")
    rows = [
        AccountKey(user_id=user_id, digest=hashlib.sha256(key.encode()).hexdigest(), created=created)
        for key, user_id, created in Token.objects.values_list("key", "user_id", "created").iterator()
    ]
    AccountKey.objects.bulk_create(rows, batch_size=1000)
    Token.objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0003_service_accounts_and_token_team"),
        ("authtoken", "0004_alter_tokenproxy_options"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="AccountKey",
            fields=[
                (
                    "user",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="account_key",
                        serialize=False,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                ("digest", models.CharField(editable=False, max_length=64, unique=True)),
                ("created", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
        ),
        migrations.RunPython(hash_existing_keys, migrations.RunPython.noop),
    ]
