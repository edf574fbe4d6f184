from django.db import migrations, models
from django.db.models import Q


# Apart from 0014: on PostgreSQL, altering a table in the transaction that updated its rows fails
# while the rows' deferred foreign-key checks are pending.
class Migration(migrations.Migration):
    dependencies = [
        ("executions", "0014_execution_owner_fair_pick"),
    ]

    operations = [
        migrations.AlterField(model_name="execution", name="owner_id", field=models.IntegerField()),
        migrations.AddIndex(
            model_name="execution",
            index=models.Index(
                condition=Q(status="SCHEDULED"),
                fields=["owner_id", "priority", "due_at", "id"],
                name="execution_fair_idx",
            ),
        ),
    ]
