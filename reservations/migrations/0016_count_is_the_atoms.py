"""A reservation's (and a series') number of atoms is named `count`, as on the wire."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("reservations", "0015_host_claims_referee")]

    operations = [
        migrations.RenameField("reservation", "gpu_count", "count"),
        migrations.RenameField("reservationseries", "gpu_count", "count"),
    ]
