from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("executions", "0025_execution_team")]

    operations = [
        migrations.AlterField(model_name="execution", name="team_id", field=models.IntegerField()),
    ]
