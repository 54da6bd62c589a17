# Nothing is booked twice: no two bookings of one device may overlap in time. Postgres
# enforces this with an exclusion constraint over (device_id =, during &&), which needs
# btree_gist (migration 0002) to compare the device id inside a GiST index. The placer only
# proposes; this constraint is the final arbiter, and a violation (SQLSTATE 23P01) is mapped
# to `capacity_conflict` by name in reservations/constraints.py.
from django.contrib.postgres.operations import BtreeGistExtension
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("reservations", "0003_ledger")]

    operations = [
        BtreeGistExtension(),
        migrations.RunSQL(
            sql="""
                ALTER TABLE reservations_booking
                ADD CONSTRAINT reservations_booking_device_no_overlap
                EXCLUDE USING gist (device_id WITH =, during WITH &&);
            """,
            reverse_sql="""
                ALTER TABLE reservations_booking
                DROP CONSTRAINT reservations_booking_device_no_overlap;
            """,
        ),
    ]
