# The ledger's EXCLUDE constraints compare device ids (btree) and time ranges (gist) in one
# index, which needs the btree_gist extension. The embedded Postgres ships it.
from django.contrib.postgres.operations import BtreeGistExtension
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("reservations", "0001_initial")]

    operations = [BtreeGistExtension()]
