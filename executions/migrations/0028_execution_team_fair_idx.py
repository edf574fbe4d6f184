"""The monitor's fair pick shares the workers between teams (executions.fairness): its index
leads with the team instead of the owner. Nothing else read ``execution_fair_idx`` (an index of
the SCHEDULED rows only, so both are small and quick to build)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("executions", "0027_steps_published_sequence")]

    operations = [
        migrations.AddIndex(
            model_name="execution",
            index=models.Index(
                condition=models.Q(status="SCHEDULED"),
                fields=["team_id", "priority", "due_at", "id"],
                name="execution_team_fair_idx",
            ),
        ),
        migrations.RemoveIndex(model_name="execution", name="execution_fair_idx"),
    ]
