from django.db import migrations, models


def create_the_row(apps, schema_editor):
    apps.get_model("executions", "RollupEpoch").objects.create(pk=1, epoch=0)


class Migration(migrations.Migration):
    dependencies = [
        ("executions", "0019_worker_node_name"),
    ]

    operations = [
        migrations.CreateModel(
            name="RollupEpoch",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("epoch", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(create_the_row, migrations.RunPython.noop),
    ]
