from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("executions", "0032_execution_workflow_run_index")]

    operations = [
        migrations.AddField(
            model_name="execution",
            name="traceparent",
            field=models.CharField(blank=True, db_default="", default="", max_length=55),
        ),
    ]
