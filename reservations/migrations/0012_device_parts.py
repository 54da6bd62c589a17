# A GPU and its parts (MIG instances, time-sliced shares) are booked as separate device rows.
# Each booking also names its physical GPU (`gpu`: the device, or its parent) and whether it
# is the whole GPU; a trigger writes both from the device's row on every insert and update,
# so no caller can get them wrong. The second exclusion constraint then refuses a whole-GPU
# booking that overlaps a booking of any of its parts (`whole <>`), while parts of one GPU
# (different devices) may overlap each other; the first constraint still refuses two
# bookings of one device.
import django.db.models.deletion
from django.db import migrations, models

ATOM_TRIGGER = """
CREATE FUNCTION reservations_booking_atom() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  SELECT coalesce(d.parent_id, d.id), d.parent_id IS NULL INTO NEW.gpu_id, NEW.whole
    FROM fleet_device d WHERE d.id = NEW.device_id;
  RETURN NEW;
END $$;
CREATE TRIGGER reservations_booking_atom BEFORE INSERT OR UPDATE ON reservations_booking
  FOR EACH ROW EXECUTE FUNCTION reservations_booking_atom();
UPDATE reservations_booking SET device_id = device_id;
ALTER TABLE reservations_booking ALTER COLUMN gpu_id SET NOT NULL,
                                 ALTER COLUMN whole SET NOT NULL;
ALTER TABLE reservations_booking
  ADD CONSTRAINT reservations_booking_gpu_no_overlap
  EXCLUDE USING gist (gpu_id WITH =, during WITH &&, whole WITH <>);
"""
DROP_TRIGGER = """
ALTER TABLE reservations_booking DROP CONSTRAINT reservations_booking_gpu_no_overlap;
DROP TRIGGER reservations_booking_atom ON reservations_booking;
DROP FUNCTION reservations_booking_atom();
"""


class Migration(migrations.Migration):
    dependencies = [("fleet", "0011_device_parts"),
                    ("reservations", "0011_reservation_series")]

    operations = [
        migrations.AddField(
            "reservation", "device_class",
            models.CharField(default="gpu", help_text="gpu (whole GPUs), mig or gpu-share.",
                             max_length=16)),
        migrations.AddField(
            "reservation", "profile",
            models.CharField(blank=True, help_text="For mig: the instance profile, such as "
                                                   "1g.10gb.", max_length=32)),
        migrations.AlterField(
            "reservation", "gpu_count",
            models.PositiveSmallIntegerField(help_text="How many atoms of its class.")),
        migrations.AddField(
            "booking", "gpu",
            models.ForeignKey(editable=False, help_text="The physical GPU (the device, or its "
                              "parent).", null=True, on_delete=django.db.models.deletion.PROTECT,
                              related_name="+", to="fleet.device")),
        migrations.AddField(
            "booking", "whole",
            models.BooleanField(editable=False, help_text="A whole GPU, not a part of one.",
                                null=True)),
        migrations.RunSQL(ATOM_TRIGGER, DROP_TRIGGER),
    ]
