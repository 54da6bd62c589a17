# A planned start: a waiting request booked at its earliest window by the queue.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('reservations', '0019_same_gpu_topology'),
    ]

    operations = [
        migrations.AddField(
            model_name='reservation',
            name='planned',
            field=models.BooleanField(default=False, help_text='Placed by the queue at the earliest window it fits (a planned start), for a request that asked to start as soon as it could: the window only moves earlier.'),
        ),
    ]
