"""Borrowing and preemption: a reservation placed over quota, and the notice of its
preemption."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("reservations", "0017_priorities_and_shares")]

    operations = [
        migrations.AddField(
            "reservation", "borrowed",
            models.BooleanField(default=False, help_text=(
                "Placed over its tenant's quota (a preemptible request, while GPUs were "
                "free): it consumed no quota, and any request within quota may preempt it."))),
        migrations.AddField(
            "reservation", "preempt_at",
            models.DateTimeField(blank=True, null=True, help_text=(
                "Preempted: released at this time unless the request it makes room for no "
                "longer needs it."))),
        migrations.AddField(
            "reservation", "preempted_for",
            models.CharField(blank=True, max_length=32,
                             help_text="The pending reservation it makes room for.")),
    ]
