from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("later_django", "0012_job_uncounted")]

    # Nullable: both databases add the column without rewriting later_job.
    operations = [
        migrations.AddField(
            model_name="job", name="timeout_ms", field=models.BigIntegerField(null=True)
        ),
    ]
