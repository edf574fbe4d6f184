"""Channel signing secrets and targets encrypted at rest (``$enc:<Fernet token>``).

The columns become ``text`` (a token is longer than its value); existing rows are encrypted with
the first key of ``TMS_SECRET_KEYS`` in plain SQL (the historical model's field would try to
decrypt them). Reversible: going back decrypts them.
"""

from django.db import migrations

import notifications.fields


def _rewrite(apps, schema_editor, convert):
    from tasks_app.secrets import TEXT_PREFIX

    table = apps.get_model("notifications", "Channel")._meta.db_table
    quote = schema_editor.quote_name
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"SELECT id, target, secret FROM {quote(table)}")
        for pk, target, secret in cursor.fetchall():
            new = [convert(value, TEXT_PREFIX) for value in (target, secret)]
            if new != [target, secret]:
                cursor.execute(f"UPDATE {quote(table)} SET target = %s, secret = %s WHERE id = %s", [*new, pk])


def seal(apps, schema_editor):
    from tasks_app.secrets import text_seal

    _rewrite(apps, schema_editor, lambda value, prefix: value if value.startswith(prefix) else text_seal(value))


def unseal(apps, schema_editor):
    from tasks_app.secrets import text_open

    _rewrite(apps, schema_editor, lambda value, prefix: text_open(value) if value.startswith(prefix) else value)


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0003_rule_digest'),
    ]

    operations = [
        migrations.AlterField(
            model_name='channel',
            name='secret',
            field=notifications.fields.SealedTextField(blank=True, max_length=64),
        ),
        migrations.AlterField(
            model_name='channel',
            name='target',
            field=notifications.fields.SealedTextField(max_length=500),
        ),
        migrations.RunPython(seal, unseal, elidable=False),
    ]
