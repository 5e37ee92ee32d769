from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("later_django", "0012_job_uncounted")]

    # Nullable: both databases add the columns without rewriting later_job.
    operations = [
        migrations.AddField(
            model_name="job", name="timeout_ms", field=models.BigIntegerField(null=True)
        ),
        migrations.AddField(
            model_name="job", name="cancel_requested_ms", field=models.BigIntegerField(null=True)
        ),
    ]
