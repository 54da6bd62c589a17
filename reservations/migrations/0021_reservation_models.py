# The GPU models a request accepts: a waiting one may be placed in another pool of its site.

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('reservations', '0020_planned_starts'),
    ]

    operations = [
        migrations.AddField(
            model_name='reservation',
            name='gpu_models',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=64), blank=True, default=list, help_text="The GPU models the request accepts (upper case; empty: its pool's only): while it waits, a pool of its site with one of them may place it.", size=None),
        ),
    ]
