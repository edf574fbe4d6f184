from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("executions", "0039_taskrollup_shard")]

    operations = [
        migrations.AddField(
            model_name="execution",
            name="tracestate",
            field=models.CharField(blank=True, db_default="", default="", max_length=512),
        ),
    ]
