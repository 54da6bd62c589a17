# A fraction of a GPU is booked as time-sliced shares all of one GPU (topology same-gpu).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('reservations', '0018_preemption'),
    ]

    operations = [
        migrations.AlterField(
            model_name='reservation',
            name='topology',
            field=models.CharField(choices=[('any', 'Any'), ('nvlink-all', 'Nvlink All'), ('same-gpu', 'Same Gpu')], default='any', max_length=16),
        ),
    ]
