"""Priority classes and fair shares: a reservation's class and its weight, an offering's
share and the classes it grants."""

from django.db import migrations, models

import reservations.models.offerings


class Migration(migrations.Migration):
    dependencies = [("reservations", "0016_count_is_the_atoms")]

    operations = [
        migrations.AddField(
            "reservation", "priority_class",
            models.CharField(default="normal", help_text="The priority class it was asked with.",
                             max_length=32)),
        migrations.AddField(
            "reservation", "priority",
            models.SmallIntegerField(default=50, help_text=(
                "Its class's weight when it was asked for: pending requests of a higher one "
                "are placed first."))),
        migrations.AddField(
            "offering", "share",
            models.PositiveIntegerField(default=1, help_text=(
                "The tenant's fair-share weight on the pool, against the owner's and the "
                "other offerings'."))),
        migrations.AddField(
            "offering", "priority_classes",
            models.JSONField(default=reservations.models.offerings.granted_by_default,
                             help_text="The priority classes the tenant may ask for on the "
                                       "pool.")),
    ]
