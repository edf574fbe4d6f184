"""Secret config values encrypted at rest (Task.secret_fields) and the audit log (AuditEntry).

The data step encrypts the secret values of existing tasks' configs with the first key of
TMS_SECRET_KEYS (tasks_app.secrets decides which values are secret); going back decrypts them.
"""

import django.core.serializers.json
import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


def encrypt_existing(apps, schema_editor):
    from tasks_app.secrets import config_seal

    Task = apps.get_model("tasks_app", "Task")
    for task in Task.objects.using(schema_editor.connection.alias).only("id", "runner", "config").iterator(2000):
        sealed = config_seal(task.runner, task.config, [])
        if sealed != task.config:
            Task.objects.using(schema_editor.connection.alias).filter(pk=task.pk).update(config=sealed)


def mask_stored_responses(apps, schema_editor):
    """Stored create responses (Idempotency-Key replays, kept 24 hours) showed configs in clear:
    mask them as the API now shows them."""
    from tasks_app.secrets import config_masked

    def masked(body):
        if isinstance(body, list):
            return [masked(item) for item in body]
        if isinstance(body, dict) and isinstance(body.get("config"), dict) and "runner" in body:
            return {**body, "config": config_masked(body["runner"], body["config"], [])}
        return body

    ApiIdempotencyKey = apps.get_model("tasks_app", "ApiIdempotencyKey")
    keys = ApiIdempotencyKey.objects.using(schema_editor.connection.alias)
    for row in keys.only("id", "response_body").iterator(2000):
        body = masked(row.response_body)
        if body != row.response_body:
            keys.filter(pk=row.pk).update(response_body=body)


def decrypt_existing(apps, schema_editor):
    from tasks_app.secrets import config_open

    Task = apps.get_model("tasks_app", "Task")
    for task in Task.objects.using(schema_editor.connection.alias).only("id", "config").iterator(2000):
        opened = config_open(task.config)
        if opened != task.config:
            Task.objects.using(schema_editor.connection.alias).filter(pk=task.pk).update(config=opened)


class Migration(migrations.Migration):

    dependencies = [
        ('tasks_app', '0006_artifact_status_upload'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='secret_fields',
            field=models.JSONField(blank=True, default=list, help_text='Paths into config whose values are secret, e.g. ["payload.token"]: encrypted, masked on read.'),
        ),
        migrations.CreateModel(
            name='AuditEntry',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('actor_name', models.CharField(max_length=150)),
                ('source', models.CharField(max_length=100)),
                ('remote_addr', models.GenericIPAddressField(blank=True, null=True)),
                ('action', models.CharField(max_length=40)),
                ('object_type', models.CharField(max_length=40)),
                ('object_id', models.CharField(max_length=64)),
                ('task_id', models.UUIDField(blank=True, null=True)),
                ('changes', models.JSONField(blank=True, default=dict, encoder=django.core.serializers.json.DjangoJSONEncoder)),
                ('detail', models.CharField(blank=True, max_length=500)),
                ('actor', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('owner', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name_plural': 'audit entries',
                'ordering': ['-id'],
                'indexes': [models.Index(fields=['owner', '-id'], name='audit_owner_idx'), models.Index(condition=models.Q(('task_id__isnull', False)), fields=['task_id', '-id'], name='audit_task_idx'), models.Index(fields=['actor', '-id'], name='audit_actor_idx'), models.Index(fields=['at'], name='audit_at_idx')],
            },
        ),
        migrations.RunPython(encrypt_existing, decrypt_existing, elidable=False),
        migrations.RunPython(mask_stored_responses, migrations.RunPython.noop, elidable=False),
    ]
