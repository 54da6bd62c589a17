from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("fleet", "0010_images_virtualization")]

    operations = [
        migrations.RenameField("device", "mig_parent", "parent"),
        migrations.RenameField("device", "mig_profile", "profile"),
        migrations.AlterField(
            "device", "parent",
            models.ForeignKey(blank=True, null=True, on_delete=models.deletion.CASCADE,
                              related_name="parts", to="fleet.device")),
        migrations.AlterField(
            "device", "profile",
            models.CharField(blank=True, max_length=32,
                             help_text="A MIG instance's profile (1g.10gb), a share's slot "
                                       "(2/4).")),
        migrations.AlterField(
            "device", "device_class",
            models.CharField(choices=[("gpu", "Gpu"), ("mig", "Mig"),
                                      ("gpu-share", "Share")],
                             default="gpu", max_length=16)),
    ]
