# Digest mode: Rule.digest_every and the items a digest collects.

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0002_rules_from_notification_target'),
        ('tasks_app', '0011_task_max_age_max_concurrency'),
    ]

    operations = [
        migrations.AddField(
            model_name='rule',
            name='digest_every',
            field=models.DurationField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name='DigestItem',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=64, unique=True)),
                ('event', models.CharField(max_length=32)),
                ('payload', models.JSONField(default=dict)),
                ('at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('due_at', models.DateTimeField()),
                ('delivery', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='items', to='notifications.delivery')),
                ('rule', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='digest_items', to='notifications.rule')),
                ('task', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tasks_app.task')),
            ],
            options={
                'ordering': ['id'],
                'indexes': [models.Index(condition=models.Q(('delivery__isnull', True)), fields=['due_at'], name='digestitem_open_idx'), models.Index(condition=models.Q(('delivery__isnull', True)), fields=['rule', 'due_at'], name='digestitem_rule_idx')],
            },
        ),
    ]
