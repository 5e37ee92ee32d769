from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("later_django", "0011_dashboard")]

    # Nullable: both databases add the column without rewriting later_job.
    operations = [
        migrations.AddField(
            model_name="job", name="uncounted", field=models.IntegerField(null=True)
        ),
    ]
